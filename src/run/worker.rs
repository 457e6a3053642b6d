//! The CPU worker pool: each worker takes documents from the work queue, runs its own
//! pipeline, announces children (CREATE), and routes the results: chunks to the embedder,
//! everything else to the indexers, failures and drops straight to the event queue.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::document::Document;
use crate::event::Event;
use crate::queue::{push_until_stopped, Queue, Stopped, POLL};
use crate::signal::RunSignal;
use crate::stages::{Pipeline, PipelineOutput};
use crate::stats::RunStats;

/// The queues a worker writes to.
#[derive(Clone)]
pub struct Routes {
    pub index: Arc<dyn Queue<Document>>,
    /// Chunks that need a vector go here when the run embeds.
    pub embed: Option<Arc<dyn Queue<Document>>>,
    pub events: Arc<dyn Queue<Event>>,
    pub stats: Arc<RunStats>,
}

impl Routes {
    /// Send each output where it goes. CREATE events for every child go out first, before
    /// anything that could lead to its parent's terminal event, so the publisher is never
    /// told a parent is done before it has heard of its children.
    pub fn dispatch(
        &self,
        outputs: &mut Vec<PipelineOutput>,
        signal: &RunSignal,
    ) -> Result<(), Stopped> {
        for output in outputs.iter() {
            let doc = output.doc();
            if doc.is_child() {
                push_until_stopped(&self.events, Event::create(doc), signal)?;
            }
        }
        for output in outputs.drain(..) {
            match output {
                PipelineOutput::Failed { doc, stage, reason } => {
                    push_until_stopped(&self.events, Event::fail(&doc, stage, reason), signal)?;
                }
                PipelineOutput::Dropped { doc, stage } => {
                    let reason = doc.dropped.clone().unwrap_or_default();
                    push_until_stopped(&self.events, Event::drop(&doc, stage, reason), signal)?;
                }
                PipelineOutput::Done(doc) => {
                    for (stage, message) in &doc.warnings {
                        self.stats.warn(&doc.id, stage, message);
                    }
                    if doc.chunk.as_ref().is_some_and(|c| c.vector.is_some()) {
                        self.stats.chunks_reused.fetch_add(1, Ordering::Relaxed);
                    }
                    if let (Some(embed), true) = (&self.embed, needs_vector(&doc)) {
                        push_until_stopped(embed, doc, signal)?;
                    } else {
                        push_until_stopped(&self.index, doc, signal)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn needs_vector(doc: &Document) -> bool {
    doc.chunk
        .as_ref()
        .is_some_and(|c| c.vector.is_none() && !c.token_ids.is_empty())
}

/// One worker's loop; returns when the run stops.
pub fn work(
    mut pipeline: Pipeline,
    input: Arc<dyn Queue<Document>>,
    routes: Routes,
    signal: Arc<RunSignal>,
) {
    let mut outputs = Vec::new();
    while !signal.is_stopped() {
        let delivery = match input.pop(POLL) {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            Err(err) => {
                signal.abort(format!("worker: {err}"));
                return;
            }
        };
        // Tests make a worker lose chosen documents (`FAILPOINTS=worker::lose=return(bad)`:
        // ids containing `bad`), as if it died holding them: no output, no acknowledgement.
        #[cfg(feature = "failpoints")]
        {
            let lose = (|| {
                fail::fail_point!("worker::lose", |arg: Option<String>| arg
                    .is_some_and(|a| delivery.item.id.contains(&a)));
                false
            })();
            if lose {
                continue;
            }
        }
        // A redelivered document's children count as redelivered too.
        let redelivered = delivery.item.redelivered;
        pipeline.run(delivery.item, &mut outputs);
        if redelivered {
            for output in outputs.iter_mut() {
                output.doc_mut().redelivered = true;
            }
        }
        if routes.dispatch(&mut outputs, &signal).is_err() {
            return;
        }
        // Everything this document became is queued: only now is it done.
        if let Err(err) = input.ack(delivery.tag) {
            signal.abort(format!("worker: {err}"));
            return;
        }
    }
}
