//! Reranking: the first stage's hits re-scored by a cross-encoder, which reads the query and
//! each chunk together (slower than comparing vectors, and better at telling which passage
//! answers the query), then re-ordered by that score.

use crate::embed::cross_encoder::{CrossEncoder, PairScore, DEFAULT_BATCH_TOKENS};
use crate::embed::EmbedError;

use super::Hit;

/// First-stage candidates a reranked search scores when none is asked for.
pub const DEFAULT_CANDIDATES: usize = 50;

/// Re-score `hits` (the first stage's, best first) against `query` with `reranker` and keep
/// the `k` best by its score; each keeps its first-stage rank and score beside the new ones.
/// Ties keep the first stage's order.
pub fn rerank_hits(
    reranker: &CrossEncoder,
    query: &str,
    hits: Vec<Hit>,
    k: usize,
) -> Result<Vec<Hit>, EmbedError> {
    let texts: Vec<&str> = hits.iter().map(|h| h.chunk.text.as_str()).collect();
    let scores = reranker.rerank(query, &texts, DEFAULT_BATCH_TOKENS)?;
    Ok(reorder(hits, &scores, k))
}

/// `hits` ordered by `scores` (one per hit), the `k` best, ranks renumbered.
pub fn reorder(hits: Vec<Hit>, scores: &[PairScore], k: usize) -> Vec<Hit> {
    let mut scored: Vec<(Hit, PairScore)> = hits.into_iter().zip(scores.iter().copied()).collect();
    scored.sort_by(|a, b| b.1.raw.total_cmp(&a.1.raw).then(a.0.rank.cmp(&b.0.rank)));
    scored
        .into_iter()
        .take(k)
        .enumerate()
        .map(|(i, (mut hit, s))| {
            hit.first_stage_rank = Some(hit.rank);
            hit.first_stage_score = Some(hit.score);
            hit.rank = i + 1;
            hit.score = f64::from(s.score);
            hit.raw_score = Some(f64::from(s.raw));
            hit
        })
        .collect()
}
