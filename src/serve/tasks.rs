//! The server's other models: a cross-encoder (`--rerank-model`: TEI's `POST /rerank`, the
//! Cohere/Jina `POST /v1/rerank`) and a SPLADE model (`--sparse-model`: TEI's
//! `POST /embed_sparse`), a sequence classifier (`--classifier-model`: TEI's `POST /predict`)
//! and a token classifier (`--ner-model`: ragline's `POST /ner`). Each has its own bounded
//! queue and model thread, and batches the requests that wait together, as embeddings are
//! batched ([`super::batcher`]).

use super::batcher::ModelFailed;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::batcher::{panic_message, Admission, Batcher, Queued};
use super::{observed, parse_request, ApiError, App, LongInputs};
use crate::embed::classify::{SequenceClassifier, TextIds};
use crate::embed::cross_encoder::{CrossEncoder, PairIds, PairScore};
use crate::embed::ner::aggregate::Entity;
use crate::embed::ner::{NerOptions, TokenClassifier};
use crate::embed::splade::{SparseModel, SparseVector};

/// The models beside the embedding model, each optional.
#[derive(Default)]
pub struct TaskModels {
    pub reranker: Option<CrossEncoder>,
    pub sparse: Option<SparseModel>,
    pub classifier: Option<SequenceClassifier>,
    pub ner: Option<TokenClassifier>,
}

/// The task models a server runs, shared with their threads.
#[derive(Default)]
pub struct SharedModels {
    pub reranker: Option<Arc<CrossEncoder>>,
    pub sparse: Option<Arc<SparseModel>>,
    pub classifier: Option<Arc<SequenceClassifier>>,
    pub ner: Option<Arc<TokenClassifier>>,
}

impl From<TaskModels> for SharedModels {
    fn from(m: TaskModels) -> Self {
        SharedModels {
            reranker: m.reranker.map(Arc::new),
            sparse: m.sparse.map(Arc::new),
            classifier: m.classifier.map(Arc::new),
            ner: m.ner.map(Arc::new),
        }
    }
}

/// One request's inputs (a reranker's pairs, a sparse model's token ids), waiting for its
/// model; answered with one output per input.
pub struct TaskJob<I, O> {
    items: Vec<I>,
    enqueued: Instant,
    reply: tokio::sync::oneshot::Sender<Result<Vec<O>, ModelFailed>>,
}

/// One request's pairs, waiting for the reranker.
pub type RerankJob = TaskJob<PairIds, PairScore>;
/// One request's inputs (content ids), waiting for the sparse model.
pub type SparseJob = TaskJob<Vec<u32>, SparseVector>;
/// One request's texts, waiting for the classifier: their logits.
pub type ClassifyJob = TaskJob<TextIds, Vec<f32>>;
/// One request's texts in windows, waiting for the token classifier: their entities.
pub type NerJob = TaskJob<NerText, Vec<Entity>>;

/// A text for the token classifier: its windows and how its entities are made.
pub struct NerText {
    pub(super) text: String,
    pub(super) windows: Vec<tokenizers::Encoding>,
    pub(super) options: Arc<NerOptions>,
}

impl TaskInput for NerText {
    fn tokens(&self) -> usize {
        self.windows.iter().map(|w| w.len()).sum()
    }
}

impl TaskInput for TextIds {
    fn tokens(&self) -> usize {
        self.ids.len()
    }
}

/// An input of a task model, and the tokens it costs the model.
pub trait TaskInput: Send {
    fn tokens(&self) -> usize;
}

impl TaskInput for PairIds {
    fn tokens(&self) -> usize {
        self.ids.len()
    }
}

/// Content ids: the model adds [CLS] and [SEP].
impl TaskInput for Vec<u32> {
    fn tokens(&self) -> usize {
        self.len() + 2
    }
}

impl<I: TaskInput, O: Send> Queued for TaskJob<I, O> {
    fn tokens(&self) -> usize {
        self.items.iter().map(TaskInput::tokens).sum()
    }
    fn enqueued(&self) -> Instant {
        self.enqueued
    }
    fn fail(self, why: String) {
        let _ = self.reply.send(Err(ModelFailed(why)));
    }
}

/// The queues of the task models a server runs.
#[derive(Default)]
pub struct TaskQueues {
    pub rerank: Option<(Arc<Batcher<RerankJob>>, String)>,
    pub sparse: Option<(Arc<Batcher<SparseJob>>, usize)>,
    pub classify: Option<Arc<Batcher<ClassifyJob>>>,
    pub ner: Option<Arc<Batcher<NerJob>>>,
}

