//! Embeddings from a service: an OpenAI-compatible `POST /v1/embeddings` (OpenAI, vLLM,
//! Infinity, Ollama, `ragline serve`) or Hugging Face TEI's `POST /embed` (TEI, `ragline
//! serve`). Inputs are cut into requests of at most `max_inputs` inputs and `max_tokens`
//! tokens, sent concurrently within the endpoint's bound; every vector is checked (one per
//! input, the expected dimension, finite values) and normalised if asked.
//!
//! A request the service refuses (a 4xx: one input too long, or otherwise unacceptable) is
//! split in halves and each half sent again, down to the single input at fault: only that
//! input fails, never its neighbours (the failure mode of plastic-labs/honcho #999 and of
//! pgai's all-or-nothing batches).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{CallError, Endpoint, Unanswered};

/// Which API the service speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbedApi {
    /// `POST /v1/embeddings` with `{"model", "input": [...]}`.
    Openai,
    /// `POST /embed` with `{"inputs": [...]}` (Hugging Face text-embeddings-inference).
    Tei,
}

impl EmbedApi {
    pub fn path(self) -> &'static str {
        match self {
            EmbedApi::Openai => "/v1/embeddings",
            EmbedApi::Tei => "/embed",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EmbedApi::Openai => "openai",
            EmbedApi::Tei => "tei",
        }
    }
}

impl std::str::FromStr for EmbedApi {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "openai" => Ok(EmbedApi::Openai),
            "tei" => Ok(EmbedApi::Tei),
            other => Err(format!(
                "unknown embeddings API `{other}`: use openai or tei"
            )),
        }
    }
}

/// How requests are made.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedSettings {
    pub api: EmbedApi,
    /// The `model` sent to an OpenAI-compatible API (TEI serves one model and ignores it).
    pub model: Option<String>,
    /// Inputs per request, at most.
    pub max_inputs: usize,
    /// Tokens per request, at most (an input over it goes alone).
    pub max_tokens: usize,
    /// L2-normalise the vectors received.
    pub normalize: bool,
}

/// One text to embed, with its token count (by the local tokenizer, or an estimate) for
/// the limits.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub text: &'a str,
    pub tokens: usize,
}

/// A conservative token count for a text when no tokenizer of the service's model is known:
/// about one token per 3 bytes (English runs at about 4 per token with BPE vocabularies).
pub fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(3).max(1)
}

/// Embeddings from one service.
pub struct RemoteEmbedder {
    endpoint: Arc<Endpoint>,
    settings: EmbedSettings,
    /// The dimension the service answers with (0: not known yet; set by the first answer).
    dimension: AtomicUsize,
}

