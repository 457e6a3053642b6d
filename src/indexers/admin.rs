//! What operators ask of an index's lifecycle, and the outputs of document-level stages,
//! decided once for every backend: each backend implements [`AdminSql`] and [`OutputSql`] with
//! its statements alone (`indexers/sqlite/admin.rs`, `indexers/postgres/admin.rs`), the control
//! flow is here.

use super::store::{Burial, SetState, StoredCopy, VectorSet};
use super::ModelIdentity;
use crate::lifecycle::report::{AttemptError, DocumentLifecycle, StageState};
use crate::lifecycle::rules::QueueSql;
use crate::lifecycle::store::stitch;
use crate::lifecycle::{
    is_enrichable, Annotations, ChunkSparse, ChunkText, DocumentText, StoreError, WorkKey, EMBED,
    ENTITIES, LABELS, SPARSE,
};

/// The statements behind `ragline dlq show` and a run's dead letters.
pub(crate) trait AdminSql: QueueSql {
    /// (source, title) of a document in the index.
    #[allow(clippy::type_complexity)]
    fn document(
        &mut self,
        id: &str,
    ) -> Result<Option<(Option<String>, Option<String>)>, Self::Error>;

    /// The source of a document buried before it reached the index (Some(None): buried
    /// without one).
    fn buried_source(&mut self, id: &str) -> Result<Option<Option<String>>, Self::Error>;

    /// The document's current chunks.
    fn current_chunks(&mut self, id: &str) -> Result<u64, Self::Error>;

    /// Every lifecycle row of the document (errors empty), `embed` last.
    fn stage_states(&mut self, id: &str) -> Result<Vec<StageState>, Self::Error>;

    /// Every attempt's error of one row, oldest first.
    fn attempt_errors(
        &mut self,
        id: &str,
        stage: &str,
        vector_set: i64,
    ) -> Result<Vec<AttemptError>, Self::Error>;

    /// Put the document's row of `b.stage` in the dead-letter queue (created when missing)
    /// with `b.attempts`.
    fn set_buried(&mut self, b: &Burial, now: i64) -> Result<(), Self::Error>;

    /// Keep the copy a requeue runs the document from (replacing an earlier one).
    fn keep_copy(&mut self, c: &StoredCopy, now: i64) -> Result<(), Self::Error>;
}

/// A document's lifecycle: every stage with every attempt's error. None when the index has
/// no such document, neither indexed nor buried.
pub(crate) fn document_lifecycle<Q: AdminSql>(
    q: &mut Q,
    id: &str,
) -> Result<Option<DocumentLifecycle>, Q::Error> {
    let (source, title) = match q.document(id)? {
        Some(doc) => doc,
        // Dead-lettered before it reached the index: only its lifecycle rows and copy.
        None => match q.buried_source(id)? {
            Some(source) => (source, None),
            None => return Ok(None),
        },
    };
    let chunks = q.current_chunks(id)?;
    let mut stages = q.stage_states(id)?;
    for st in &mut stages {
        st.errors = q.attempt_errors(id, &st.stage, st.vector_set)?;
    }
    Ok(Some(DocumentLifecycle {
        document_id: id.to_string(),
        source,
        title,
        chunks,
        stages,
    }))
}

/// Dead-letter documents a run could not get into the index: the row, the error, the copy.
pub(crate) fn bury<Q: AdminSql>(q: &mut Q, burials: &[Burial], now: i64) -> Result<(), Q::Error> {
    for b in burials {
        q.set_buried(b, now)?;
        let key = WorkKey {
            document_id: b.document_id.clone(),
            stage: b.stage.clone(),
            vector_set: 0,
        };
        q.record_error(&key, b.attempts, &b.worker, &b.error, now)?;
        if let Some(c) = &b.copy {
            q.keep_copy(c, now)?;
        }
    }
    Ok(())
}

