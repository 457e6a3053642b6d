//! Embedding one window of chunks: the part of the embedder that decides what the model
//! computes. Chunks over the model's limit fail; a chunk whose input was embedded shortly
//! before takes the remembered vector; of identical inputs in the window only the first is
//! embedded and the others copy it; the rest are sorted by length and cut into batches by a
//! token budget. Used by the embedder pool (`pool.rs`) and by `enrich`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;

use super::encoder::Encoder;
use crate::document::InputKey;
use crate::stats::RunStats;

/// One chunk of a window: its content token ids, their input key, and its text (what an
/// encoder that embeds texts, a service, is sent).
#[derive(Clone, Copy, Debug)]
pub struct WindowItem<'a> {
    pub ids: &'a [u32],
    pub key: Option<InputKey>,
    pub text: &'a str,
}

/// What became of a chunk.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The model computed its vector.
    Embedded(Vec<f32>),
    /// It took the vector of an identical input (remembered, or embedded in this window).
    Reused(Vec<f32>),
    /// It cannot be embedded; the reason names the fix.
    Failed(String),
}

/// Embed `items`, handing each outcome to `sink` (with the item's index) as soon as it is
/// known: every item gets exactly one. `label` names the device in messages. Returns false
/// as soon as `sink` does (the caller is stopping).
pub fn embed_window<E: Encoder + ?Sized>(
    encoder: &E,
    items: &[WindowItem<'_>],
    budget: usize,
    recent: &mut Recent,
    stats: &RunStats,
    label: &str,
    sink: &mut dyn FnMut(usize, Outcome) -> bool,
) -> bool {
    let prompt = encoder.passage_prompt_ids().to_vec();
    let room = encoder.max_content_len().saturating_sub(prompt.len());
    let mut window = Window {
        encoder,
        items,
        stats,
        label,
        sink,
        todo: vec![true; items.len()],
        copies: Vec::new(),
    };
    let mut originals = Originals::new();
    window.fail_oversized(room)
        && window.reuse_known(recent)
        && window.embed_rest(&prompt, budget, recent, &mut originals)
        && window.send_copies(&originals)
}

/// The outcomes of the inputs that copies in the window take, by input key.
type Originals = HashMap<InputKey, Result<Vec<f32>, crate::http::Unanswered>>;

/// One window on its way through [`embed_window`]; each step returns false as soon as the
/// sink does.
struct Window<'w, 'a, E: ?Sized> {
    encoder: &'w E,
    items: &'w [WindowItem<'a>],
    stats: &'w RunStats,
    label: &'w str,
    sink: &'w mut dyn FnMut(usize, Outcome) -> bool,
    /// Per item: whether its outcome is still to be found.
    todo: Vec<bool>,
    /// Items that copy an identical input of the window, with its key.
    copies: Vec<(usize, InputKey)>,
}

impl<E: Encoder + ?Sized> Window<'_, '_, E> {
    /// Fail the chunks over the model's limit of `room` content tokens.
    fn fail_oversized(&mut self, room: usize) -> bool {
        // A chunk over the model's limit cannot be embedded: fail it, with the fix.
        for (i, item) in self.items.iter().enumerate() {
            let n = item.ids.len();
            if n > room {
                self.todo[i] = false;
                let reason = format!(
                    "chunk of {n} tokens exceeds the model's limit of {room}; lower \
                     --chunk-tokens (this is a chunker bug if it produced the chunk)"
                );
                if !(self.sink)(i, Outcome::Failed(reason)) {
                    return false;
                }
            }
        }
        true
    }

    /// Give remembered inputs their vector, and set aside the copies of inputs met earlier in
    /// the window.
    fn reuse_known(&mut self, recent: &mut Recent) -> bool {
        // Identical inputs are embedded once: one embedded shortly before takes the vector
        // remembered; of several in this window, the first is embedded and the others copy it.
        let mut seen: HashSet<InputKey> = HashSet::new();
        for (i, item) in self.items.iter().enumerate() {
            let Some(key) = item.key.filter(|_| self.todo[i]) else {
                continue;
            };
            if let Some(vector) = recent.get(&key) {
                self.todo[i] = false;
                self.stats.chunks_reused.fetch_add(1, Ordering::Relaxed);
                if !(self.sink)(i, Outcome::Reused(vector.to_vec())) {
                    return false;
                }
            } else if !seen.insert(key) {
                self.todo[i] = false;
                self.copies.push((i, key));
            }
        }
        true
    }

