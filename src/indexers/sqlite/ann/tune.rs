//! A recall target instead of a magic ef (`index.ann_recall`, 0.95 by default): the recall an
//! HNSW graph reaches at a given ef depends on the corpus (near-duplicate paragraphs need far
//! more than varied ones), so after a build, and again each time the set doubles, the search's
//! ef is measured rather than assumed. A sample of the stored vectors (about [`SAMPLE`], chosen
//! by a hash of their keys) is held out of the graph until it is measured, then added, and
//! each is moved away from itself by Gaussian noise to a cosine of about 0.55 (a question is
//! about that far from the passage that answers it with sentence-embedding models; a stored
//! vector itself, with near-duplicates beside it, flatters any ef: on 1M MDN-like vectors,
//! held-out chunks reached recall@10 0.97 at ef 24 where queries got 0.80). Those are the
//! queries; their exact 10 nearest among the vectors in the graph come from a scan of the
//! vectors file on every core; the graph is searched at growing ef, re-scored as a real search
//! is, until recall@10 reaches the target; the ef kept is one rung above that (x1.5),
//! headroom for queries the sample did not see (its recall has a standard error of ~1%). The ef found and the recall measured are kept in `meta`
//! (`ann_tuned.<set>`); readers search with it; `search --ef` and `RAGLINE_ANN_EF` override it.

use std::collections::BinaryHeap;

use rayon::prelude::*;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use usearch::Index;

use super::vectors::{Vectors, VectorsError};
use super::{file_error, graph, rescored, AnnDtype, AnnError};
use crate::distance::Cosine;

/// Stored vectors held out as queries, about.
pub const SAMPLE: usize = 200;
/// Fewer held-out vectors than this measure nothing (a tiny set, a small update).
pub const MIN_SAMPLE: usize = 20;
/// The ef values tried, smallest first.
const LADDER: &[usize] = &[
    16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
];
/// Neighbours a recall is measured over.
const K: usize = 10;
/// The noise that moves a held-out vector away from itself, relative to a unit vector's spread
/// per dimension: cosine 1/sqrt(1 + 1.5^2) = 0.55 to where it came from. (At 1.0, cosine
/// 0.71, 100k MDN-like vectors measured 0.96 at ef 24 where queries got 0.94; at 1.5, ef 64
/// and 0.985; at 2.0, ef 128 and 0.997: BENCHMARKS.md.)
const QUERY_NOISE: f32 = 1.5;

/// A held-out vector made a query: unit length, plus [`QUERY_NOISE`] (seeded by its key).
fn query_from(key: u64, v: &[f32]) -> Vec<f32> {
    let mut state = key ^ 0xD1B5_4A32_D192_ED03;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let scale = QUERY_NOISE / (v.len().max(1) as f32).sqrt();
    let u = super::unit(v);
    u.iter()
        .map(|x| {
            // Box-Muller.
            let (a, b) = (next().max(1e-12), next());
            let g = (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos();
            x + scale * g as f32
        })
        .collect()
}

/// What a measurement found: the smallest ef that reached the target (or the largest tried),
/// and the recall@10 measured there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuned {
    pub ef: usize,
    pub recall: f64,
    pub target: f64,
    /// Vectors in the graph when it was measured.
    pub size: u64,
    pub queries: usize,
    /// Whether the target was reached (false: `ef` is the largest tried).
    pub reached: bool,
}

fn key(set: i64) -> String {
    format!("ann_tuned.{set}")
}

/// The measurement kept for `set`, if any.
pub fn tuned(conn: &Connection, set: i64) -> rusqlite::Result<Option<Tuned>> {
    let value: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key(set)], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(value.and_then(|v| serde_json::from_str(&v).ok()))
}

pub fn record(conn: &Connection, set: i64, tuned: &Tuned) -> rusqlite::Result<()> {
    let value = serde_json::to_string(tuned).expect("a plain struct serialises; this is a bug");
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![key(set), value],
    )?;
    Ok(())
}

pub fn forget(conn: &Connection, set: i64) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM meta WHERE key = ?1", [key(set)])?;
    Ok(())
}

/// Whether a graph of `size` vectors should be measured again (never measured, measured
/// against another target, or the set has doubled or halved since).
pub fn due(last: Option<&Tuned>, size: u64, target: f64) -> bool {
    match last {
        None => true,
        Some(t) => t.target != target || size >= 2 * t.size.max(1) || 2 * size < t.size,
    }
}

/// Whether `key`, one of `n` vectors, is held out of the graph to measure it: about
/// [`SAMPLE`] of them (a tenth of a small set), by a hash of the key (the same keys every
/// time).
pub fn held_out(key: u64, n: usize) -> bool {
    let mut x = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x % n.max(1) as u64) < SAMPLE.min(n / 10) as u64
}

