//! The stages that run a model of this process over each claimed document's current chunks:
//! `sparse` (SPLADE vectors, one per chunk), `entities` (a token-classification model; the
//! chunks' entities gathered per document) and `labels` (a sequence-classification model; the
//! chunks' scores averaged per document, weighted by their tokens). A document's results are
//! written (replacing its earlier ones) with the status change in one transaction. A document
//! whose chunks the model cannot take is failed alone (retried with backoff, then
//! dead-lettered with each attempt's error); the others of its claim go on.

use std::collections::HashMap;
use std::sync::Arc;

use super::{EnrichWorker, Shared};
use crate::embed::classify::{LabelChoice, SequenceClassifier};
use crate::embed::ner::aggregate::Entity;
use crate::embed::ner::{NerOptions, TokenClassifier};
use crate::embed::splade::{SparseModel, SparseVector};
use crate::embed::EmbedError;
use crate::lifecycle::{
    Annotations, ChunkSparse, ChunkText, DocumentEntity, DocumentLabel, EnrichStore, EntityMention,
    Owner, StageSettings, StoreError, WorkItem, WorkKey, ENTITIES, LABELS, SPARSE,
};

/// Chunks per forward pass of the sparse model, at most.
const BATCH_CHUNKS: usize = 32;
/// Tokens per forward pass of a classifier, at most.
const BATCH_TOKENS: usize = 8192;
/// Mentions kept per entity (its count has them all).
pub const MAX_SPANS: usize = 32;
/// Entities and labels a prompt's `{entities}` / `{labels}` lists, at most.
const PROMPT_ITEMS: usize = 50;

/// The model a chunk stage runs.
pub enum ChunkModel {
    Sparse(Arc<SparseModel>),
    Entities {
        model: Arc<TokenClassifier>,
        options: NerOptions,
        /// Mentions scored lower are left out.
        min_score: f32,
    },
    Labels {
        model: Arc<SequenceClassifier>,
        choice: LabelChoice,
    },
}

/// A chunk stage as enrich runs it.
pub struct ModelStage {
    pub model: ChunkModel,
    /// What its results depend on (the model's files, the stage's settings): another one
    /// makes every document's results stale.
    pub fingerprint: String,
    pub settings: StageSettings,
}

impl std::fmt::Debug for ModelStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelStage")
            .field("stage", &self.name())
            .field("model", &self.model_name())
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// What a stage makes of one document.
enum Output {
    Sparse(Vec<ChunkSparse>),
    Annotations(Annotations),
}

impl ModelStage {
    /// The stage's name: `sparse`, `entities` or `labels`.
    pub fn name(&self) -> &'static str {
        match self.model {
            ChunkModel::Sparse(_) => SPARSE,
            ChunkModel::Entities { .. } => ENTITIES,
            ChunkModel::Labels { .. } => LABELS,
        }
    }

    pub fn model_name(&self) -> &str {
        match &self.model {
            ChunkModel::Sparse(m) => &m.files.name,
            ChunkModel::Entities { model, .. } => model.name(),
            ChunkModel::Labels { model, .. } => model.name(),
        }
    }

    /// The sparse vectors of texts, in their order.
    pub fn vectors(model: &SparseModel, texts: &[&str]) -> Result<Vec<SparseVector>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for group in texts.chunks(BATCH_CHUNKS) {
            out.extend(model.embed_texts(group)?);
        }
        Ok(out)
    }

    fn run(&self, chunks: &[ChunkText]) -> Result<Output, EmbedError> {
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        Ok(match &self.model {
            ChunkModel::Sparse(model) => Output::Sparse(
                chunks
                    .iter()
                    .zip(Self::vectors(model, &texts)?)
                    .map(|(c, v)| ChunkSparse {
                        rowid: c.rowid,
                        terms: v.indices,
                        weights: v.values,
                    })
                    .collect(),
            ),
            ChunkModel::Entities {
                model,
                options,
                min_score,
            } => {
                let found = model.entities(&texts, options, BATCH_TOKENS)?;
                Output::Annotations(Annotations::Entities(gather_entities(
                    chunks, &found, *min_score,
                )))
            }
            ChunkModel::Labels { model, choice } => {
                let seqs = texts
                    .iter()
                    .map(|t| model.encode(t))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<_> = seqs.iter().collect();
                let logits = model.logits(&refs, BATCH_TOKENS)?;
                let function = model.function();
                let scored: Vec<(Vec<f32>, usize)> = logits
                    .iter()
                    .zip(&seqs)
                    .map(|(l, s)| (function.apply(l), s.ids.len()))
                    .collect();
                let mean = weighted_mean(&scored);
                let labels = model
                    .choose(&mean, *choice)
                    .into_iter()
                    .map(|l| DocumentLabel {
                        label: l.label,
                        score: l.score,
                    })
                    .collect();
                Output::Annotations(Annotations::Labels(labels))
            }
        })
    }
}

