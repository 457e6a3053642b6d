//! What a store must do for the lifecycle: the durable work queue (claim with a lease, renew,
//! complete, fail with backoff or dead-letter) and the reads the stages need. `indexers/sqlite`
//! implements it (SQLite serialises the claim transactions) and `indexers/postgres` (claims
//! with `FOR UPDATE SKIP LOCKED`, so many machines share one queue).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{Priority, StageSettings, Status};
use crate::document::InputKey;

#[derive(Debug, Error)]
pub enum StoreError {
    /// The store cannot be used (unreadable, locked for too long, corrupt): the worker stops.
    #[error("index error: {0}")]
    Io(String),
    /// A request the store refuses (an unknown document, stage or vector set): the message
    /// says what to do.
    #[error("{0}")]
    Invalid(String),
}

/// What the index holds completely about a document, for incremental runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownDocument {
    pub content_hash: String,
    pub fingerprint: String,
}

/// A web page the index holds, with what a conditional GET needs to ask whether it changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownPage {
    pub id: String,
    /// The URL it was read from (after redirects).
    pub url: String,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    /// Links from the crawl's start page, when a crawl read it.
    pub depth: Option<u32>,
    /// The links in the crawl's scope the page had (what a crawl follows from it), when the
    /// index kept them: only then can the page be asked for conditionally.
    pub links: Option<Vec<String>>,
    /// The URL a redirect to it came from, when one did.
    pub redirected_from: Option<String>,
}

/// The vectors an index already holds, looked up by the model input they were computed from
/// ([`crate::document::Chunk::input_key_of`]). One per worker.
pub trait StoredVectors: Send {
    /// The vector of an identical input, if the index holds one.
    fn vector_for(&mut self, key: &InputKey) -> Result<Option<Vec<f32>>, StoreError>;
}

/// One unit of work: a document in a stage (for `embed`, in one vector set; 0 otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkKey {
    pub document_id: String,
    pub stage: String,
    pub vector_set: i64,
}

/// Work a claim handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkItem {
    pub key: WorkKey,
    /// Attempts made, this one included.
    pub attempts: u32,
    pub priority: Priority,
    /// The version of the document the work is for: a result is only recorded when the
    /// document still has it.
    pub input_version: String,
    /// The order claims were made in (for showing that priority works).
    pub claim_seq: i64,
    /// Its work (embed: tokens still to embed), as the claim measured it.
    pub cost: u64,
}

/// A failed delivery of work a broker carries (`enrich --queue`): the broker counts the
/// attempts and retries with its own backoff, so the store records the error, and
/// dead-letters the work when the broker will not deliver it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryFailure {
    pub key: WorkKey,
    /// Which delivery failed, from 1.
    pub attempt: u32,
    pub message: String,
    /// The broker gives up on it (its last delivery): dead-letter it.
    pub dead: bool,
    /// Who made the attempt (a process's [`crate::lifecycle::Owner`]), for the error's record.
    pub worker: String,
}

/// What a worker asks for.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    pub owner: String,
    /// The stages this worker does (empty: every stage it can).
    pub stages: Vec<String>,
    /// Vector sets this worker may take embed work of (empty: any).
    pub vector_sets: Vec<i64>,
    /// Items per claim, at most.
    pub max_items: usize,
    /// Work (tokens, for embed) per claim, at most; the first item is taken whatever its cost.
    pub max_cost: u64,
    pub lease: Duration,
    /// Work claimed this many times already is dead-lettered instead of claimed again (a
    /// document that kills its worker every time).
    pub retry_limit: u32,
}

/// What a claim got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    Items(Vec<WorkItem>),
    /// Nothing can be claimed now.
    Idle {
        /// The stage is paused (and had work).
        paused: bool,
        /// When the next failed item's backoff ends (ms since the epoch), if any is waiting.
        next_due: Option<i64>,
    },
}

/// Claims in a row that may come back empty before a worker is told to look again soon.
pub const CLAIM_TRIES: usize = 100;

