//! The window's batching and de-duplication, on a fake encoder that is exact and instant.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use proptest::prelude::*;

use super::*;
use crate::document::Chunk;
use crate::embed::EmbedError;

/// Vectors computed from the ids alone; any sequence holding `POISON` fails its whole batch.
struct Fake {
    limit: usize,
    batches: Mutex<Vec<Vec<Vec<u32>>>>,
}

const POISON: u32 = 666;

/// A sequence holding it gets a NaN in its vector (a model whose output overflowed).
const OVERFLOW: u32 = 777;

fn vector_of(ids: &[u32]) -> Vec<f32> {
    if ids.contains(&OVERFLOW) {
        return vec![f32::NAN, 1.0, 0.0];
    }
    vec![
        ids.len() as f32,
        ids.iter().map(|&x| x as f32).sum(),
        ids.first().map_or(-1.0, |&x| x as f32),
    ]
}

impl Fake {
    fn new(limit: usize) -> Self {
        Fake {
            limit,
            batches: Mutex::new(Vec::new()),
        }
    }
}

impl Encoder for Fake {
    fn max_content_len(&self) -> usize {
        self.limit
    }
    fn passage_prompt_ids(&self) -> &[u32] {
        &[]
    }
    fn plan_batches(&self, lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
        crate::embed::batch::plan(lengths, budget)
    }
    fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize {
        crate::embed::batch::padded(lengths, batch)
    }
    fn embed_ids(&self, seqs: &[&[u32]], _prompt: &[u32]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.batches
            .lock()
            .unwrap()
            .push(seqs.iter().map(|s| s.to_vec()).collect());
        if seqs.iter().any(|s| s.contains(&POISON)) {
            return Err(EmbedError::Tokenizer("poisoned batch".into()));
        }
        Ok(seqs.iter().map(|s| vector_of(s)).collect())
    }
    fn content_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        Ok(text.bytes().map(u32::from).collect())
    }
}

fn run(
    fake: &Fake,
    inputs: &[(Vec<u32>, bool)],
    budget: usize,
    recent: &mut Recent,
    stats: &RunStats,
) -> Vec<Vec<Outcome>> {
    let items: Vec<WindowItem<'_>> = inputs
        .iter()
        .map(|(ids, keyed)| WindowItem {
            ids,
            key: keyed.then(|| Chunk::input_key_of(ids)),
            text: "",
        })
        .collect();
    let mut got: Vec<Vec<Outcome>> = vec![Vec::new(); inputs.len()];
    let mut sink = |i: usize, o: Outcome| {
        got[i].push(o);
        true
    };
    assert!(embed_window(
        fake, &items, budget, recent, stats, "fake", &mut sink
    ));
    got
}

fn ids_strategy() -> impl Strategy<Value = Vec<(Vec<u32>, bool)>> {
    // A small alphabet and short sequences, so that identical inputs are common.
    let ids = prop::collection::vec(prop_oneof![9 => 1u32..4, 1 => Just(POISON)], 0..12);
    prop::collection::vec((ids, prop::bool::weighted(0.8)), 0..60)
}