/// The scores of a document's chunks averaged, each weighted by its tokens (a long chunk
/// says more about the document than a heading's stub).
pub fn weighted_mean(scored: &[(Vec<f32>, usize)]) -> Vec<f32> {
    let width = scored.first().map_or(0, |(s, _)| s.len());
    let total: usize = scored.iter().map(|(_, n)| *n).sum();
    let mut mean = vec![0f64; width];
    for (scores, n) in scored {
        for (m, s) in mean.iter_mut().zip(scores) {
            *m += f64::from(*s) * *n as f64;
        }
    }
    mean.iter()
        .map(|m| (m / total.max(1) as f64) as f32)
        .collect()
}

/// The entities of a document from those of its chunks: mentions (character offsets in their
/// chunk, byte offsets in the document) gathered by type and normalised form; a mention seen
/// twice where chunks overlap counts once.
pub fn gather_entities(
    chunks: &[ChunkText],
    found: &[Vec<Entity>],
    min_score: f32,
) -> Vec<DocumentEntity> {
    let mut by_key: HashMap<(String, String), usize> = HashMap::new();
    let mut out: Vec<DocumentEntity> = Vec::new();
    // Per entity: its surface forms with their counts, in first-seen order.
    let mut forms: Vec<Vec<(String, u32)>> = Vec::new();
    let mut seen: std::collections::HashSet<(String, usize, usize)> = Default::default();
    for (chunk, entities) in chunks.iter().zip(found) {
        let offsets = CharBytes::new(&chunk.text);
        for e in entities.iter().filter(|e| e.score >= min_score) {
            let kind = entity_type(&e.label);
            let surface: String = chunk
                .text
                .get(offsets.byte(e.start)..offsets.byte(e.end))
                .unwrap_or(&e.word)
                .trim()
                .to_string();
            let norm = DocumentEntity::normalize(&surface);
            if norm.is_empty() {
                continue;
            }
            let doc_start = chunk.start_byte + offsets.byte(e.start);
            let doc_end = chunk.start_byte + offsets.byte(e.end);
            if !seen.insert((kind.clone(), doc_start, doc_end)) {
                continue;
            }
            let i = *by_key
                .entry((kind.clone(), norm.clone()))
                .or_insert_with(|| {
                    out.push(DocumentEntity {
                        kind: kind.clone(),
                        text: String::new(),
                        norm: norm.clone(),
                        mentions: 0,
                        score: 0.0,
                        spans: Vec::new(),
                    });
                    forms.push(Vec::new());
                    out.len() - 1
                });
            let entity = &mut out[i];
            entity.mentions += 1;
            entity.score = entity.score.max(e.score);
            if entity.spans.len() < MAX_SPANS {
                entity.spans.push(EntityMention {
                    chunk: chunk.ordinal,
                    start: e.start,
                    end: e.end,
                    doc_start,
                    doc_end,
                    score: e.score,
                });
            }
            match forms[i].iter_mut().find(|(f, _)| *f == surface) {
                Some((_, n)) => *n += 1,
                None => forms[i].push((surface, 1)),
            }
        }
    }
    for (entity, forms) in out.iter_mut().zip(forms) {
        // The most frequent form; the first seen of equals.
        let best = forms.iter().map(|(_, n)| *n).max().unwrap_or(0);
        entity.text = forms
            .into_iter()
            .find(|(_, n)| *n == best)
            .map(|(f, _)| f)
            .unwrap_or_default();
    }
    out.sort_by(|a, b| {
        (a.kind.as_str(), b.mentions, a.norm.as_str()).cmp(&(
            b.kind.as_str(),
            a.mentions,
            b.norm.as_str(),
        ))
    });
    out
}

/// The entity type of a label: `B-ORG`, `I-ORG` and `ORG` are `ORG`.
fn entity_type(label: &str) -> String {
    match label.split_once('-') {
        Some(("B" | "I" | "E" | "S" | "L" | "U", rest)) if !rest.is_empty() => rest.to_string(),
        _ => label.to_string(),
    }
}

/// Character offsets of a text to byte offsets.
struct CharBytes(Vec<usize>);

impl CharBytes {
    fn new(text: &str) -> CharBytes {
        let mut v: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
        v.push(text.len());
        CharBytes(v)
    }

    fn byte(&self, char_offset: usize) -> usize {
        self.0[char_offset.min(self.0.len() - 1)]
    }
}

