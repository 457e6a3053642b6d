//! What a run writes into an index: the model whose vectors it adds and the chunker its
//! documents are cut with. Every backend records it and refuses a run of another model.

use crate::lifecycle::Priority;

/// What a run writes into the index: the model whose vectors it adds, and the fingerprint of
/// the chunker (settings and tokenizer) its documents are cut with.
#[derive(Clone, Debug)]
pub struct IndexIdentity {
    pub model: Option<ModelIdentity>,
    pub pipeline_fingerprint: String,
    /// The run leaves embedding to `ragline enrich`: a document counts as already indexed
    /// when its chunks are there, embedded or not. (A run that embeds redoes a document
    /// whose vectors are missing.)
    pub defer_embed: bool,
    /// The priority the run's new work is queued at (`stages.embed.priority`).
    pub priority: Priority,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelIdentity {
    /// As the user named it (a hub id or a folder).
    pub name: String,
    /// The folder it was loaded from, so `ragline search` can find it again.
    pub dir: String,
    pub fingerprint: String,
    pub dimension: usize,
    /// The fingerprint of its tokenizer: chunk token ids can be reused by a model with the
    /// same one.
    pub tokenizer: Option<String>,
}