/// A store's claim, the same on every backend: `once` is one claim transaction. One that got
/// nothing though there was work (every candidate went to the dead-letter queue, or another
/// worker took the same rows) claims again, at most [`CLAIM_TRIES`] times; then the worker is
/// told to look again in 50 ms rather than spin.
pub fn claim_with_retries(
    mut once: impl FnMut() -> Result<Claim, StoreError>,
) -> Result<Claim, StoreError> {
    for _ in 0..CLAIM_TRIES {
        match once()? {
            Claim::Items(items) if items.is_empty() => continue,
            other => return Ok(other),
        }
    }
    Ok(Claim::Idle {
        paused: false,
        next_due: Some(super::now_ms() + 50),
    })
}

/// A chunk that needs a vector in a vector set.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingChunk {
    pub rowid: i64,
    pub chunk_id: String,
    pub document_id: String,
    /// The row's input key when it was read: a vector is written only if the row still has
    /// it (the chunk was not replaced by new text meanwhile).
    pub input_key: Option<InputKey>,
    /// The chunker's token ids, stored by a deferred ingest (None when the set's model has
    /// another tokenizer, or the ids were not kept).
    pub token_ids: Option<Vec<u32>>,
    pub text: String,
}

/// A vector to write for a chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkVector {
    pub rowid: i64,
    /// The input key the chunk had when it was read ([`PendingChunk::input_key`]).
    pub guard: Option<InputKey>,
    pub vector: Vec<f32>,
}

/// A document's text as the index holds it (its current chunks, overlaps removed), for a
/// document-level stage.
#[derive(Clone, Debug, PartialEq)]
pub struct DocumentText {
    pub title: Option<String>,
    pub source: Option<String>,
    pub text: String,
    /// What the document-level stages said of it (stage, output): what a prompt's
    /// `{summary}`, `{entities}`, `{labels}` are replaced with.
    pub outputs: Vec<(String, String)>,
}

/// A current chunk of a document, as the chunk-model stages (sparse, entities, labels) read
/// it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkText {
    pub rowid: i64,
    /// Its place in the document (0, 1, ...).
    pub ordinal: i64,
    /// Where it starts in the document's text, in bytes.
    pub start_byte: usize,
    pub text: String,
}

/// Where a mention of an entity is: in a chunk (characters, as the NER model counts them)
/// and in the document (bytes, as chunk offsets are kept).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntityMention {
    pub chunk: i64,
    pub start: usize,
    pub end: usize,
    pub doc_start: usize,
    pub doc_end: usize,
    pub score: f32,
}

/// An entity of a document (the `entities` stage): its mentions in the document's chunks
/// gathered under its type and normalised form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentEntity {
    /// The entity type (`ORG`, `PER`...), as the model's labels name it.
    #[serde(rename = "type")]
    pub kind: String,
    /// The form it is mentioned by most often (the first of equals).
    pub text: String,
    /// Its normalised form: what filters and facets compare (`entities::normalize`).
    pub norm: String,
    /// How many times the document mentions it.
    pub mentions: u32,
    /// The best score of its mentions.
    pub score: f32,
    /// Its first mentions (at most `MAX_SPANS`), in document order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<EntityMention>,
}

impl DocumentEntity {
    /// The form filters and facets compare: lowercase, runs of white space as one space,
    /// punctuation at either end left out (`ACME  Corp.` is `acme corp`).
    pub fn normalize(text: &str) -> String {
        let words: Vec<&str> = text.split_whitespace().collect();
        words
            .join(" ")
            .trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    }
}

/// A label of a document (the `labels` stage) with its score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentLabel {
    pub label: String,
    pub score: f32,
}

/// What a chunk-model stage writes for a document.
#[derive(Clone, Debug, PartialEq)]
pub enum Annotations {
    Entities(Vec<DocumentEntity>),
    Labels(Vec<DocumentLabel>),
}

/// A chunk's sparse vector to write: vocabulary ids (ascending) and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkSparse {
    pub rowid: i64,
    pub terms: Vec<u32>,
    pub weights: Vec<f32>,
}

/// The sparse (SPLADE) model an index's sparse vectors come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseModelRecord {
    /// As it was named (a hub id, a name under models/, a folder).
    pub name: String,
    /// The folder it was loaded from.
    pub dir: String,
    /// Its files and pooling, hashed: the `sparse` stage's fingerprint.
    pub fingerprint: String,
    /// The vocabulary size: the vectors' dimension.
    pub dimension: usize,
}

