//! The embed stage of `enrich`: a claimed batch of documents has its chunks without a vector
//! (in the claimed vector set) loaded, embedded as one window (length-sorted batches by a
//! token budget, identical inputs once), and the vectors written as they come, a few hundred
//! per transaction; a document is marked done in the transaction that writes its last vector.
//! A killed worker therefore loses at most one commit's worth of work.
//!
//! The chunker's token ids stored by a deferred ingest are reused when the set's model
//! tokenizes the same way (never tokenize twice); otherwise (a backfill to a model with
//! another tokenizer) the chunk text is tokenized with the set's model, and cut at its
//! limit if that is shorter.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{EnrichWorker, SetModel, Shared};
use crate::document::{Chunk, InputKey};
use crate::embed::pool::RECENT_VECTORS;
use crate::embed::window::{embed_window, Outcome, Recent, WindowItem};
use crate::lifecycle::{
    ChunkVector, EnrichStore, Owner, PendingChunk, StoreError, WorkItem, WorkKey,
};

/// Vectors written per transaction, at least (fewer at the end of a claim).
const COMMIT_CHUNKS: usize = 256;
/// A commit at least this often while a long claim runs: a killed worker loses at most this
/// much work (and one model batch).
const COMMIT_EVERY: Duration = Duration::from_secs(1);

/// One claimed document while its chunks are embedded.
struct DocState {
    key: WorkKey,
    /// Chunks without an outcome yet.
    left: usize,
    failure: Option<String>,
    /// Every chunk has its outcome.
    finished: bool,
    /// Its result is recorded in the store.
    reported: bool,
}

/// Embed the chunks of `items` (all of one vector set) and record the results.
pub(super) fn process<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    models: &mut HashMap<i64, (SetModel, Recent)>,
    owner: &Owner,
    items: Vec<WorkItem>,
    shared: &Shared<'_>,
) -> Result<(), StoreError> {
    let set = items[0].key.vector_set;
    load_set_model(w, models, owner, &items)?;
    let (model, recent) = models.get_mut(&set).expect("loaded above");
    let Gathered {
        mut docs,
        rows,
        ids,
        keys,
        outcomes,
    } = gather(w, model, &items, shared)?;
    let mut committer = Committer {
        set,
        owner,
        pending: Vec::new(),
        failed_chunks: 0,
        last_commit: Instant::now(),
        last_renew: Instant::now(),
    };
    // Outcomes known before the model runs (stored vectors, tokenizer errors).
    let mut decided = vec![false; rows.len()];
    for (i, outcome) in outcomes {
        decided[i] = true;
        committer.record(i, outcome, &rows, &mut docs);
    }
    // Documents with nothing to embed are finished now.
    for d in docs.iter_mut() {
        if d.left == 0 {
            d.finished = true;
        }
    }
    let window: Vec<WindowItem<'_>> = ids
        .iter()
        .zip(&keys)
        .zip(&decided)
        .zip(&rows)
        .filter(|((_, decided), _)| !**decided)
        .map(|(((ids, key), _), (_, chunk))| WindowItem {
            ids,
            key: *key,
            text: chunk.text.as_str(),
        })
        .collect();
    let index_of: Vec<usize> = (0..rows.len()).filter(|&i| !decided[i]).collect();
    let mut error: Option<StoreError> = None;
    {
        let store = &mut w.store;
        let mut sink = |i: usize, outcome: Outcome| -> bool {
            committer.record(index_of[i], outcome, &rows, &mut docs);
            match committer.keep_up(store, &mut docs, shared) {
                Ok(()) => true,
                Err(e) => {
                    error = Some(e);
                    false
                }
            }
        };
        embed_window(
            model.encoder.as_ref(),
            &window,
            model.batch_tokens,
            recent,
            shared.stats,
            &model.label,
            &mut sink,
        );
    }
    if let Some(e) = error {
        return Err(e);
    }
    committer.commit(&mut w.store, &mut docs, shared)
}

/// Load the model of the items' vector set once per worker. Without its model no document
/// of the set can be embedded, and that is not the documents' fault: the work is given back
/// uncounted and the worker stops, saying why.
fn load_set_model<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    models: &mut HashMap<i64, (SetModel, Recent)>,
    owner: &Owner,
    items: &[WorkItem],
) -> Result<(), StoreError> {
    let set = items[0].key.vector_set;
    let std::collections::hash_map::Entry::Vacant(slot) = models.entry(set) else {
        return Ok(());
    };
    match (w.loader)(set) {
        Ok(model) => {
            slot.insert((model, Recent::new(RECENT_VECTORS)));
            Ok(())
        }
        Err(reason) => {
            let keys: Vec<WorkKey> = items.iter().map(|i| i.key.clone()).collect();
            w.store.release(owner.as_str(), &keys)?;
            Err(StoreError::Invalid(reason.0))
        }
    }
}