    /// Embed what is left, in the encoder's batches of at most `budget` tokens, remembering
    /// the vectors in `recent` and the outcomes the copies take in `originals`.
    fn embed_rest(
        &mut self,
        prompt: &[u32],
        budget: usize,
        recent: &mut Recent,
        originals: &mut Originals,
    ) -> bool {
        let (encoder, items) = (self.encoder, self.items);
        // What the copies take, kept here rather than in `recent`, which may forget a vector
        // before the window ends when a window holds more than its capacity.
        let copied: HashSet<InputKey> = self.copies.iter().map(|(_, k)| *k).collect();
        let lengths: Vec<usize> = items
            .iter()
            .enumerate()
            .map(|(i, it)| {
                if self.todo[i] {
                    it.ids.len() + prompt.len() + 2
                } else {
                    0
                }
            })
            .collect();
        let plans: Vec<Vec<usize>> = encoder
            .plan_batches(&lengths, budget)
            .into_iter()
            .map(|plan| {
                plan.into_iter()
                    .filter(|&i| self.todo[i])
                    .collect::<Vec<_>>()
            })
            .filter(|plan| !plan.is_empty())
            .collect();
        let (stats, label) = (self.stats, self.label);
        // Each batch's outcomes, as they come: false once the sink says stop.
        let mut settle = |plan: &[usize], outcomes: Vec<Outcome>| -> bool {
            for (&i, outcome) in plan.iter().zip(outcomes) {
                self.todo[i] = false;
                if let Some(key) = items[i].key {
                    if let Outcome::Embedded(v) = &outcome {
                        recent.insert(key, v);
                    }
                    if copied.contains(&key) {
                        originals.insert(
                            key,
                            match &outcome {
                                Outcome::Embedded(v) | Outcome::Reused(v) => Ok(v.clone()),
                                Outcome::Failed(r) => Err(crate::http::Unanswered(r.clone())),
                            },
                        );
                    }
                }
                if !(self.sink)(i, outcome) {
                    return false;
                }
            }
            true
        };
        if encoder.embeds_text() {
            for plan in &plans {
                let texts: Vec<&str> = plan.iter().map(|&i| items[i].text).collect();
                let tokens: Vec<usize> = plan.iter().map(|&i| lengths[i]).collect();
                let result = Ok(encoder.embed_texts(&texts, &tokens));
                let outcomes = outcomes(encoder, result, plan, &lengths, stats, label);
                if !settle(plan, outcomes) {
                    return false;
                }
            }
            return true;
        }
        let batches: Vec<Vec<&[u32]>> = plans
            .iter()
            .map(|plan| plan.iter().map(|&i| items[i].ids).collect())
            .collect();
        let mut going = true;
        encoder.embed_batches(&batches, prompt, &mut |b, result| {
            let plan = &plans[b];
            let result = result.map(|v| v.into_iter().map(Ok).collect::<Vec<_>>());
            going = settle(
                plan,
                outcomes(encoder, result, plan, &lengths, stats, label),
            );
            going
        });
        going
    }

    /// Give each copy the outcome of its original.
    fn send_copies(&mut self, originals: &Originals) -> bool {
        for (i, key) in std::mem::take(&mut self.copies) {
            let outcome = match originals.get(&key) {
                Some(Ok(vector)) => {
                    self.stats.chunks_reused.fetch_add(1, Ordering::Relaxed);
                    Outcome::Reused(vector.clone())
                }
                Some(Err(reason)) => Outcome::Failed(reason.0.clone()),
                None => unreachable!("every copy's original was embedded or failed: a bug"),
            };
            if !(self.sink)(i, outcome) {
                return false;
            }
        }
        true
    }
}

/// A batch's outcomes, one per item of `plan` in its order, from the encoder's `result` (a
/// vector that is not finite, or an encoder's error, fails its items with the reason); the
/// batch counted in `stats`.
fn outcomes<E: Encoder + ?Sized>(
    encoder: &E,
    result: Result<Vec<Result<Vec<f32>, crate::http::Unanswered>>, super::EmbedError>,
    plan: &[usize],
    lengths: &[usize],
    stats: &RunStats,
    label: &str,
) -> Vec<Outcome> {
    let real: usize = plan.iter().map(|&i| lengths[i]).sum();
    stats.add_batch(
        plan.len() as u64,
        real as u64,
        encoder.computed_tokens(lengths, plan) as u64,
    );
    match result {
        Ok(vectors) if vectors.len() == plan.len() => vectors
            .into_iter()
            .map(|v| match v {
                // No distance is defined for it: not stored, not remembered, not served.
                Ok(v) if v.iter().any(|x| !x.is_finite()) => Outcome::Failed(format!(
                    "embedding on {label}: {}",
                    crate::document::NON_FINITE_VECTOR
                )),
                Ok(v) => Outcome::Embedded(v),
                Err(reason) => Outcome::Failed(format!("embedding on {label} failed: {reason}")),
            })
            .collect(),
        Ok(vectors) => {
            let reason = format!(
                "embedding on {label} returned {} vectors for {} chunks; this is a bug",
                vectors.len(),
                plan.len()
            );
            vec![Outcome::Failed(reason); plan.len()]
        }
        Err(err) => {
            let reason = format!("embedding on {label} failed: {err}");
            vec![Outcome::Failed(reason); plan.len()]
        }
    }
}

/// The last vectors embedded, by input key; the oldest go first.
pub struct Recent {
    capacity: usize,
    vectors: HashMap<InputKey, Vec<f32>>,
    order: VecDeque<InputKey>,
}

impl Recent {
    pub fn new(capacity: usize) -> Self {
        Recent {
            capacity,
            vectors: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn get(&self, key: &InputKey) -> Option<&[f32]> {
        self.vectors.get(key).map(Vec::as_slice)
    }

    pub fn insert(&mut self, key: InputKey, vector: &[f32]) {
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

#[cfg(test)]
mod tests;