/// Join chunk texts (by ordinal, each with its byte range in the document) into the
/// document's text: what overlaps the previous chunk is left out, gaps become blank lines.
pub fn stitch(chunks: &[(usize, usize, String)]) -> String {
    let mut out = String::new();
    let mut covered = 0usize;
    for (start, end, text) in chunks {
        let skip = covered.saturating_sub(*start);
        let rest = if skip == 0 {
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            text.as_str()
        } else {
            // An overlap ends where the previous chunk ended: a char boundary of both.
            text.get(skip..).unwrap_or("")
        };
        out.push_str(rest);
        covered = covered.max(*end);
    }
    out
}

/// The durable, leased work queue.
pub trait LifecycleStore: Send {
    /// Claim a batch of runnable work in one transaction: pending or failed work whose backoff
    /// is over, or work whose lease expired, of an unpaused stage whose dependencies are done
    /// for the document's current version; highest priority first, FIFO within a priority.
    fn claim(&mut self, req: &ClaimRequest) -> Result<Claim, StoreError>;

    /// Extend the leases `owner` holds on `keys`.
    fn renew(&mut self, owner: &str, keys: &[WorkKey], lease: Duration) -> Result<(), StoreError>;

    /// Record a failed attempt for each item `owner` holds: `failed` with a backoff, or
    /// `dead` once the retry limit is reached; the error is kept with the time and worker.
    /// Returns the new status of each.
    fn fail(
        &mut self,
        owner: &str,
        failures: &[(WorkKey, String)],
        settings: &StageSettings,
    ) -> Result<Vec<Status>, StoreError>;

    /// Record failed deliveries of work `owner` holds for a broker (`enrich --queue`): each
    /// error is kept with its attempt; the work stays held (its lease extended by `lease`,
    /// the attempts made recorded) while the broker retries it, or goes dead. Returns the new
    /// status of each: `Failed` (the broker retries), `Dead`, or `InProgress` when `owner` no
    /// longer holds it (the failure is void).
    fn fail_deliveries(
        &mut self,
        owner: &str,
        failures: &[DeliveryFailure],
        lease: Duration,
    ) -> Result<Vec<Status>, StoreError>;

    /// Mark work done whose result is the status itself (no data to write).
    fn complete(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError>;

    /// Give back leases without counting an attempt (a worker stopping on request).
    fn release(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError>;

    /// Expire at once the leases held by processes of this host that are gone. Returns how
    /// many leases were freed.
    fn reap_dead_owners(&mut self) -> Result<usize, StoreError>;

    /// Work in progress under a lease, by owner: what a run that ends leaves to others.
    fn held_leases(&mut self) -> Result<Vec<HeldLease>, StoreError>;

    /// Housekeeping when no work is claimable: queue the next page of a backfill, or switch
    /// search to a backfilled vector set that is complete.
    fn maintain(&mut self) -> Result<Maintenance, StoreError>;

    /// Queue the document-level stage `stage` (an LLM stage) for every document that has no
    /// row of it, or one for another version of the document or another `fingerprint` of the
    /// stage (a changed prompt or model makes every answer stale). Rows done for the same
    /// version and fingerprint are left alone (an unchanged document costs no call), and so
    /// are dead ones (`dlq requeue` brings them back). Work queued only because the
    /// fingerprint changed (the same version of the document: a new model or prompt) is queued
    /// at backfill priority, behind new and changed documents. Returns how many were queued.
    fn sync_stage(
        &mut self,
        stage: &str,
        fingerprint: &str,
        priority: Priority,
    ) -> Result<u64, StoreError>;
}

/// Work one owner holds under a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLease {
    pub owner: String,
    /// Documents (rows of any stage) it holds.
    pub items: u64,
    /// When the last of its leases expires (ms since the epoch).
    pub until_ms: i64,
}

/// What [`LifecycleStore::maintain`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Maintenance {
    /// Nothing to do.
    Nothing,
    /// A page of documents was queued for the backfill of vector set `set`.
    Queued { set: i64, documents: usize },
    /// The backfill of `set` is complete: search now uses `model`.
    Switched { set: i64, model: String },
    /// The backfill cannot complete while documents of it are dead-lettered.
    Blocked { set: i64, dead: u64 },
}

/// What the embed stage needs besides the queue.
pub trait EnrichStore: LifecycleStore {
    /// The chunks of the document in `key` that have no vector in its vector set.
    fn pending_chunks(&mut self, key: &WorkKey) -> Result<Vec<PendingChunk>, StoreError>;