/// Whether a backfill to `model` may start, given every set of the index: Some(set) when
/// it is under way already (resume it), None when a new set is to be made.
pub(crate) fn backfill_start(
    all: &[VectorSet],
    model: &ModelIdentity,
) -> Result<Option<VectorSet>, StoreError> {
    if let Some(same) = all.iter().find(|s| s.fingerprint == model.fingerprint) {
        return match same.state {
            SetState::Backfill => Ok(Some(same.clone())),
            SetState::Active => Err(StoreError::Invalid(format!(
                "the index already searches with model `{}` (fingerprint {}): nothing to migrate",
                same.model, same.fingerprint
            ))),
            SetState::Retired => Err(StoreError::Invalid(format!(
                "model `{}` is a retired vector set of this index; drop it first with \
                 `ragline backfill --drop-old`",
                same.model
            ))),
        };
    }
    if let Some(other) = all.iter().find(|s| s.state == SetState::Backfill) {
        return Err(StoreError::Invalid(format!(
            "a backfill to model `{}` is under way; let it finish (ragline backfill --model {}) \
             before starting another",
            other.model, other.model
        )));
    }
    if !all.iter().any(|s| s.state == SetState::Active) {
        return Err(StoreError::Invalid(
            "the index has no vectors yet: ingest with the new model instead of migrating".into(),
        ));
    }
    Ok(None)
}

/// `stage` can be paused: workers run it.
pub(crate) fn check_pausable(stage: &str) -> Result<(), StoreError> {
    if is_enrichable(stage) {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "`{stage}` is not a stage workers run; stages that can be paused: {EMBED}, {SPARSE}, \
         {ENTITIES}, {LABELS} and the LLM stages of ragline.toml"
    )))
}

/// `stage` can be queued for every document at once: workers run it and it has no vector
/// sets.
pub(crate) fn check_queue_all(stage: &str) -> Result<(), StoreError> {
    if is_enrichable(stage) && stage != EMBED {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "`{stage}`: only stages without vector sets are queued this way"
    )))
}

/// The statements of a document-level stage's reads and writes (LLM stages).
pub(crate) trait OutputSql {
    type Error;

    /// (title, source, version) of a document.
    #[allow(clippy::type_complexity)]
    fn document_version(
        &mut self,
        id: &str,
    ) -> Result<Option<(Option<String>, Option<String>, String)>, Self::Error>;

    /// The current chunks of `version` of a document: (start byte, end byte, text), by
    /// ordinal.
    fn chunk_spans(
        &mut self,
        id: &str,
        version: &str,
    ) -> Result<Vec<(usize, usize, String)>, Self::Error>;

    /// The row of `key` if `owner` holds its lease for the document as it still is (locked
    /// where the backend locks rows).
    fn held_for_output(&mut self, owner: &str, key: &WorkKey) -> Result<Option<i64>, Self::Error>;

    /// Store the stage's output of the document (replacing the last), in the keyword index
    /// when `keyword`, and in the document's metadata under the stage's name when
    /// `metadata`. True when it differs from the last.
    fn put_output(
        &mut self,
        key: &WorkKey,
        output: &str,
        keyword: bool,
        metadata: bool,
        now: i64,
    ) -> Result<bool, Self::Error>;

    /// Every output the document-level stages made of a document: (stage, output).
    fn outputs_of(&mut self, id: &str) -> Result<Vec<(String, String)>, Self::Error>;

    /// Replace the document's entities or labels.
    fn put_annotations(
        &mut self,
        document: &str,
        annotations: &Annotations,
    ) -> Result<(), Self::Error>;

    /// The rows of the stages that depend on `stage` (the recorded graph) for a document,
    /// pending again: `stage` has a new output. Dead rows stay dead.
    fn stale_dependents(
        &mut self,
        document: &str,
        stage: &str,
        now: i64,
    ) -> Result<(), Self::Error>;

    /// Replace the recorded stage graph with `edges` (stage, dependency).
    fn put_dependencies(&mut self, edges: &[(String, String)]) -> Result<(), Self::Error>;

    /// Mark a row done (its lease dropped).
    fn set_done(&mut self, id: i64, now: i64) -> Result<(), Self::Error>;

    /// The current chunks of `version` of a document: rowid and text, by ordinal.
    fn chunk_texts(&mut self, id: &str, version: &str) -> Result<Vec<ChunkText>, Self::Error>;

    /// Replace the sparse vectors of a document's current chunks with `chunks`.
    fn put_sparse(&mut self, document: &str, chunks: &[ChunkSparse]) -> Result<(), Self::Error>;
}

/// What the sparse stage reads: the document's current chunks.
pub(crate) fn current_chunks<Q: OutputSql>(
    q: &mut Q,
    id: &str,
) -> Result<Option<Vec<ChunkText>>, Q::Error> {
    let Some((_, _, version)) = q.document_version(id)? else {
        return Ok(None);
    };
    q.chunk_texts(id, &version).map(Some)
}