impl TaskQueues {
    /// A queue of `max_tokens` for each model `models` holds.
    pub fn for_models(models: &SharedModels, max_tokens: usize) -> Self {
        TaskQueues {
            rerank: models
                .reranker
                .as_ref()
                .map(|m| (Batcher::new(max_tokens), m.name().to_string())),
            sparse: models
                .sparse
                .as_ref()
                .map(|m| (Batcher::new(max_tokens), m.dimension())),
            classify: models.classifier.as_ref().map(|_| Batcher::new(max_tokens)),
            ner: models.ner.as_ref().map(|_| Batcher::new(max_tokens)),
        }
    }

    pub fn close(&self) {
        if let Some((b, _)) = &self.rerank {
            b.close();
        }
        if let Some((b, _)) = &self.sparse {
            b.close();
        }
        if let Some(b) = &self.classify {
            b.close();
        }
        if let Some(b) = &self.ner {
            b.close();
        }
    }

    /// Start a thread per task model, each serving its queue until it closes.
    pub fn spawn<'scope>(
        &'scope self,
        scope: &'scope std::thread::Scope<'scope, '_>,
        models: &'scope SharedModels,
        batch_tokens: usize,
        max_wait: Duration,
    ) -> Result<(), super::ServeError> {
        let start = |name: &str, f: Box<dyn FnOnce() + Send + 'scope>| {
            std::thread::Builder::new()
                .name(format!("model-{name}"))
                .spawn_scoped(scope, f)
                .map(|_| ())
                .map_err(|e| super::ServeError::Start {
                    what: format!("the {name}'s thread"),
                    reason: e.to_string(),
                })
        };
        if let (Some(model), Some((queue, _))) = (&models.reranker, &self.rerank) {
            start(
                "reranker",
                Box::new(move || run_reranker(queue, model, batch_tokens, max_wait)),
            )?;
        }
        if let (Some(model), Some((queue, _))) = (&models.sparse, &self.sparse) {
            start(
                "sparse",
                Box::new(move || run_sparse(queue, model, batch_tokens, max_wait)),
            )?;
        }
        if let (Some(model), Some(queue)) = (&models.classifier, &self.classify) {
            start(
                "classifier",
                Box::new(move || {
                    queue.run_windows("classifier", batch_tokens * 4, max_wait, |jobs| {
                        answer_window(jobs, |texts| model.logits(texts, batch_tokens))
                    })
                }),
            )?;
        }
        if let (Some(model), Some(queue)) = (&models.ner, &self.ner) {
            start(
                "ner",
                Box::new(move || {
                    queue.run_windows("ner", batch_tokens * 4, max_wait, |jobs| {
                        answer_window(jobs, |texts| {
                            let items: Vec<_> = texts
                                .iter()
                                .map(|t| (t.text.as_str(), t.windows.as_slice(), &*t.options))
                                .collect();
                            model.entities_of(&items, batch_tokens)
                        })
                    })
                }),
            )?;
        }
        Ok(())
    }
}

/// The reranker's model thread: each window's pairs scored together (length-sorted batches
/// of at most `batch_tokens`), each request answered with its scores.
pub fn run_reranker(
    batcher: &Batcher<RerankJob>,
    model: &CrossEncoder,
    batch_tokens: usize,
    max_wait: Duration,
) {
    batcher.run_windows("reranker", batch_tokens * 4, max_wait, |jobs| {
        answer_window(jobs, |pairs| {
            let pairs: Vec<PairIds> = pairs.iter().map(|&p| p.clone()).collect();
            model.score_pairs(&pairs, batch_tokens)
        })
    });
}

/// The sparse model's thread: each window's inputs embedded together.
pub fn run_sparse(
    batcher: &Batcher<SparseJob>,
    model: &SparseModel,
    batch_tokens: usize,
    max_wait: Duration,
) {
    batcher.run_windows("sparse", batch_tokens * 4, max_wait, |jobs| {
        answer_window(jobs, |inputs| {
            let lengths: Vec<usize> = inputs.iter().map(|i| i.tokens()).collect();
            let mut out = vec![SparseVector::default(); inputs.len()];
            for batch in crate::embed::batch::plan_unpadded(&lengths, batch_tokens) {
                let seqs: Vec<&[u32]> = batch.iter().map(|&i| inputs[i].as_slice()).collect();
                for (&i, v) in batch.iter().zip(model.embed_ids(&seqs)?) {
                    out[i] = v;
                }
            }
            Ok::<_, crate::embed::EmbedError>(out)
        })
    });
}