/// The chunks of a claim, ready for the window: per chunk its document, ids and input key,
/// and the outcomes known before the model runs.
struct Gathered {
    docs: Vec<DocState>,
    /// (index in `docs`, chunk).
    rows: Vec<(usize, PendingChunk)>,
    ids: Vec<Vec<u32>>,
    keys: Vec<Option<InputKey>>,
    /// Stored vectors of identical inputs, tokenizer errors: (index in `rows`, outcome).
    outcomes: Vec<(usize, Outcome)>,
}

/// Read the chunks of each claimed document that lack a vector in the set: their stored
/// token ids (or the text tokenized with the set's model, cut at its limit), and a vector
/// the set already holds for an identical input.
fn gather<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    model: &SetModel,
    items: &[WorkItem],
    shared: &Shared<'_>,
) -> Result<Gathered, StoreError> {
    let set = items[0].key.vector_set;
    let mut g = Gathered {
        docs: Vec::with_capacity(items.len()),
        rows: Vec::new(),
        ids: Vec::new(),
        keys: Vec::new(),
        outcomes: Vec::new(),
    };
    let room = model
        .encoder
        .max_content_len()
        .saturating_sub(model.encoder.passage_prompt_ids().len());
    let mut truncated = 0u64;
    for item in items {
        let chunks = w.store.pending_chunks(&item.key)?;
        let d = g.docs.len();
        let failure = injected_failure(&chunks);
        g.docs.push(DocState {
            key: item.key.clone(),
            left: if failure.is_some() { 0 } else { chunks.len() },
            finished: failure.is_some(),
            failure,
            reported: false,
        });
        if g.docs[d].finished {
            continue;
        }
        for mut chunk in chunks {
            let (chunk_ids, key) = match chunk_input(model, &mut chunk, room, &mut truncated) {
                Ok(input) => input,
                Err(failed) => {
                    g.outcomes.push((g.rows.len(), failed));
                    g.rows.push((d, chunk));
                    g.ids.push(Vec::new());
                    g.keys.push(None);
                    continue;
                }
            };
            if let Some(k) = &key {
                if let Some(v) = w.store.vector_for(set, k)? {
                    shared
                        .stats
                        .chunks_reused
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    g.outcomes.push((g.rows.len(), Outcome::Reused(v)));
                }
            }
            g.rows.push((d, chunk));
            g.ids.push(chunk_ids);
            g.keys.push(key);
        }
    }
    let mut t = shared.tally();
    if truncated > 0 {
        t.truncated += truncated;
        let note = format!(
            "{} chunks, tokenized again for vector set {set}, came out longer than its model's \
             limit and were cut to {room} tokens",
            t.truncated
        );
        t.notes
            .retain(|n| !n.contains("tokenized again for vector set"));
        t.notes.push(note);
    }
    t.counts.children_created += g.rows.len() as u64;
    Ok(g)
}

/// A chunk's token ids and input key for the set's model: the stored ids, or its text
/// tokenized (a tokenizer error is the chunk's failed outcome); ids over the model's `room`
/// are cut, counted in `truncated`, and keyed anew.
fn chunk_input(
    model: &SetModel,
    chunk: &mut PendingChunk,
    room: usize,
    truncated: &mut u64,
) -> Result<(Vec<u32>, Option<InputKey>), Outcome> {
    let (mut chunk_ids, key) = match chunk.token_ids.take() {
        Some(stored) => (stored, chunk.input_key),
        None => match model.encoder.content_ids(&chunk.text) {
            Ok(fresh) => {
                let key = Chunk::input_key_of(&fresh);
                (fresh, Some(key))
            }
            Err(e) => return Err(Outcome::Failed(format!("tokenizer: {e}"))),
        },
    };
    let key = if chunk_ids.len() > room {
        // A chunk cut for a model with a longer limit than this one's.
        chunk_ids.truncate(room);
        *truncated += 1;
        Some(Chunk::input_key_of(&chunk_ids))
    } else {
        key
    };
    Ok((chunk_ids, key))
}

/// The batch of results not yet written.
struct Committer<'a> {
    set: i64,
    owner: &'a Owner,
    pending: Vec<ChunkVector>,
    /// Chunks that could not be embedded since the last commit.
    failed_chunks: u64,
    last_commit: Instant,
    last_renew: Instant,
}