/// Write the sparse vectors of the document `owner` holds and mark its work done; false,
/// with nothing written, when it holds it no longer.
pub(crate) fn write_sparse<Q: OutputSql>(
    q: &mut Q,
    owner: &str,
    key: &WorkKey,
    chunks: &[ChunkSparse],
    now: i64,
) -> Result<bool, Q::Error> {
    let Some(row) = q.held_for_output(owner, key)? else {
        return Ok(false);
    };
    q.put_sparse(&key.document_id, chunks)?;
    q.set_done(row, now)?;
    q.stale_dependents(&key.document_id, &key.stage, now)?;
    Ok(true)
}

/// Write the entities or labels of the document `owner` holds (with their text for prompts)
/// and mark its work done; its dependents are pending again when that text changed. False,
/// with nothing written, when it holds it no longer.
pub(crate) fn write_annotations<Q: OutputSql>(
    q: &mut Q,
    owner: &str,
    key: &WorkKey,
    annotations: &Annotations,
    prompt_text: &str,
    now: i64,
) -> Result<bool, Q::Error> {
    let Some(row) = q.held_for_output(owner, key)? else {
        return Ok(false);
    };
    q.put_annotations(&key.document_id, annotations)?;
    let changed = q.put_output(key, prompt_text, false, false, now)?;
    q.set_done(row, now)?;
    if changed {
        q.stale_dependents(&key.document_id, &key.stage, now)?;
    }
    Ok(true)
}

/// What a document-level stage reads: the document's text stitched from its chunks.
pub(crate) fn document_text<Q: OutputSql>(
    q: &mut Q,
    id: &str,
) -> Result<Option<DocumentText>, Q::Error> {
    let Some((title, source, version)) = q.document_version(id)? else {
        return Ok(None);
    };
    let chunks = q.chunk_spans(id, &version)?;
    Ok(Some(DocumentText {
        title,
        source,
        text: stitch(&chunks),
        outputs: q.outputs_of(id)?,
    }))
}

/// Write a stage's output and finish its work, only for the lease holder and only for the
/// document as it still is. False when the lease or the version was lost.
pub(crate) fn write_output<Q: OutputSql>(
    q: &mut Q,
    owner: &str,
    key: &WorkKey,
    output: &str,
    keyword: bool,
    now: i64,
) -> Result<bool, Q::Error> {
    let Some(row) = q.held_for_output(owner, key)? else {
        return Ok(false);
    };
    let changed = q.put_output(key, output, keyword, true, now)?;
    q.set_done(row, now)?;
    if changed {
        q.stale_dependents(&key.document_id, &key.stage, now)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(id: i64, fingerprint: &str, state: SetState) -> VectorSet {
        VectorSet {
            id,
            model: format!("m{id}"),
            model_dir: String::new(),
            fingerprint: fingerprint.into(),
            tokenizer: None,
            dimension: 4,
            vec_table: format!("vec_{id}"),
            state,
            watermark: None,
            backfill_done: false,
        }
    }

    fn model(fingerprint: &str) -> ModelIdentity {
        ModelIdentity {
            name: "new".into(),
            dir: String::new(),
            fingerprint: fingerprint.into(),
            dimension: 4,
            tokenizer: None,
        }
    }

    #[test]
    fn a_backfill_starts_once_beside_an_active_set() {
        let active = set(1, "a", SetState::Active);
        assert_eq!(
            backfill_start(std::slice::from_ref(&active), &model("b")).unwrap(),
            None
        );
        let filling = set(2, "b", SetState::Backfill);
        let both = [active.clone(), filling.clone()];
        assert_eq!(backfill_start(&both, &model("b")).unwrap(), Some(filling));
        let refused = |all: &[VectorSet], m: &str| match backfill_start(all, &model(m)) {
            Err(StoreError::Invalid(why)) => why,
            other => panic!("{m}: {other:?}"),
        };
        assert!(refused(&both, "a").contains("already searches"));
        assert!(refused(&both, "c").contains("under way"));
        assert!(refused(&[set(3, "c", SetState::Retired), active], "c").contains("retired"));
        assert!(refused(&[], "a").contains("no vectors yet"));
    }

    #[test]
    fn only_worker_stages_are_paused_or_queued_whole() {
        assert!(check_pausable(EMBED).is_ok());
        assert!(check_pausable("chunk").is_err());
        assert!(check_queue_all(EMBED).is_err());
        assert!(check_queue_all("chunk").is_err());
        assert!(check_queue_all("summary").is_ok());
    }
}
