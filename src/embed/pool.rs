//! The embedder pool: one thread per device, each owning its encoder. Chunks from many
//! documents are gathered from the embed queue into a window, which [`window::embed_window`]
//! sorts by length and cuts into batches by a token budget; a short maximum wait lets a
//! trickle of chunks still flow.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::encoder::Encoder;
use super::window::{self, Outcome, Recent, WindowItem};
use crate::document::Document;
use crate::event::Event;
use crate::queue::{push_until_stopped, Delivery, Queue, POLL};
use crate::signal::RunSignal;
use crate::stats::RunStats;

/// Padded tokens per forward pass, at most (`--batch-tokens`). 2,048 measured best on a
/// 2-core CPU (PERF-NOTES); GPUs want far more.
pub const DEFAULT_BATCH_TOKENS_CPU: usize = 2048;
pub const DEFAULT_BATCH_TOKENS_GPU: usize = 32768;
/// How long the first chunk of a batch may wait for company.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(50);
/// Batches gathered before sorting: a wider window sorts better and pads less.
pub const WINDOW_BATCHES: usize = 4;
/// Vectors an embedder remembers by input key, so a chunk identical to one embedded shortly
/// before (the same code sample or boilerplate repeated in a page, or across pages) is not
/// embedded again: 6 MB at 384 dimensions. On react-docs 10% of the chunks repeat another.
pub const RECENT_VECTORS: usize = 4096;

#[derive(Clone, Debug)]
pub struct BatchPolicy {
    pub batch_tokens: usize,
    pub max_wait: Duration,
}

/// One embedder: an encoder on a device.
pub struct Embedder {
    pub encoder: Box<dyn Encoder>,
    pub label: String,
    pub policy: BatchPolicy,
}

/// The embedders of a run, one per device.
pub struct EmbedderPool {
    embedders: Vec<Embedder>,
}

impl EmbedderPool {
    pub fn new(embedders: Vec<Embedder>) -> Self {
        EmbedderPool { embedders }
    }

    pub fn embedders(&self) -> &[Embedder] {
        &self.embedders
    }

    pub fn into_embedders(self) -> Vec<Embedder> {
        self.embedders
    }
}

/// The queues an embedder thread reads and writes.
pub struct EmbedQueues {
    pub input: Arc<dyn Queue<Document>>,
    /// Embedded chunks go on to the indexers.
    pub output: Arc<dyn Queue<Document>>,
    /// Chunks that cannot be embedded end here (FAIL).
    pub events: Arc<dyn Queue<Event>>,
}

impl Embedder {
    /// Runs until the run stops.
    pub fn run(self, queues: EmbedQueues, signal: Arc<RunSignal>, stats: Arc<RunStats>) {
        let window_tokens = self.policy.batch_tokens * WINDOW_BATCHES;
        let mut recent = Recent::new(RECENT_VECTORS);
        let mut window: Vec<Delivery<Document>> = Vec::new();
        while !signal.is_stopped() {
            // Gather: until the window is full, or the first chunk has waited max_wait.
            let mut tokens = 0usize;
            let mut deadline: Option<Instant> = None;
            while tokens < window_tokens && !signal.is_stopped() {
                let wait = match deadline {
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        left.min(POLL)
                    }
                    None => POLL,
                };
                match queues.input.pop(wait) {
                    Ok(Some(d)) => {
                        tokens += token_len(&d.item) + 2;
                        window.push(d);
                        deadline.get_or_insert_with(|| Instant::now() + self.policy.max_wait);
                    }
                    Ok(None) if deadline.is_none() => continue,
                    Ok(None) => {}
                    Err(err) => {
                        signal.abort(format!("embedder {}: {err}", self.label));
                        return;
                    }
                }
            }
            if window.is_empty() {
                continue;
            }
            if !self.embed(&mut window, &mut recent, &queues, &signal, &stats) {
                return;
            }
        }
    }

    /// Embed a window and pass every chunk on (or fail it), acknowledging each after.
    fn embed(
        &self,
        window: &mut Vec<Delivery<Document>>,
        recent: &mut Recent,
        queues: &EmbedQueues,
        signal: &RunSignal,
        stats: &RunStats,
    ) -> bool {
        let mut slots: Vec<Option<Delivery<Document>>> = window.drain(..).map(Some).collect();
        let ids: Vec<Vec<u32>> = slots
            .iter_mut()
            .map(|d| {
                d.as_mut()
                    .and_then(|d| d.item.chunk.as_mut())
                    .map_or_else(Vec::new, |c| std::mem::take(&mut c.token_ids))
            })
            .collect();
        // The texts, for an encoder that sends them to a service (the chunks keep theirs).
        let texts: Vec<String> = if self.encoder.embeds_text() {
            slots
                .iter()
                .map(|d| {
                    d.as_ref()
                        .map_or_else(String::new, |d| d.item.fields.text.clone())
                })
                .collect()
        } else {
            vec![String::new(); slots.len()]
        };
        let items: Vec<WindowItem<'_>> = slots
            .iter()
            .zip(&ids)
            .zip(&texts)
            .map(|((d, ids), text)| WindowItem {
                ids,
                key: d
                    .as_ref()
                    .and_then(|d| d.item.chunk.as_ref())
                    .and_then(|c| c.input_key),
                text,
            })
            .collect();
        let mut sink = |i: usize, outcome: Outcome| -> bool {
            let d = slots[i].take().expect("one outcome per chunk");
            self.finish(d, outcome, queues, signal)
        };
        window::embed_window(
            self.encoder.as_ref(),
            &items,
            self.policy.batch_tokens,
            recent,
            stats,
            &self.label,
            &mut sink,
        )
    }

    /// Pass an embedded chunk on (or fail it), then acknowledge it.
    fn finish(
        &self,
        mut d: Delivery<Document>,
        outcome: Outcome,
        queues: &EmbedQueues,
        signal: &RunSignal,
    ) -> bool {
        let tag = d.tag;
        let embedded = matches!(outcome, Outcome::Embedded(_));
        let pushed = match outcome {
            Outcome::Embedded(vector) | Outcome::Reused(vector) => {
                if let Some(chunk) = d.item.chunk.as_mut() {
                    chunk.vector = Some(vector);
                    if embedded {
                        // With [CLS] and [SEP], as the embedder's own count.
                        d.item.embedded_tokens = chunk.token_count + 2;
                    }
                }
                push_until_stopped(&queues.output, d.item, signal)
            }
            Outcome::Failed(reason) => push_until_stopped(
                &queues.events,
                Event::fail(&d.item, "embed", reason),
                signal,
            ),
        };
        if pushed.is_err() {
            return false;
        }
        if let Err(err) = queues.input.ack(tag) {
            signal.abort(format!("embedder {}: {err}", self.label));
            return false;
        }
        true
    }
}

fn token_len(doc: &Document) -> usize {
    doc.chunk.as_ref().map_or(0, |c| c.token_ids.len())
}