impl Committer<'_> {
    fn record(
        &mut self,
        row: usize,
        outcome: Outcome,
        rows: &[(usize, PendingChunk)],
        docs: &mut [DocState],
    ) {
        let (d, chunk) = &rows[row];
        match outcome {
            Outcome::Embedded(vector) | Outcome::Reused(vector) => self.pending.push(ChunkVector {
                rowid: chunk.rowid,
                guard: chunk.input_key,
                vector,
            }),
            Outcome::Failed(reason) => {
                self.failed_chunks += 1;
                let doc = &mut docs[*d];
                doc.failure
                    .get_or_insert(format!("chunk {}: {reason}", chunk.chunk_id));
            }
        }
        let doc = &mut docs[*d];
        doc.left -= 1;
        if doc.left == 0 {
            doc.finished = true;
        }
    }

    /// While the window runs: commit every [`COMMIT_CHUNKS`] vectors or [`COMMIT_EVERY`], and
    /// renew the leases of the documents not yet reported a third of the way into them.
    fn keep_up<S: EnrichStore>(
        &mut self,
        store: &mut S,
        docs: &mut [DocState],
        shared: &Shared<'_>,
    ) -> Result<(), StoreError> {
        #[allow(unused_mut)]
        let mut due =
            self.pending.len() >= COMMIT_CHUNKS || self.last_commit.elapsed() >= COMMIT_EVERY;
        // Tests commit after every batch (`FAILPOINTS=enrich::commit-each=return`), so that
        // `enrich::done` holds a run after a known point whatever the machine's speed.
        #[cfg(feature = "failpoints")]
        if fail::eval("enrich::commit-each", |_| ()).is_some() {
            due = true;
        }
        if due {
            self.commit(store, docs, shared)?;
        }
        let lease = shared.options.settings.visibility_timeout;
        if self.last_renew.elapsed() >= lease / 3 {
            self.last_renew = Instant::now();
            let held: Vec<WorkKey> = docs
                .iter()
                .filter(|d| !d.reported)
                .map(|d| d.key.clone())
                .collect();
            store.renew(self.owner.as_str(), &held, lease)?;
        }
        Ok(())
    }

    /// Write the vectors so far; documents whose every chunk is through are marked done (in
    /// the same transaction) or failed.
    fn commit<S: EnrichStore>(
        &mut self,
        store: &mut S,
        docs: &mut [DocState],
        shared: &Shared<'_>,
    ) -> Result<(), StoreError> {
        let mut done: Vec<String> = Vec::new();
        let mut failed: Vec<(WorkKey, String)> = Vec::new();
        for d in docs.iter_mut().filter(|d| d.finished && !d.reported) {
            match d.failure.take() {
                Some(reason) => failed.push((d.key.clone(), reason)),
                None => done.push(d.key.document_id.clone()),
            }
            d.reported = true;
        }
        let vectors = std::mem::take(&mut self.pending);
        #[cfg(feature = "failpoints")]
        fail::fail_point!("enrich::commit");
        let written = store.write_vectors(self.set, &vectors, &done)?;
        // Tests hold a run here once a commit has finished documents
        // (`FAILPOINTS=enrich::done=sleep(600000)`), to kill it part way on any machine.
        #[cfg(feature = "failpoints")]
        if !done.is_empty() {
            fail::fail_point!("enrich::done");
        }
        let statuses = if failed.is_empty() {
            Vec::new()
        } else {
            store.fail(self.owner.as_str(), &failed, &shared.options.settings)?
        };
        self.last_commit = Instant::now();
        let mut t = shared.tally();
        t.counts.children_indexed += written as u64;
        t.counts.children_failed += std::mem::take(&mut self.failed_chunks);
        for key in docs
            .iter()
            .filter(|d| done.contains(&d.key.document_id))
            .map(|d| &d.key)
        {
            t.done(key);
        }
        for ((key, reason), status) in failed.iter().zip(statuses) {
            t.failed(key, reason, status);
        }
        Ok(())
    }
}

/// Fault injection for tests (feature `failpoints`, compiled out otherwise): with
/// `FAILPOINTS='embed::document=return(MARKER)'`, a document any of whose pending chunks
/// contains MARKER fails its embedding, every attempt, until its text changes or the
/// failpoint is removed.
#[cfg(feature = "failpoints")]
fn injected_failure(chunks: &[crate::lifecycle::PendingChunk]) -> Option<String> {
    fail::fail_point!("embed::document", |marker: Option<String>| {
        let marker = marker.unwrap_or_default();
        chunks
            .iter()
            .any(|c| !marker.is_empty() && c.text.contains(&marker))
            .then(|| {
                format!("injected failure: the text holds `{marker}` (failpoint embed::document)")
            })
    });
    None
}

#[cfg(not(feature = "failpoints"))]
fn injected_failure(_chunks: &[crate::lifecycle::PendingChunk]) -> Option<String> {
    None
}
