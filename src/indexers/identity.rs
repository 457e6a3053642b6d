//! What a run writes into an index: the model whose vectors it adds and the chunker its
//! documents are cut with. Every backend records it and refuses a run of another model.

use super::BackendError;
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
    /// The approximate nearest-neighbour index the run keeps (sqlite:// only; `index.ann`,
    /// `--ann`): recorded in the index, so later writers keep it the same way. `None`: as the
    /// index records it.
    pub ann: crate::indexers::ann::AnnChoice,
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

/// The model an index holds vectors of, as its metadata records it.
pub(crate) struct HeldModel<'a> {
    pub name: &'a str,
    pub fingerprint: Option<&'a str>,
    pub dimension: Option<usize>,
}

/// Refuse a run that would add vectors of another model (or dimension) to an index: the same
/// rule and message on every backend. `index` names it in the message; `elsewhere` says how
/// to pick another index (`another --index`).
pub(crate) fn check_model(
    index: &str,
    elsewhere: &str,
    held: Option<HeldModel<'_>>,
    model: Option<&ModelIdentity>,
) -> Result<(), BackendError> {
    let (Some(model), Some(held)) = (model, held) else {
        return Ok(());
    };
    let dim = held.dimension.unwrap_or(0);
    if held.fingerprint == Some(model.fingerprint.as_str()) && dim == model.dimension {
        return Ok(());
    }
    let have = held.name;
    Err(BackendError::Invalid(format!(
        "index {index} holds vectors of model `{have}` ({dim} dimensions, fingerprint {}); \
         this run embeds with `{}` ({} dimensions, fingerprint {}). Vectors of two models \
         cannot be searched together: use {elsewhere}, or --model {have}, or move the index to \
         the new model with `ragline backfill --stage embed --model {}`",
        held.fingerprint.unwrap_or("?"),
        model.name,
        model.dimension,
        model.fingerprint,
        model.name
    )))
}
