//! `ragline dlq requeue` of documents that never reached the index: a distributed run's
//! broker gave up on them after MaxDeliver deliveries, and the index keeps a copy of each
//! (`IndexStore::bury`). Their work is not a stage `enrich` can claim (it needs extraction and
//! chunking), so a requeue runs them through an ingest at once, with the settings of the run
//! that buried them, in this process or on the broker (`--queue`). A document that gets in
//! leaves the dead-letter queue; one that fails again goes back in with the new reason.

use std::collections::BTreeMap;

#[cfg(feature = "nats")]
use super::distributed;
use super::{ingest_from, lifecycle_store, JobError, PipelineConfig, Scope};
use crate::connectors::requeue::{RequeueConnector, Requeued};
use crate::connectors::Connector;
use crate::indexers::{Burial, IndexStore, StoredCopy};
use crate::lifecycle::{Status, CHUNK};
use crate::run::progress::Observer;
use crate::run::RunSummary;

/// What a requeue of buried documents did.
#[derive(Debug, Default)]
pub struct RequeueRuns {
    /// One ingest per set of run settings among the documents (usually one).
    pub summaries: Vec<RunSummary>,
    /// Documents now in the index, out of the dead-letter queue.
    pub recovered: Vec<String>,
    /// Documents that failed again: dead once more, with the new reason.
    pub failed_again: Vec<String>,
    /// Documents the index kept no copy of (dead in `chunk` for another reason).
    pub without_copy: Vec<String>,
}

/// Run the buried documents among `ids` (requeued by the caller) through an ingest into
/// `config`'s index: on the broker at `queue` when given, else in this process.
pub fn run_buried(
    config: &PipelineConfig,
    ids: &[String],
    queue: Option<&str>,
    observer: &mut dyn Observer,
) -> Result<RequeueRuns, JobError> {
    let mut store = lifecycle_store(config)?;
    let copies = store.buried(ids)?;
    let mut out = RequeueRuns {
        without_copy: ids
            .iter()
            .filter(|id| !copies.iter().any(|c| &c.document_id == *id))
            .cloned()
            .collect(),
        ..RequeueRuns::default()
    };
    // The settings each was published with; documents of one run go through one ingest.
    let mut groups: BTreeMap<Option<String>, Vec<StoredCopy>> = BTreeMap::new();
    for c in copies {
        groups.entry(c.config.clone()).or_default().push(c);
    }
    for (settings, copies) in groups {
        let run_config = settings_for(config, settings.as_deref())?;
        let summary = ingest_copies(&run_config, &copies, queue, observer)?;
        let again = sort_out(store.as_mut(), copies, &summary, &mut out)?;
        store.bury(&again)?;
        out.summaries.push(summary);
    }
    store.unbury(&out.recovered)?;
    Ok(out)
}

/// Ingest the stored `copies` with `run_config`, on the broker at `queue` when given.
fn ingest_copies(
    run_config: &PipelineConfig,
    copies: &[StoredCopy],
    queue: Option<&str>,
    observer: &mut dyn Observer,
) -> Result<RunSummary, JobError> {
    let documents: Vec<Requeued> = copies
        .iter()
        .map(|c| Requeued {
            id: c.document_id.clone(),
            payload: c.payload.clone(),
            source: c.source.clone(),
        })
        .collect();
    let connectors: Vec<Box<dyn Connector>> = vec![Box::new(RequeueConnector::new(
        documents,
        run_config.source.max_file_bytes,
    ))];
    match queue {
        #[cfg(feature = "nats")]
        Some(url) => {
            distributed::ingest_from(run_config, connectors, Scope::SomeDocuments, url, observer)
        }
        #[cfg(not(feature = "nats"))]
        Some(_) => Err(JobError::NotBuilt {
            what: "a requeue through a broker (--queue)".into(),
            feature: "nats",
        }),
        None => ingest_from(run_config, connectors, Scope::SomeDocuments, observer),
    }
}

/// After the ingest that `summary` tells of: note each copy as recovered or failed again in
/// `out`, and return the burials of those to bury again.
fn sort_out(
    store: &mut dyn IndexStore,
    copies: Vec<StoredCopy>,
    summary: &RunSummary,
    out: &mut RequeueRuns,
) -> Result<Vec<Burial>, JobError> {
    // What the index says now decides, not the run's counts: a document is out of the
    // queue only when its chunks are all there.
    let mut again = Vec::new();
    for copy in copies {
        let id = &copy.document_id;
        let chunk = store
            .document_lifecycle(id)?
            .and_then(|d| d.stages.into_iter().find(|s| s.stage == CHUNK));
        match chunk.as_ref().map(|s| s.status.as_str()) {
            Some(s) if s == Status::Done.as_str() => out.recovered.push(id.clone()),
            // Buried again already (the broker gave up on it once more).
            Some(s) if s == Status::Dead.as_str() => out.failed_again.push(id.clone()),
            _ => {
                let reason = summary
                    .failures
                    .iter()
                    .chain(&summary.dropped)
                    .find(|f| &f.id == id || f.parent_id.as_ref() == Some(id))
                    .map_or_else(
                        || "the requeue run did not index it".to_string(),
                        |f| format!("[{}] {}", f.stage, f.reason),
                    );
                out.failed_again.push(id.clone());
                again.push(Burial {
                    document_id: id.clone(),
                    stage: CHUNK.to_string(),
                    attempts: 1,
                    worker: "requeue".to_string(),
                    error: reason,
                    copy: Some(copy),
                });
            }
        }
    }
    Ok(again)
}

/// The settings a buried document's run had (`ragline.toml` form), with this command's index
/// (its URI may carry a password the stored settings never hold) and nothing pruned.
fn settings_for(
    config: &PipelineConfig,
    settings: Option<&str>,
) -> Result<PipelineConfig, JobError> {
    let mut run = match settings {
        Some(text) => {
            let stored = PipelineConfig::parse(text).map_err(|e| {
                JobError::Setup(format!(
                    "the settings stored with a dead-lettered document do not parse ({e}): \
                     run `ragline ingest` on its source again"
                ))
            })?;
            // The copy in the index names places; only this process's own are used.
            super::places::adopt(
                stored,
                config,
                super::places::Uses::ServicesOnly,
                "this requeue",
            )?
        }
        None => config.clone(),
    };
    run.index = config.index.clone();
    run.index.prune = false;
    run.run.progress = config.run.progress;
    Ok(run)
}