/// A window's jobs through `model` together (their inputs in order), each job answered with
/// its share of the outputs, or every job with the error (a panic's message included).
fn answer_window<I, O: Clone, E: std::fmt::Display>(
    jobs: Vec<TaskJob<I, O>>,
    model: impl FnOnce(&[&I]) -> Result<Vec<O>, E>,
) {
    let inputs: Vec<&I> = jobs.iter().flat_map(|j| &j.items).collect();
    let count = inputs.len();
    let outputs = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model(&inputs))) {
        Ok(Ok(v)) if v.len() == count => Ok(v),
        Ok(Ok(v)) => Err(ModelFailed(format!(
            "the model answered {} of {count} inputs",
            v.len()
        ))),
        Ok(Err(e)) => Err(ModelFailed(e.to_string())),
        Err(panic) => Err(ModelFailed(panic_message(&*panic))),
    };
    let mut at = 0;
    for job in jobs {
        let n = job.items.len();
        let answer = outputs
            .as_ref()
            .map(|v| v[at..at + n].to_vec())
            .map_err(Clone::clone);
        at += n;
        let _ = job.reply.send(answer);
    }
}

/// A task model's request: refused while the server stops or while the queue is full, its
/// inputs made by `prepare` on the tokenizing pool (a panic there answers as the
/// tokenizer's), queued, and its outputs awaited, with the tokens they took.
pub(super) async fn through_queue<I, O>(
    app: &Arc<App>,
    batcher: &Batcher<TaskJob<I, O>>,
    prepare: impl FnOnce() -> Result<Vec<I>, ApiError> + Send + 'static,
) -> Result<(Vec<O>, usize), ApiError>
where
    I: TaskInput + 'static,
    O: Send + 'static,
{
    if app.stopping.load(Ordering::Relaxed) {
        return Err(refused(app, Admission::Closed).expect("refused"));
    }
    if batcher.is_full() {
        let tokens = batcher.queued_tokens();
        return Err(refused(app, Admission::Full { tokens }).expect("refused"));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    app.tokenize_pool.spawn(move || {
        let items = std::panic::catch_unwind(std::panic::AssertUnwindSafe(prepare));
        let _ = tx.send(items.unwrap_or_else(|panic| Err(ApiError::tokenizer_panic(&*panic))));
    });
    let items = rx
        .await
        .map_err(|_| ApiError::bad("tokenization failed"))??;
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = TaskJob {
        items,
        enqueued: Instant::now(),
        reply,
    };
    let tokens = job.tokens();
    if let Some(e) = refused(app, batcher.submit(job).0) {
        return Err(e);
    }
    let outputs = answer
        .await
        .map_err(|_| model_error(app, None))?
        .map_err(|e| model_error(app, Some(e)))?;
    Ok((outputs, tokens))
}

/// The error a refused submission answers with (None: queued).
pub(super) fn refused(app: &App, admission: Admission) -> Option<ApiError> {
    let (kind, message, retry_after) = match admission {
        Admission::Queued => return None,
        Admission::Full { tokens } => (
            "overloaded",
            format!("the queue holds {tokens} tokens, its limit: retry after a moment"),
            Some(1),
        ),
        Admission::Closed => (
            "shutting_down",
            "the server is stopping".to_string(),
            Some(1),
        ),
        Admission::NoModel => (
            "model",
            "no model thread is running (they failed; see the server's log): restart the server"
                .to_string(),
            None,
        ),
    };
    app.metrics.error(kind);
    Some(ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind,
        message,
        retry_after,
    })
}

/// A reply that never came, or an error from the model.
fn model_error(app: &App, e: Option<ModelFailed>) -> ApiError {
    app.metrics.error("model");
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        kind: "model",
        message: e.map_or_else(|| "the model thread stopped".into(), |e| e.0),
        retry_after: None,
    }
}

pub(super) fn not_served(what: &str, flag: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "not_served",
        message: format!("this server runs no {what}: start it with {flag} MODEL"),
        retry_after: None,
    }
}

/// Which rerank API a body is for: TEI's (`texts`, `raw_scores`, `return_text`, `truncate`) or
/// Cohere's and Jina's (`documents` as strings or `{"text"}`, `model`, `top_n`,
/// `return_documents`).
#[derive(Clone, Copy, PartialEq)]
enum RerankApi {
    Tei,
    Cohere,
}