    /// A vector the set already holds for an identical model input, when the set's model
    /// tokenizes like the chunker (so that equal keys mean equal inputs).
    fn vector_for(
        &mut self,
        vector_set: i64,
        key: &InputKey,
    ) -> Result<Option<Vec<f32>>, StoreError>;

    /// Write vectors into a set and, in the same transaction, settle the documents they
    /// belong to and `documents` (those with nothing left to write): each is marked done when
    /// its chunks all have a vector. Vectors of chunks replaced meanwhile are not written.
    /// Returns how many were written.
    fn write_vectors(
        &mut self,
        vector_set: i64,
        vectors: &[ChunkVector],
        documents: &[String],
    ) -> Result<usize, StoreError>;

    /// A document's text, title and source, for a document-level stage. None when the index
    /// no longer has it.
    fn document_text(&mut self, id: &str) -> Result<Option<DocumentText>, StoreError>;

    /// Record what the document-level stage of `key` made of the document (replacing any
    /// earlier output; in the keyword index when `keyword`) and mark the work done, in one
    /// transaction. False, with nothing written, when `owner` no longer holds the work (its
    /// lease expired and was taken, or the document changed).
    fn write_output(
        &mut self,
        owner: &str,
        key: &WorkKey,
        output: &str,
        keyword: bool,
    ) -> Result<bool, StoreError>;

    /// The current chunks of a document, in order. None when the index no longer has it.
    fn current_chunks(&mut self, id: &str) -> Result<Option<Vec<ChunkText>>, StoreError>;

    /// Replace the sparse vectors of the document in `key` (its current chunks' postings)
    /// with `chunks` and mark the work done, in one transaction. False, with nothing
    /// written, when `owner` no longer holds the work (its lease expired and was taken, or the
    /// document changed).
    fn write_sparse(
        &mut self,
        owner: &str,
        key: &WorkKey,
        chunks: &[ChunkSparse],
    ) -> Result<bool, StoreError>;

    /// Replace the entities or labels of the document in `key` with `annotations` (and their
    /// text for prompts, `prompt_text`) and mark the work done, in one transaction. False, with
    /// nothing written, when `owner` no longer holds the work.
    fn write_annotations(
        &mut self,
        owner: &str,
        key: &WorkKey,
        annotations: &Annotations,
        prompt_text: &str,
    ) -> Result<bool, StoreError>;

    /// Record the stage graph of the config: each stage's dependencies beyond `chunk`
    /// (replacing what an earlier config said). Work of a stage is claimed for a document only
    /// when these are done for its current version, and a dependency's new output makes it
    /// pending again.
    fn record_dependencies(&mut self, edges: &[(String, String)]) -> Result<(), StoreError>;

    /// The sparse model the index's sparse vectors come from, if it has one.
    fn sparse_model(&mut self) -> Result<Option<SparseModelRecord>, StoreError>;

    /// Record the sparse model the `sparse` stage now uses (its fingerprint makes the
    /// documents done by another one stale).
    fn record_sparse_model(&mut self, model: &SparseModelRecord) -> Result<(), StoreError>;
}

/// A boxed store is a store (`open_store` hands them out).
impl<T: LifecycleStore + ?Sized> LifecycleStore for Box<T> {
    fn claim(&mut self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        (**self).claim(req)
    }

    fn renew(&mut self, owner: &str, keys: &[WorkKey], lease: Duration) -> Result<(), StoreError> {
        (**self).renew(owner, keys, lease)
    }

    fn fail(
        &mut self,
        owner: &str,
        failures: &[(WorkKey, String)],
        settings: &StageSettings,
    ) -> Result<Vec<Status>, StoreError> {
        (**self).fail(owner, failures, settings)
    }

    fn fail_deliveries(
        &mut self,
        owner: &str,
        failures: &[DeliveryFailure],
        lease: Duration,
    ) -> Result<Vec<Status>, StoreError> {
        (**self).fail_deliveries(owner, failures, lease)
    }

    fn complete(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        (**self).complete(owner, keys)
    }

    fn release(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        (**self).release(owner, keys)
    }

    fn reap_dead_owners(&mut self) -> Result<usize, StoreError> {
        (**self).reap_dead_owners()
    }

    fn held_leases(&mut self) -> Result<Vec<HeldLease>, StoreError> {
        (**self).held_leases()
    }