/// A (distance, key) ordered by distance, for the max-heaps of the scan.
#[derive(PartialEq)]
struct Near(f32, u64);
impl Eq for Near {}
impl PartialOrd for Near {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Near {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

/// The exact `K` nearest of each query among the vectors in the graph (the held-out ones
/// left out), by one pass over the vectors file at `path` (read, not mapped), each block on
/// every core.
fn truth(
    path: &std::path::Path,
    dimension: usize,
    queries: &[(u64, Vec<f32>)],
) -> Result<Vec<Vec<u64>>, VectorsError> {
    let held: rustc_hash::FxHashSet<u64> = queries.iter().map(|(k, _)| *k).collect();
    let cosines: Vec<Cosine<'_>> = queries.iter().map(|(_, q)| Cosine::new(q)).collect();
    let empty =
        || -> Vec<BinaryHeap<Near>> { (0..queries.len()).map(|_| BinaryHeap::new()).collect() };
    let push = |heaps: &mut Vec<BinaryHeap<Near>>, key: u64, v: &[f32]| {
        if held.contains(&key) {
            return;
        }
        for (i, c) in cosines.iter().enumerate() {
            let d = c.rank(v);
            let heap = &mut heaps[i];
            if heap.len() < K {
                heap.push(Near(d, key));
            } else if heap.peek().is_some_and(|w| d < w.0) {
                heap.pop();
                heap.push(Near(d, key));
            }
        }
    };
    let merge = |mut a: Vec<BinaryHeap<Near>>, b: Vec<BinaryHeap<Near>>| {
        for (ha, hb) in a.iter_mut().zip(b) {
            for n in hb {
                if ha.len() < K {
                    ha.push(n);
                } else if ha.peek().is_some_and(|w| n < *w) {
                    ha.pop();
                    ha.push(n);
                }
            }
        }
        a
    };
    let mut heaps = empty();
    super::vectors::scan(path, dimension, 32 * 1024, |keys, rows| {
        let block = keys
            .par_iter()
            .zip(rows.par_chunks(dimension))
            .fold(empty, |mut heaps, (key, v)| {
                push(&mut heaps, *key, v);
                heaps
            })
            .reduce(empty, merge);
        heaps = merge(std::mem::take(&mut heaps), block);
    })?;
    Ok(heaps
        .into_iter()
        .map(|h| h.into_iter().map(|n| n.1).collect())
        .collect())
}

/// Measure `index` (built from `vectors`, but `held`) with the `held` vectors as queries and
/// find the smallest ef of the ladder that reaches `target` recall@10.
pub fn measure(
    index: &Index,
    path: &std::path::Path,
    vectors: &Vectors,
    held: &[(u64, Vec<f32>)],
    dtype: AnnDtype,
    target: f64,
) -> Result<Option<Tuned>, AnnError> {
    if dtype == AnnDtype::Binary || index.size() <= K {
        // Binary graphs re-score a wide net by design; tiny sets need no measuring.
        return Ok(None);
    }
    let queries: Vec<(u64, Vec<f32>)> = held.iter().map(|(k, v)| (*k, query_from(*k, v))).collect();
    let truth =
        truth(path, vectors.dimension(), &queries).map_err(|e| file_error(path, e.to_string()))?;
    let wanted: usize = truth.iter().map(|t| t.len()).sum();
    let mut last: Option<Tuned> = None;
    // usearch walks with max(ef, results asked for): rungs below the count are one rung.
    let count = rescored(dtype, K);
    for &ef in LADDER.iter().filter(|&&ef| ef >= count) {
        index.change_expansion_search(ef);
        let mut hits = 0;
        for ((_, q), truth) in queries.iter().zip(&truth) {
            let found = index
                .search::<f32>(&super::unit(q), rescored(dtype, K))
                .map_err(graph)?;
            let cosine = Cosine::new(q);
            let mut scored: Vec<(f64, u64)> = found
                .keys
                .into_iter()
                .filter_map(|k| Some((cosine.exact(vectors.get(k)?), k)))
                .collect();
            scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            hits += scored
                .iter()
                .take(K)
                .filter(|(_, k)| truth.contains(k))
                .count();
        }
        let recall = hits as f64 / wanted.max(1) as f64;
        let tuned = Tuned {
            ef,
            recall,
            target,
            size: (index.size() + held.len()) as u64,
            queries: queries.len(),
            reached: recall >= target,
        };
        if last.as_ref().is_some_and(|l| l.reached) {
            // The rung above the first that reached it.
            return Ok(Some(tuned));
        }
        last = Some(tuned);
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_about_as_far_from_its_vector_as_a_question_from_its_passage() {
        let v: Vec<f32> = (0..384).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
        let q = query_from(42, &v);
        let c = 1.0 - crate::distance::Cosine::new(&q).exact(&v);
        assert!((0.45..0.65).contains(&c), "cosine {c}");
        assert_eq!(q, query_from(42, &v), "the same key, the same query");
        assert_ne!(q, query_from(43, &v));
    }

    #[test]
    fn about_sample_vectors_are_held_out_whatever_the_set_size() {
        for n in [500usize, 10_000, 1_000_000] {
            let want = SAMPLE.min(n / 10);
            let held = (0..n as u64).filter(|k| held_out(*k + 7, n)).count();
            assert!(
                (want * 3 / 5..=want * 7 / 5).contains(&held),
                "{held} of {n}, about {want} wanted"
            );
        }
        let small = (0..300u64).filter(|k| held_out(*k, 300)).count();
        assert!((15..=45).contains(&small), "{small} of 300: about a tenth");
    }

    #[test]
    fn a_measurement_is_due_when_missing_retargeted_or_the_set_doubled() {
        let t = Tuned {
            ef: 64,
            recall: 0.96,
            target: 0.95,
            size: 1000,
            queries: 100,
            reached: true,
        };
        assert!(due(None, 10, 0.95));
        assert!(!due(Some(&t), 1999, 0.95));
        assert!(due(Some(&t), 2000, 0.95));
        assert!(due(Some(&t), 499, 0.95));
        assert!(due(Some(&t), 1000, 0.99));
    }
}