/// A rerank body, parsed as it streams by: the texts are counted as they are read, so a body of
/// millions of texts stops at the first one past `--max-inputs` instead of being held whole;
/// fields this server does not use are skipped unread.
#[derive(Default)]
struct RerankBody {
    query: Option<String>,
    texts: Vec<String>,
    raw_scores: bool,
    return_text: bool,
    truncate: Option<bool>,
    model: Option<String>,
    top_n: Option<usize>,
}

/// Parse a rerank body of `api`, at most `max` texts.
fn parse_rerank(body: &[u8], api: RerankApi, max: usize) -> Result<RerankBody, ApiError> {
    use serde::de::DeserializeSeed;
    let mut d = serde_json::Deserializer::from_slice(body);
    RerankSeed { api, max }
        .deserialize(&mut d)
        .and_then(|r| d.end().map(|()| r))
        .map_err(|e| ApiError::bad(format!("the body is not valid: {e}")))
}

struct RerankSeed {
    api: RerankApi,
    max: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for RerankSeed {
    type Value = RerankBody;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<RerankBody, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for RerankSeed {
    type Value = RerankBody;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object with `query` and the texts to rerank")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<RerankBody, A::Error> {
        use serde::de::{Error, IgnoredAny};
        let texts = match self.api {
            RerankApi::Tei => "texts",
            RerankApi::Cohere => "documents",
        };
        let mut r = RerankBody::default();
        let mut seen = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match (key.as_ref(), self.api) {
                (k, _) if k == texts => {
                    r.texts = map.next_value_seed(super::TextsSeed {
                        field: texts,
                        max: self.max,
                        objects: self.api == RerankApi::Cohere,
                    })?;
                    seen = true;
                }
                ("query", _) => r.query = Some(map.next_value()?),
                ("raw_scores", RerankApi::Tei) => r.raw_scores = map.next_value()?,
                ("return_text", RerankApi::Tei) => r.return_text = map.next_value()?,
                ("truncate", RerankApi::Tei) => r.truncate = map.next_value()?,
                ("model", RerankApi::Cohere) => r.model = map.next_value()?,
                ("top_n", RerankApi::Cohere) => r.top_n = map.next_value()?,
                ("return_documents", RerankApi::Cohere) => r.return_text = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if r.query.is_none() {
            return Err(A::Error::custom("`query` is missing"));
        }
        if !seen {
            return Err(A::Error::custom(format!("`{texts}` is missing")));
        }
        Ok(r)
    }
}

/// Tokenize the pairs (on the server's pool), queue them, wait for their scores.
async fn rerank(
    app: &Arc<App>,
    endpoint: &'static str,
    query: String,
    texts: Vec<String>,
    truncate: bool,
) -> Result<(Vec<PairScore>, usize), ApiError> {
    let Some((batcher, _)) = &app.tasks.rerank else {
        return Err(not_served("reranker", "--rerank-model"));
    };
    let Some(model) = app.models.reranker.clone() else {
        return Err(not_served("reranker", "--rerank-model"));
    };
    if texts.is_empty() {
        return Err(ApiError::bad("no texts to rerank"));
    }
    if texts.len() > app.options.max_inputs {
        return Err(ApiError::bad(format!(
            "{} texts: at most {} a request (--max-inputs)",
            texts.len(),
            app.options.max_inputs
        )));
    }
    let n = texts.len();
    let (scores, tokens) = through_queue(app, batcher, move || {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let p = model
                    .encode_pair(&query, t)
                    .map_err(|e| ApiError::bad(format!("text {i}: {e}")))?;
                if p.truncated && !truncate {
                    return Err(ApiError::too_long(format!(
                        "text {i} and the query are over the model's limit of {} tokens; \
                         send shorter texts or ask to truncate (\"truncate\": true)",
                        model.max_len()
                    )));
                }
                Ok(p)
            })
            .collect()
    })
    .await?;
    count(app, endpoint, n, tokens);
    Ok((scores, tokens))
}

pub(super) fn count(app: &App, endpoint: &'static str, inputs: usize, tokens: usize) {
    let labels = super::metrics::EndpointLabels {
        endpoint: endpoint.to_string(),
    };
    app.metrics
        .inputs
        .get_or_create(&labels)
        .inc_by(inputs as u64);
    app.metrics
        .tokens
        .get_or_create(&labels)
        .inc_by(tokens as u64);
}

/// Indices best first (ties: the earlier text first).
fn order(scores: &[PairScore]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].raw.total_cmp(&scores[a].raw).then(a.cmp(&b)));
    order
}