    fn maintain(&mut self) -> Result<Maintenance, StoreError> {
        (**self).maintain()
    }

    fn sync_stage(
        &mut self,
        stage: &str,
        fingerprint: &str,
        priority: Priority,
    ) -> Result<u64, StoreError> {
        (**self).sync_stage(stage, fingerprint, priority)
    }
}

impl<T: EnrichStore + ?Sized> EnrichStore for Box<T> {
    fn pending_chunks(&mut self, key: &WorkKey) -> Result<Vec<PendingChunk>, StoreError> {
        (**self).pending_chunks(key)
    }

    fn vector_for(
        &mut self,
        vector_set: i64,
        key: &InputKey,
    ) -> Result<Option<Vec<f32>>, StoreError> {
        (**self).vector_for(vector_set, key)
    }

    fn write_vectors(
        &mut self,
        vector_set: i64,
        vectors: &[ChunkVector],
        documents: &[String],
    ) -> Result<usize, StoreError> {
        (**self).write_vectors(vector_set, vectors, documents)
    }

    fn document_text(&mut self, id: &str) -> Result<Option<DocumentText>, StoreError> {
        (**self).document_text(id)
    }

    fn write_output(
        &mut self,
        owner: &str,
        key: &WorkKey,
        output: &str,
        keyword: bool,
    ) -> Result<bool, StoreError> {
        (**self).write_output(owner, key, output, keyword)
    }

    fn current_chunks(&mut self, id: &str) -> Result<Option<Vec<ChunkText>>, StoreError> {
        (**self).current_chunks(id)
    }

    fn write_sparse(
        &mut self,
        owner: &str,
        key: &WorkKey,
        chunks: &[ChunkSparse],
    ) -> Result<bool, StoreError> {
        (**self).write_sparse(owner, key, chunks)
    }

    fn write_annotations(
        &mut self,
        owner: &str,
        key: &WorkKey,
        annotations: &Annotations,
        prompt_text: &str,
    ) -> Result<bool, StoreError> {
        (**self).write_annotations(owner, key, annotations, prompt_text)
    }

    fn record_dependencies(&mut self, edges: &[(String, String)]) -> Result<(), StoreError> {
        (**self).record_dependencies(edges)
    }

    fn sparse_model(&mut self) -> Result<Option<SparseModelRecord>, StoreError> {
        (**self).sparse_model()
    }

    fn record_sparse_model(&mut self, model: &SparseModelRecord) -> Result<(), StoreError> {
        (**self).record_sparse_model(model)
    }
}

#[cfg(test)]
mod tests {
    use super::{claim_with_retries, stitch, Claim, CLAIM_TRIES};

    /// Empty claims are retried a bounded number of times (the SQLite store once looped for
    /// ever); a claim with work or an idle answer ends the retries at once.
    #[test]
    fn empty_claims_are_retried_a_bounded_number_of_times() {
        let mut calls = 0;
        let got = claim_with_retries(|| {
            calls += 1;
            Ok(Claim::Items(Vec::new()))
        })
        .unwrap();
        assert_eq!(calls, CLAIM_TRIES);
        assert!(
            matches!(
                got,
                Claim::Idle {
                    paused: false,
                    next_due: Some(_)
                }
            ),
            "{got:?}"
        );

        let mut calls = 0;
        let got = claim_with_retries(|| {
            calls += 1;
            Ok(if calls < 3 {
                Claim::Items(Vec::new())
            } else {
                Claim::Idle {
                    paused: true,
                    next_due: None,
                }
            })
        })
        .unwrap();
        assert_eq!(calls, 3);
        assert!(
            matches!(
                got,
                Claim::Idle {
                    paused: true,
                    next_due: None
                }
            ),
            "{got:?}"
        );
    }

    #[test]
    fn stitched_chunks_lose_their_overlaps() {
        let doc = "One two three. Four five six. Seven.";
        let c = |a: usize, b: usize| (a, b, doc[a..b].to_string());
        // Overlapping chunks, then one after a gap.
        assert_eq!(
            stitch(&[c(0, 14), c(8, 29)]),
            "One two three. Four five six."
        );
        assert_eq!(
            stitch(&[c(0, 14), c(8, 29), c(30, 36)]),
            "One two three. Four five six.\n\nSeven."
        );
        assert_eq!(stitch(&[]), "");
    }
}