/// What a prompt's `{entities}` or `{labels}` becomes: `ORG: Acme Corp (3), Globex; PER: Ada
/// Lovelace` and `sports (0.91), politics (0.07)`.
pub fn prompt_text(annotations: &Annotations) -> String {
    match annotations {
        Annotations::Entities(entities) => {
            let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
            for e in entities.iter().take(PROMPT_ITEMS) {
                let shown = if e.mentions > 1 {
                    format!("{} ({})", e.text, e.mentions)
                } else {
                    e.text.clone()
                };
                match groups.iter_mut().find(|(k, _)| *k == e.kind) {
                    Some((_, v)) => v.push(shown),
                    None => groups.push((&e.kind, vec![shown])),
                }
            }
            groups
                .iter()
                .map(|(k, v)| format!("{k}: {}", v.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        }
        Annotations::Labels(labels) => labels
            .iter()
            .take(PROMPT_ITEMS)
            .map(|l| format!("{} ({:.2})", l.label, l.score))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Run the stage's model over each claimed document's chunks and record the results.
pub(super) fn process<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    stage: &ModelStage,
    owner: &Owner,
    items: Vec<WorkItem>,
    shared: &Shared<'_>,
) -> Result<(), StoreError> {
    let mut gone: Vec<WorkKey> = Vec::new();
    let mut failures: Vec<(WorkKey, String)> = Vec::new();
    for item in items {
        if shared.signal.is_stopped() {
            w.store.release(owner.as_str(), &[item.key])?;
            continue;
        }
        let Some(chunks) = w.store.current_chunks(&item.key.document_id)? else {
            gone.push(item.key);
            continue;
        };
        // Tests: a worker killed while the stage's model runs.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("enrich::chunk_model");
        let written = match stage.run(&chunks) {
            Ok(Output::Sparse(rows)) => w.store.write_sparse(owner.as_str(), &item.key, &rows)?,
            Ok(Output::Annotations(a)) => {
                w.store
                    .write_annotations(owner.as_str(), &item.key, &a, &prompt_text(&a))?
            }
            Err(e) => {
                failures.push((
                    item.key,
                    format!("{} model `{}`: {e}", stage.name(), stage.model_name()),
                ));
                continue;
            }
        };
        if written {
            shared.tally().done(&item.key);
        }
    }
    if !gone.is_empty() {
        // Deleted while queued: nothing to do, and nothing to retry.
        w.store.complete(owner.as_str(), &gone)?;
    }
    super::record_failures(w, owner, &failures, &stage.settings, shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(label: &str, word: &str, start: usize, end: usize, score: f32) -> Entity {
        Entity {
            label: label.into(),
            score,
            word: word.into(),
            start,
            end,
            index: None,
        }
    }

    #[test]
    fn entities_are_gathered_by_type_and_form_and_overlaps_count_once() {
        // Two chunks of "Acme Corp hired Ada. Ada met ACME corp. in Zürich." overlapping on
        // "Ada met".
        let doc = "Acme Corp hired Ada. Ada met ACME corp. in Zürich.";
        let a = ChunkText {
            rowid: 1,
            ordinal: 0,
            start_byte: 0,
            text: doc[..28].to_string(),
        };
        let b = ChunkText {
            rowid: 2,
            ordinal: 1,
            start_byte: 21,
            text: doc[21..].to_string(),
        };
        let found = vec![
            vec![
                entity("ORG", "Acme Corp", 0, 9, 0.9),
                entity("PER", "Ada", 16, 19, 0.8),
                entity("PER", "Ada", 21, 24, 0.7),
            ],
            vec![
                entity("PER", "Ada", 0, 3, 0.75),
                entity("B-ORG", "ACME corp.", 8, 18, 0.95),
                entity("LOC", "Zürich", 22, 28, 0.99),
                entity("MISC", "x", 0, 1, 0.1),
            ],
        ];
        let got = gather_entities(&[a, b], &found, 0.5);
        let summary: Vec<(&str, &str, &str, u32)> = got
            .iter()
            .map(|e| {
                (
                    e.kind.as_str(),
                    e.text.as_str(),
                    e.norm.as_str(),
                    e.mentions,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("LOC", "Zürich", "zürich", 1),
                ("ORG", "Acme Corp", "acme corp", 2),
                ("PER", "Ada", "ada", 2)
            ]
        );
        let zurich = &got[0].spans[0];
        // Characters in the chunk, bytes in the document (ü is two bytes).
        assert_eq!((zurich.start, zurich.end), (22, 28));
        assert_eq!(&doc[zurich.doc_start..zurich.doc_end], "Zürich");
        assert_eq!(got[1].score, 0.95);
        assert_eq!(
            prompt_text(&Annotations::Entities(got)),
            "LOC: Zürich; ORG: Acme Corp (2); PER: Ada (2)"
        );
    }

    #[test]
    fn label_scores_are_averaged_by_tokens() {
        let mean = weighted_mean(&[(vec![1.0, 0.0], 30), (vec![0.0, 1.0], 10)]);
        assert_eq!(mean, [0.75, 0.25]);
        assert!(weighted_mean(&[]).is_empty());
        let labels = Annotations::Labels(vec![
            DocumentLabel {
                label: "sports".into(),
                score: 0.912,
            },
            DocumentLabel {
                label: "news".into(),
                score: 0.07,
            },
        ]);
        assert_eq!(prompt_text(&labels), "sports (0.91), news (0.07)");
    }
}
