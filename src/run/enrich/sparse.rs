//! The `sparse` stage: each claimed document's current chunks through the index's SPLADE
//! model, their sparse vectors written (replacing the document's earlier ones) with the status
//! change in one transaction. A document whose chunks the model cannot take is failed alone
//! (retried with backoff, then dead-lettered with each attempt's error); the others of its
//! claim go on.

use std::sync::Arc;

use super::{EnrichWorker, Shared};
use crate::embed::splade::{SparseModel, SparseVector};
use crate::embed::EmbedError;
use crate::lifecycle::{
    ChunkSparse, EnrichStore, Owner, StageSettings, StoreError, WorkItem, WorkKey,
};

/// Chunks per forward pass, at most (a document's chunks go in as few passes as this allows).
const BATCH_CHUNKS: usize = 32;

/// The sparse stage as enrich runs it.
pub struct SparseStage {
    pub model: Arc<SparseModel>,
    /// The model as the index records it (its fingerprint is the stage's).
    pub fingerprint: String,
    pub settings: StageSettings,
}

impl std::fmt::Debug for SparseStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseStage")
            .field("model", &self.model.files.name)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl SparseStage {
    /// The sparse vectors of texts, in their order.
    pub fn vectors(&self, texts: &[&str]) -> Result<Vec<SparseVector>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for group in texts.chunks(BATCH_CHUNKS) {
            out.extend(self.model.embed_texts(group)?);
        }
        Ok(out)
    }
}

/// Compute and record the sparse vectors of each claimed document.
pub(super) fn process<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    stage: &SparseStage,
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
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        match stage.vectors(&texts) {
            Ok(vectors) => {
                let rows: Vec<ChunkSparse> = chunks
                    .iter()
                    .zip(vectors)
                    .map(|(c, v)| ChunkSparse {
                        rowid: c.rowid,
                        terms: v.indices,
                        weights: v.values,
                    })
                    .collect();
                if w.store.write_sparse(owner.as_str(), &item.key, &rows)? {
                    shared.tally().done(&item.key);
                }
            }
            Err(e) => failures.push((
                item.key,
                format!("sparse model `{}`: {e}", stage.model.files.name),
            )),
        }
    }
    if !gone.is_empty() {
        // Deleted while queued: nothing to do, and nothing to retry.
        w.store.complete(owner.as_str(), &gone)?;
    }
    super::record_failures(w, owner, &failures, &stage.settings, shared)
}