proptest! {
    #[test]
    fn every_chunk_gets_one_outcome_the_right_vector_and_each_input_is_embedded_once(
        inputs in ids_strategy(),
        budget in 1usize..64,
        limit in 4usize..12,
        capacity in 0usize..6,
    ) {
        let fake = Fake::new(limit);
        let stats = RunStats::default();
        let mut recent = Recent::new(capacity);
        let got = run(&fake, &inputs, budget, &mut recent, &stats);
        let batches = fake.batches.lock().unwrap().clone();
        // Exactly one outcome each.
        for (i, g) in got.iter().enumerate() {
            prop_assert_eq!(g.len(), 1, "item {} got {:?}", i, g);
        }
        // Over-long fails with the fix; a vector is always the one of the item's own ids; a
        // failure that is not over-long comes from a poisoned batch.
        let poisoned: HashSet<Vec<u32>> = batches
            .iter()
            .filter(|b| b.iter().any(|s| s.contains(&POISON)))
            .flatten()
            .cloned()
            .collect();
        for ((ids, _), g) in inputs.iter().zip(&got) {
            match &g[0] {
                Outcome::Failed(reason) if ids.len() > limit => {
                    prop_assert!(reason.contains("lower --chunk-tokens"), "{}", reason);
                }
                Outcome::Failed(reason) => {
                    prop_assert!(poisoned.contains(ids), "{:?} failed: {}", ids, reason);
                }
                Outcome::Embedded(v) | Outcome::Reused(v) => {
                    prop_assert!(ids.len() <= limit);
                    prop_assert_eq!(v, &vector_of(ids));
                }
            }
        }
        // A keyed input is computed at most once; batches stay within the budget.
        let mut computed: HashMap<Vec<u32>, usize> = HashMap::new();
        for b in &batches {
            let longest = b.iter().map(|s| s.len() + 2).max().unwrap_or(0);
            prop_assert!(b.len() == 1 || longest * b.len() <= budget, "{:?} over {}", b, budget);
            for s in b {
                *computed.entry(s.clone()).or_default() += 1;
            }
        }
        let unkeyed: HashSet<&Vec<u32>> =
            inputs.iter().filter(|(_, k)| !k).map(|(ids, _)| ids).collect();
        for (ids, keyed) in &inputs {
            if *keyed && !unkeyed.contains(ids) {
                prop_assert!(computed.get(ids).copied().unwrap_or(0) <= 1, "{:?} computed twice", ids);
            }
        }
        // The counters add up: every chunk not failed was embedded or reused.
        let done = got.iter().filter(|g| !matches!(g[0], Outcome::Failed(_))).count() as u64;
        let embedded = got.iter().filter(|g| matches!(g[0], Outcome::Embedded(_))).count() as u64;
        prop_assert_eq!(stats.reused() + embedded, done);
    }
}

#[test]
fn copies_take_the_original_even_when_nothing_is_remembered() {
    let fake = Fake::new(16);
    let stats = RunStats::default();
    let mut recent = Recent::new(0);
    let a = vec![1, 2, 3];
    let inputs = vec![(a.clone(), true), (vec![4], true), (a.clone(), true)];
    let got = run(&fake, &inputs, 1024, &mut recent, &stats);
    assert_eq!(got[0], vec![Outcome::Embedded(vector_of(&a))]);
    assert_eq!(got[2], vec![Outcome::Reused(vector_of(&a))]);
    assert_eq!(fake.batches.lock().unwrap().concat().len(), 2);
    assert_eq!(stats.chunks(), 2);
    assert_eq!(stats.reused(), 1);
}

#[test]
fn a_vector_embedded_in_one_window_is_reused_in_the_next() {
    let fake = Fake::new(16);
    let stats = RunStats::default();
    let mut recent = Recent::new(8);
    let a = vec![7, 7];
    run(&fake, &[(a.clone(), true)], 1024, &mut recent, &stats);
    let got = run(
        &fake,
        &[(a.clone(), true), (a.clone(), false)],
        1024,
        &mut recent,
        &stats,
    );
    assert_eq!(got[0], vec![Outcome::Reused(vector_of(&a))]);
    // Without a key there is nothing to match on: it is embedded.
    assert_eq!(got[1], vec![Outcome::Embedded(vector_of(&a))]);
    assert_eq!(fake.batches.lock().unwrap().len(), 2);
}

/// A vector with NaN or infinite values fails its chunk (and its copies) with the reason, and
/// is not remembered for the next window; the other chunks of its batch are embedded.
#[test]
fn a_non_finite_vector_fails_its_chunk_and_is_not_remembered() {
    let fake = Fake::new(10);
    let stats = RunStats::default();
    let mut recent = Recent::new(8);
    let inputs = vec![
        (vec![OVERFLOW, 1], true),
        (vec![1, 2], true),
        (vec![OVERFLOW, 1], true),
    ];
    let got = run(&fake, &inputs, 100, &mut recent, &stats);
    for i in [0, 2] {
        match &got[i][..] {
            [Outcome::Failed(reason)] => assert!(
                reason.contains(crate::document::NON_FINITE_VECTOR),
                "{reason}"
            ),
            other => panic!("item {i}: {other:?}"),
        }
    }
    assert_eq!(got[1], vec![Outcome::Embedded(vector_of(&[1, 2]))]);
    assert!(recent.get(&Chunk::input_key_of(&[OVERFLOW, 1])).is_none());
    assert!(recent.get(&Chunk::input_key_of(&[1, 2])).is_some());
}
