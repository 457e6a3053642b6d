//! The embedder pool: one thread per device, each owning its model. Chunks from many
//! documents are gathered from the embed queue, sorted by length and cut into batches by a
//! token budget; a short maximum wait lets a trickle of chunks still flow.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::model::EmbeddingModel;
use crate::document::{Document, InputKey};
use crate::event::Event;
use crate::queue::{push_until_stopped, Delivery, Queue, POLL};
use crate::run::signal::RunSignal;
use crate::run::stats::RunStats;

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

/// One embedder: a model on a device.
pub struct Embedder {
    pub model: EmbeddingModel,
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

impl Embedder {
    /// Runs until the run stops.
    pub fn run(
        self,
        input: Arc<dyn Queue<Document>>,
        output: Arc<dyn Queue<Document>>,
        events: Arc<dyn Queue<Event>>,
        signal: Arc<RunSignal>,
        stats: Arc<RunStats>,
    ) {
        let window_tokens = self.policy.batch_tokens * WINDOW_BATCHES;
        let mut recent = Recent::new(RECENT_VECTORS);
        let limit = self.model.tokenizer.max_content_len();
        let prompt = self.model.tokenizer.passage_prompt_ids().to_vec();
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
                match input.pop(wait) {
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
            if !self.embed_window(
                &mut window,
                &mut recent,
                &prompt,
                limit,
                &output,
                &events,
                &signal,
                &stats,
                &input,
            ) {
                return;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn embed_window(
        &self,
        window: &mut Vec<Delivery<Document>>,
        recent: &mut Recent,
        prompt: &[u32],
        limit: usize,
        output: &Arc<dyn Queue<Document>>,
        events: &Arc<dyn Queue<Event>>,
        signal: &RunSignal,
        stats: &RunStats,
        input: &Arc<dyn Queue<Document>>,
    ) -> bool {
        let mut items: Vec<Option<Delivery<Document>>> = window.drain(..).map(Some).collect();
        // A chunk over the model's limit cannot be embedded: fail it, with the fix.
        let room = limit.saturating_sub(prompt.len());
        for slot in items.iter_mut() {
            let n = slot.as_ref().map_or(0, |d| token_len(&d.item));
            if n > room {
                let d = slot.take().expect("just checked");
                let reason = format!(
                    "chunk of {n} tokens exceeds the model's limit of {room}; lower \
                     --chunk-tokens (this is a chunker bug if it produced the chunk)"
                );
                if !self.finish(d, Err(reason), output, events, signal, input) {
                    return false;
                }
            }
        }
        // Identical inputs are embedded once: one embedded shortly before takes the vector
        // remembered; of several in this window, the first is embedded and the others copy it.
        let mut seen: HashSet<InputKey> = HashSet::new();
        let mut copies: Vec<(Delivery<Document>, InputKey)> = Vec::new();
        for slot in items.iter_mut() {
            let Some(key) = slot.as_ref().and_then(|d| input_key(&d.item)) else {
                continue;
            };
            if let Some(vector) = recent.get(&key) {
                let mut d = slot.take().expect("just checked");
                set_vector(&mut d.item, vector.to_vec());
                stats.chunks_reused.fetch_add(1, Ordering::Relaxed);
                if !self.finish(d, Ok(()), output, events, signal, input) {
                    return false;
                }
            } else if !seen.insert(key) {
                copies.push((slot.take().expect("just checked"), key));
            }
        }
        // What the copies take, kept here rather than in `recent`, which may forget a vector
        // before the window ends when a window holds more than its capacity.
        let copied: HashSet<InputKey> = copies.iter().map(|(_, k)| *k).collect();
        let mut originals: HashMap<InputKey, Result<Vec<f32>, String>> = HashMap::new();
        let lengths: Vec<usize> = items
            .iter()
            .map(|d| {
                d.as_ref()
                    .map_or(0, |d| token_len(&d.item) + prompt.len() + 2)
            })
            .collect();
        for plan in self.model.plan_batches(&lengths, self.policy.batch_tokens) {
            let plan: Vec<usize> = plan.into_iter().filter(|&i| items[i].is_some()).collect();
            if plan.is_empty() {
                continue;
            }
            let seqs: Vec<&[u32]> = plan
                .iter()
                .map(|&i| token_ids(&items[i].as_ref().expect("filtered").item))
                .collect();
            let result = self.model.embed_ids(&seqs, prompt);
            let real: usize = plan.iter().map(|&i| lengths[i]).sum();
            stats.add_batch(
                plan.len() as u64,
                real as u64,
                self.model.computed_tokens(&lengths, &plan) as u64,
            );
            match result {
                Ok(vectors) => {
                    for (&i, vector) in plan.iter().zip(vectors) {
                        let mut d = items[i].take().expect("filtered");
                        if let Some(key) = input_key(&d.item) {
                            recent.insert(key, &vector);
                            if copied.contains(&key) {
                                originals.insert(key, Ok(vector.clone()));
                            }
                        }
                        set_vector(&mut d.item, vector);
                        if !self.finish(d, Ok(()), output, events, signal, input) {
                            return false;
                        }
                    }
                }
                Err(err) => {
                    let reason = format!("embedding on {} failed: {err}", self.label);
                    for &i in &plan {
                        let d = items[i].take().expect("filtered");
                        if let Some(key) = input_key(&d.item).filter(|k| copied.contains(k)) {
                            originals.insert(key, Err(reason.clone()));
                        }
                        if !self.finish(d, Err(reason.clone()), output, events, signal, input) {
                            return false;
                        }
                    }
                }
            }
        }
        for (mut d, key) in copies {
            let result = match originals.get(&key) {
                Some(Ok(vector)) => {
                    set_vector(&mut d.item, vector.clone());
                    stats.chunks_reused.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Some(Err(reason)) => Err(reason.clone()),
                None => unreachable!("every copy's original was embedded or failed: a bug"),
            };
            if !self.finish(d, result, output, events, signal, input) {
                return false;
            }
        }
        true
    }

    /// Pass an embedded chunk on (or fail it), then acknowledge it.
    fn finish(
        &self,
        d: Delivery<Document>,
        result: Result<(), String>,
        output: &Arc<dyn Queue<Document>>,
        events: &Arc<dyn Queue<Event>>,
        signal: &RunSignal,
        input: &Arc<dyn Queue<Document>>,
    ) -> bool {
        let tag = d.tag;
        let pushed = match result {
            Ok(()) => push_until_stopped(output, d.item, signal),
            Err(reason) => {
                push_until_stopped(events, Event::fail(&d.item, "embed", reason), signal)
            }
        };
        if pushed.is_err() {
            return false;
        }
        if let Err(err) = input.ack(tag) {
            signal.abort(format!("embedder {}: {err}", self.label));
            return false;
        }
        true
    }
}

fn input_key(doc: &Document) -> Option<InputKey> {
    doc.chunk.as_ref().and_then(|c| c.input_key)
}

fn set_vector(doc: &mut Document, vector: Vec<f32>) {
    if let Some(chunk) = doc.chunk.as_mut() {
        chunk.vector = Some(vector);
        chunk.token_ids = Vec::new();
    }
}

/// The last vectors embedded, by input key; the oldest go first.
struct Recent {
    capacity: usize,
    vectors: HashMap<InputKey, Vec<f32>>,
    order: VecDeque<InputKey>,
}

impl Recent {
    fn new(capacity: usize) -> Self {
        Recent {
            capacity,
            vectors: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn get(&self, key: &InputKey) -> Option<&[f32]> {
        self.vectors.get(key).map(Vec::as_slice)
    }

    fn insert(&mut self, key: InputKey, vector: &[f32]) {
        if self.capacity == 0 || self.vectors.contains_key(&key) {
            return;
        }
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.vectors.remove(&old);
            }
        }
        self.order.push_back(key);
        self.vectors.insert(key, vector.to_vec());
    }
}

fn token_ids(doc: &Document) -> &[u32] {
    doc.chunk.as_ref().map_or(&[], |c| c.token_ids.as_slice())
}

fn token_len(doc: &Document) -> usize {
    token_ids(doc).len()
}