/// TEI's `POST /rerank`: `[{"index", "score", "text"?}]`, best first.
pub(super) async fn tei_rerank(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/rerank", async move {
        let req = parse_rerank(&body, RerankApi::Tei, app2.options.max_inputs)?;
        drop(body);
        let truncate = req
            .truncate
            .unwrap_or(app2.options.long_inputs == LongInputs::Truncate);
        let query = req.query.clone().unwrap_or_default();
        let (scores, _) = rerank(&app2, "/rerank", query, req.texts.clone(), truncate).await?;
        let rows: Vec<Value> = order(&scores)
            .into_iter()
            .map(|i| {
                let score = if req.raw_scores {
                    scores[i].raw
                } else {
                    scores[i].score
                };
                let mut row = json!({"index": i, "score": score});
                if req.return_text {
                    row["text"] = json!(req.texts[i]);
                }
                row
            })
            .collect();
        Ok(axum::Json(rows).into_response())
    })
    .await
}

/// The Cohere/Jina `POST /v1/rerank`: `{"results": [{"index", "relevance_score",
/// "document"?}]}`, best first, `top_n` of them.
pub(super) async fn cohere_rerank(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/v1/rerank", async move {
        let req = parse_rerank(&body, RerankApi::Cohere, app2.options.max_inputs)?;
        drop(body);
        let texts = req.texts;
        let truncate = app2.options.long_inputs == LongInputs::Truncate;
        let query = req.query.unwrap_or_default();
        let (scores, tokens) = rerank(&app2, "/v1/rerank", query, texts.clone(), truncate).await?;
        let top = req.top_n.unwrap_or(scores.len()).min(scores.len());
        let results: Vec<Value> = order(&scores)
            .into_iter()
            .take(top)
            .map(|i| {
                let mut row = json!({"index": i, "relevance_score": scores[i].score});
                if req.return_text {
                    row["document"] = json!({"text": texts[i]});
                }
                row
            })
            .collect();
        let model = req
            .model
            .or_else(|| app2.tasks.rerank.as_ref().map(|(_, name)| name.clone()))
            .unwrap_or_default();
        Ok(axum::Json(json!({
            "model": model,
            "results": results,
            "usage": {"total_tokens": tokens},
        }))
        .into_response())
    })
    .await
}

/// `texts` through the sparse model's queue (tokenized on the tokenizing pool, at most the
/// model's length, cut when `truncate`): their vectors and the tokens they took.
pub(super) async fn sparse_vectors(
    app: &Arc<App>,
    texts: Vec<String>,
    truncate: bool,
) -> Result<(Vec<SparseVector>, usize), ApiError> {
    let Some((batcher, _)) = &app.tasks.sparse else {
        return Err(not_served("sparse model", "--sparse-model"));
    };
    let Some(model) = app.models.sparse.clone() else {
        return Err(not_served("sparse model", "--sparse-model"));
    };
    through_queue(app, batcher, move || {
        let room = model.tokenizer.max_content_len();
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let ids = if truncate {
                    model.tokenizer.ids_for_embedding(t, &[])
                } else {
                    model.tokenizer.content_ids(t)
                }
                .map_err(|e| ApiError::bad(format!("input {i}: {e}")))?;
                if ids.len() > room {
                    return Err(ApiError::too_long(format!(
                        "input {i} has {} tokens, over the model's limit of {room}; \
                         send shorter texts or ask to truncate (\"truncate\": true)",
                        ids.len()
                    )));
                }
                Ok(ids)
            })
            .collect()
    })
    .await
}

/// TEI's `POST /embed_sparse`: per input, its non-zero entries `[{"index", "value"}]`.
pub(super) async fn tei_embed_sparse(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/embed_sparse", async move {
        let app = app2;
        let req = parse_request(&body, "inputs", app.options.max_inputs)?;
        let truncate = req
            .truncate
            .unwrap_or(app.options.long_inputs == LongInputs::Truncate);
        let n = req.texts.len();
        let (vectors, tokens) = sparse_vectors(&app, req.texts, truncate).await?;
        count(&app, "/embed_sparse", n, tokens);
        let rows: Vec<Value> = vectors
            .iter()
            .map(|v| {
                Value::Array(
                    v.indices
                        .iter()
                        .zip(&v.values)
                        .map(|(i, x)| json!({"index": i, "value": x}))
                        .collect(),
                )
            })
            .collect();
        Ok(axum::Json(rows).into_response())
    })
    .await
}