type Results = Vec<(usize, Result<Vec<f32>, Unanswered>)>;
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl RemoteEmbedder {
    pub fn new(endpoint: Arc<Endpoint>, settings: EmbedSettings) -> RemoteEmbedder {
        RemoteEmbedder {
            endpoint,
            settings,
            dimension: AtomicUsize::new(0),
        }
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    pub fn settings(&self) -> &EmbedSettings {
        &self.settings
    }

    /// The vectors' dimension, once known.
    pub fn dimension(&self) -> Option<usize> {
        Some(self.dimension.load(Ordering::Relaxed)).filter(|d| *d > 0)
    }

    /// Expect vectors of `dimension` (an index made with this service holds them).
    pub fn expect_dimension(&self, dimension: usize) {
        self.dimension.store(dimension, Ordering::Relaxed);
    }

    /// Embed one text to learn the service's dimension (and that it answers at all).
    pub fn probe(&self) -> Result<usize, Unanswered> {
        let input = Input {
            text: "ragline probe",
            tokens: 4,
        };
        match self.embed(&[input]).pop() {
            Some(Ok(v)) => Ok(v.len()),
            Some(Err(e)) => Err(e),
            None => Err("no answer".into()),
        }
    }

    /// One result per input, in order: its vector, or why it has none.
    pub fn embed(&self, inputs: &[Input<'_>]) -> Vec<Result<Vec<f32>, Unanswered>> {
        self.endpoint.block_on(self.embed_async(inputs))
    }

    /// [`RemoteEmbedder::embed`] for async callers (`ragline serve`'s tests, the server).
    pub async fn embed_async(&self, inputs: &[Input<'_>]) -> Vec<Result<Vec<f32>, Unanswered>> {
        let groups = self.plan(inputs);
        let sent = groups
            .into_iter()
            .map(|g| self.send_group(inputs, g))
            .collect::<Vec<_>>();
        let mut out: Vec<Option<Result<Vec<f32>, Unanswered>>> = vec![None; inputs.len()];
        for results in futures::future::join_all(sent).await {
            for (i, r) in results {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err("no result: this is a bug".into())))
            .collect()
    }

    /// Consecutive inputs cut into requests within the input and token limits.
    fn plan(&self, inputs: &[Input<'_>]) -> Vec<Vec<usize>> {
        let mut groups = Vec::new();
        let mut group: Vec<usize> = Vec::new();
        let mut tokens = 0usize;
        for (i, input) in inputs.iter().enumerate() {
            let full = group.len() >= self.settings.max_inputs.max(1)
                || (!group.is_empty() && tokens + input.tokens > self.settings.max_tokens);
            if full {
                groups.push(std::mem::take(&mut group));
                tokens = 0;
            }
            group.push(i);
            tokens += input.tokens;
        }
        if !group.is_empty() {
            groups.push(group);
        }
        groups
    }

    /// Send one request; if the service refuses it, bisect down to the input at fault.
    fn send_group<'a>(
        &'a self,
        inputs: &'a [Input<'a>],
        group: Vec<usize>,
    ) -> BoxFuture<'a, Results> {
        Box::pin(async move {
            let texts: Vec<&str> = group.iter().map(|&i| inputs[i].text).collect();
            let tokens: usize = group.iter().map(|&i| inputs[i].tokens).sum();
            let body = match self.settings.api {
                EmbedApi::Openai => {
                    let mut b = json!({"input": texts, "encoding_format": "float"});
                    if let Some(m) = &self.settings.model {
                        b["model"] = json!(m);
                    }
                    b
                }
                EmbedApi::Tei => json!({"inputs": texts, "truncate": false}),
            };
            let n = group.len();
            let api = self.settings.api;
            let answer = self
                .endpoint
                .post(api.path(), &body, tokens as u64, |bytes| {
                    parse(api, bytes, n)
                })
                .await;
            match answer {
                Ok(vectors) => match self.check(vectors) {
                    Ok(vectors) => group.into_iter().zip(vectors.into_iter().map(Ok)).collect(),
                    Err(e) => group.into_iter().map(|i| (i, Err(e.clone()))).collect(),
                },
                Err(CallError::Rejected { .. }) if n > 1 => {
                    let mid = n / 2;
                    let (left, right) = (group[..mid].to_vec(), group[mid..].to_vec());
                    let (mut a, b) = futures::join!(
                        self.send_group(inputs, left),
                        self.send_group(inputs, right)
                    );
                    a.extend(b);
                    a
                }
                Err(e) => {
                    let reason =
                        Unanswered(format!("{}: {e}", self.endpoint.shown_url(api.path())));
                    group
                        .into_iter()
                        .map(|i| (i, Err(reason.clone())))
                        .collect()
                }
            }
        })
    }

    /// Every vector of the expected dimension and finite; normalised if asked.
    fn check(&self, mut vectors: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, Unanswered> {
        for v in &mut vectors {
            let expected = self.dimension.load(Ordering::Relaxed);
            if expected == 0 {
                let _ = self.dimension.compare_exchange(
                    0,
                    v.len(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            } else if v.len() != expected {
                return Err(Unanswered(format!(
                    "{} answered a {}-dimensional vector where {expected} dimensions were \
                     expected: is it serving another model than the index was built with?",
                    self.endpoint.settings().url,
                    v.len()
                )));
            }
            if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
                return Err(Unanswered(format!(
                    "{} answered a vector with non-finite values (or none)",
                    self.endpoint.settings().url
                )));
            }
            if self.settings.normalize {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 {
                    v.iter_mut().for_each(|x| *x /= norm);
                }
            }
        }
        Ok(vectors)
    }
}

/// The vectors of an answer, in input order; an error is a malformed answer (retried).
pub fn parse(api: EmbedApi, body: &[u8], expected: usize) -> Result<Vec<Vec<f32>>, Unanswered> {
    let vectors = match api {
        EmbedApi::Openai => {
            #[derive(Deserialize)]
            struct Item {
                embedding: Vec<f32>,
                #[serde(default)]
                index: Option<usize>,
            }
            #[derive(Deserialize)]
            struct Answer {
                data: Vec<Item>,
            }
            let answer: Answer = serde_json::from_slice(body)
                .map_err(|e| format!("not an embeddings answer: {e}"))?;
            let mut items = answer.data;
            if items.iter().all(|i| i.index.is_some()) {
                items.sort_by_key(|i| i.index);
                if items.iter().enumerate().any(|(n, i)| i.index != Some(n)) {
                    return Err("the answer's `index` values are not 0..n".into());
                }
            }
            items.into_iter().map(|i| i.embedding).collect::<Vec<_>>()
        }
        EmbedApi::Tei => serde_json::from_slice::<Vec<Vec<f32>>>(body)
            .map_err(|e| format!("not a TEI /embed answer: {e}"))?,
    };
    if vectors.len() != expected {
        return Err(format!("{} vectors for {expected} inputs", vectors.len()).into());
    }
    Ok(vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_of_both_apis_parse_in_input_order() {
        let openai = br#"{"object":"list","data":[
            {"object":"embedding","index":1,"embedding":[0.0,1.0]},
            {"object":"embedding","index":0,"embedding":[1.0,0.0]}],"model":"m"}"#;
        assert_eq!(
            parse(EmbedApi::Openai, openai, 2).unwrap(),
            vec![vec![1.0, 0.0], vec![0.0, 1.0]]
        );
        assert_eq!(
            parse(EmbedApi::Tei, b"[[1.0,2.0],[3.0,4.0]]", 2).unwrap(),
            vec![vec![1.0, 2.0], vec![3.0, 4.0]]
        );
        assert!(parse(EmbedApi::Tei, b"[[1.0,2.0]]", 2)
            .unwrap_err()
            .0
            .contains("1 vectors for 2 inputs"));
        assert!(parse(EmbedApi::Openai, br#"{"data":[{"embedding":[1.0"#, 1).is_err());
        let gap = br#"{"data":[{"index":0,"embedding":[1.0]},{"index":2,"embedding":[1.0]}]}"#;
        assert!(parse(EmbedApi::Openai, gap, 2).is_err());
    }

    #[test]
    fn requests_respect_the_input_and_token_limits() {
        let endpoint = Endpoint::new(super::super::EndpointSettings {
            url: "http://127.0.0.1:9".into(),
            ..Default::default()
        })
        .unwrap();
        let r = RemoteEmbedder::new(
            endpoint,
            EmbedSettings {
                api: EmbedApi::Tei,
                model: None,
                max_inputs: 3,
                max_tokens: 100,
                normalize: false,
            },
        );
        let sizes = [10, 10, 10, 10, 60, 50, 200, 5];
        let inputs: Vec<Input<'_>> = sizes
            .iter()
            .map(|&tokens| Input { text: "x", tokens })
            .collect();
        let plan = r.plan(&inputs);
        assert_eq!(
            plan,
            vec![vec![0, 1, 2], vec![3, 4], vec![5], vec![6], vec![7]]
        );
        for g in &plan {
            let t: usize = g.iter().map(|&i| sizes[i]).sum();
            assert!(g.len() <= 3 && (t <= 100 || g.len() == 1));
        }
    }
}
