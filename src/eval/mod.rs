//! Retrieval evaluation in the BEIR format: queries, relevance judgements (qrels), and the
//! standard metrics (nDCG@10, recall@10, recall@100, MRR@10), per search mode. A document's
//! score is its best chunk's.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;

use serde::Serialize;

use crate::embed::cross_encoder::{CrossEncoder, DEFAULT_BATCH_TOKENS};
use crate::indexers::IndexReader;
use crate::search::{Mode, SearchError, Searcher};

/// Chunks fetched per query and mode before they are grouped into documents.
pub const CHUNK_DEPTH: usize = 1000;

/// A BEIR file that cannot be read: the file, the line where it applies, and why.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{path} line {line}: {what}")]
    Format {
        path: String,
        line: usize,
        what: String,
    },
}

fn unreadable(path: &Path, e: impl std::fmt::Display) -> EvalError {
    EvalError::Unreadable {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn format_error(path: &Path, line: usize, what: impl Into<String>) -> EvalError {
    EvalError::Format {
        path: path.display().to_string(),
        line,
        what: what.into(),
    }
}

/// query id -> (document id -> relevance grade).
pub type Qrels = HashMap<String, HashMap<String, u32>>;

/// Read a BEIR qrels TSV (`query-id  corpus-id  score`, with a header line).
pub fn read_qrels(path: &Path) -> Result<Qrels, EvalError> {
    let file = std::fs::File::open(path).map_err(|e| unreadable(path, e))?;
    let mut qrels: Qrels = HashMap::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| unreadable(path, e))?;
        let f: Vec<&str> = line.split('\t').collect();
        if i == 0 && f.first().is_some_and(|h| h.contains("query")) {
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let [q, d, s] = f[..] else {
            return Err(format_error(
                path,
                i + 1,
                "expected `query-id<TAB>corpus-id<TAB>score`",
            ));
        };
        let grade: i64 = s
            .trim()
            .parse()
            .map_err(|_| format_error(path, i + 1, format!("score `{s}` is not an integer")))?;
        if grade > 0 {
            qrels
                .entry(q.to_string())
                .or_default()
                .insert(d.to_string(), grade as u32);
        }
    }
    Ok(qrels)
}

/// Read BEIR queries (`{"_id": ..., "text": ...}` per line).
pub fn read_queries(path: &Path) -> Result<Vec<(String, String)>, EvalError> {
    let file = std::fs::File::open(path).map_err(|e| unreadable(path, e))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| unreadable(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format_error(path, i + 1, e.to_string()))?;
        let id = match &v["_id"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => return Err(format_error(path, i + 1, "no `_id`")),
        };
        let text = v["text"]
            .as_str()
            .ok_or_else(|| format_error(path, i + 1, "no `text`"))?;
        out.push((id, text.to_string()));
    }
    Ok(out)
}

/// nDCG@k with linear gains (trec_eval's), for a ranking of document ids.
pub fn ndcg_at(ranking: &[String], relevant: &HashMap<String, u32>, k: usize) -> f64 {
    let dcg: f64 = ranking
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, d)| f64::from(*relevant.get(d).unwrap_or(&0)) / (i as f64 + 2.0).log2())
        .sum();
    let mut ideal: Vec<u32> = relevant.values().copied().collect();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, g)| f64::from(*g) / (i as f64 + 2.0).log2())
        .sum();
    if idcg == 0.0 {
        0.0
    } else {
        dcg / idcg
    }
}

pub fn recall_at(ranking: &[String], relevant: &HashMap<String, u32>, k: usize) -> f64 {
    if relevant.is_empty() {
        return 0.0;
    }
    let found = ranking
        .iter()
        .take(k)
        .filter(|d| relevant.contains_key(*d))
        .count();
    found as f64 / relevant.len() as f64
}

pub fn mrr_at(ranking: &[String], relevant: &HashMap<String, u32>, k: usize) -> f64 {
    ranking
        .iter()
        .take(k)
        .position(|d| relevant.contains_key(d))
        .map_or(0.0, |p| 1.0 / (p as f64 + 1.0))
}

/// The metrics of one mode, averaged over the judged queries.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Scores {
    pub mode: &'static str,
    /// The first stage's candidates re-scored by a cross-encoder (`--rerank`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reranked: bool,
    pub queries: usize,
    pub ndcg_at_10: f64,
    pub recall_at_10: f64,
    pub recall_at_100: f64,
    pub mrr_at_10: f64,
    /// Vector mode on an approximate index (HNSW): the share of the exact 10 nearest chunks
    /// the index returned, averaged over the queries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ann_recall_at_10: Option<f64>,
}

/// Rank documents for one query: each document scored by its best chunk.
pub fn rank_documents(
    searcher: &Searcher,
    query: &str,
    mode: Mode,
    depth: usize,
) -> Result<Vec<String>, SearchError> {
    let chunks = searcher.ranked(query, mode, depth)?;
    documents_of(searcher, &chunks)
}

/// Chunks' documents in the chunks' order, each once.
fn documents_of(searcher: &Searcher, chunks: &[(i64, f64)]) -> Result<Vec<String>, SearchError> {
    let mut seen = HashSet::new();
    let mut docs = Vec::new();
    // Chunks come best first, so a document's first chunk is its best.
    let rowids: Vec<i64> = chunks.iter().map(|c| c.0).collect();
    for doc in searcher
        .reader()
        .documents_of(&rowids)?
        .into_iter()
        .flatten()
    {
        if seen.insert(doc.clone()) {
            docs.push(doc);
        }
    }
    Ok(docs)
}

/// The first stage's `candidates` best chunks re-ordered by `reranker` (ties keep the first
/// stage's order), then the rest as they were.
pub fn rerank_chunks(
    searcher: &Searcher,
    reranker: &CrossEncoder,
    query: &str,
    chunks: &[(i64, f64)],
    candidates: usize,
) -> Result<Vec<(i64, f64)>, SearchError> {
    let n = candidates.min(chunks.len());
    let mut texts = Vec::with_capacity(n);
    for (rowid, _) in &chunks[..n] {
        texts.push(
            searcher
                .reader()
                .chunk(*rowid)?
                .map(|c| c.text)
                .unwrap_or_default(),
        );
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let scores = reranker.rerank(query, &refs, DEFAULT_BATCH_TOKENS)?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| scores[b].raw.total_cmp(&scores[a].raw).then(a.cmp(&b)));
    let mut out: Vec<(i64, f64)> = order
        .into_iter()
        .map(|i| (chunks[i].0, f64::from(scores[i].score)))
        .collect();
    out.extend_from_slice(&chunks[n..]);
    Ok(out)
}

/// A reranker for [`evaluate_reranked`]: the cross-encoder and how many first-stage chunks
/// it re-scores per query.
pub struct Rerank<'a> {
    pub model: &'a CrossEncoder,
    pub candidates: usize,
}

/// Evaluate every judged query in every mode.
pub fn evaluate(
    searcher: &Searcher,
    queries: &[(String, String)],
    qrels: &Qrels,
    modes: &[Mode],
) -> Result<Vec<Scores>, SearchError> {
    evaluate_reranked(searcher, queries, qrels, modes, None)
}

/// [`evaluate`], and with a reranker each mode a second time with its candidates reranked
/// (the same first-stage results: the two rows differ by the reranking alone).
pub fn evaluate_reranked(
    searcher: &Searcher,
    queries: &[(String, String)],
    qrels: &Qrels,
    modes: &[Mode],
    rerank: Option<Rerank<'_>>,
) -> Result<Vec<Scores>, SearchError> {
    let judged: Vec<&(String, String)> = queries
        .iter()
        .filter(|(id, _)| qrels.contains_key(id))
        .collect();
    let mut out = Vec::new();
    for &mode in modes {
        let new = |reranked| Scores {
            mode: mode.name(),
            reranked,
            queries: judged.len(),
            ..Scores::default()
        };
        let (mut plain, mut reranked) = (new(false), new(true));
        for (id, text) in &judged {
            let chunks = searcher.ranked(text, mode, CHUNK_DEPTH)?;
            let rel = &qrels[id];
            plain.add(&documents_of(searcher, &chunks)?, rel);
            if let Some(r) = &rerank {
                let chunks = rerank_chunks(searcher, r.model, text, &chunks, r.candidates)?;
                reranked.add(&documents_of(searcher, &chunks)?, rel);
            }
        }
        plain.average();
        out.push(plain);
        if rerank.is_some() {
            reranked.average();
            out.push(reranked);
        }
    }
    Ok(out)
}

impl Scores {
    /// Add one query's metrics.
    fn add(&mut self, ranking: &[String], rel: &HashMap<String, u32>) {
        self.ndcg_at_10 += ndcg_at(ranking, rel, 10);
        self.recall_at_10 += recall_at(ranking, rel, 10);
        self.recall_at_100 += recall_at(ranking, rel, 100);
        self.mrr_at_10 += mrr_at(ranking, rel, 10);
    }

    /// The sums, averaged over the queries.
    fn average(&mut self) {
        let n = self.queries.max(1) as f64;
        self.ndcg_at_10 /= n;
        self.recall_at_10 /= n;
        self.recall_at_100 /= n;
        self.mrr_at_10 /= n;
    }
}

/// How many of the exact `k` nearest chunks an approximate index finds, averaged over the
/// judged queries: `searcher` reads the approximate index, `exact` the same index by scan.
pub fn ann_recall(
    searcher: &Searcher,
    exact: &dyn IndexReader,
    queries: &[(String, String)],
    qrels: &Qrels,
    k: usize,
) -> Result<f64, SearchError> {
    let mut total = 0.0;
    let mut n = 0usize;
    for (id, text) in queries.iter().filter(|(id, _)| qrels.contains_key(id)) {
        let _ = id;
        let v = searcher.embed_query(text)?;
        let truth: HashSet<i64> = exact.nearest(&v, k)?.into_iter().map(|x| x.0).collect();
        if truth.is_empty() {
            continue;
        }
        let found = searcher
            .reader()
            .nearest(&v, k)?
            .into_iter()
            .filter(|x| truth.contains(&x.0))
            .count();
        total += found as f64 / truth.len() as f64;
        n += 1;
    }
    Ok(if n == 0 { 1.0 } else { total / n as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(pairs: &[(&str, u32)]) -> HashMap<String, u32> {
        pairs.iter().map(|(d, g)| (d.to_string(), *g)).collect()
    }

    fn ranking(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn metrics_match_hand_computed_values() {
        let r = rel(&[("a", 1), ("c", 1)]);
        let run = ranking(&["b", "a", "d", "c"]);
        // DCG = 1/log2(3) + 1/log2(5); IDCG = 1 + 1/log2(3).
        let expected = (1.0 / 3f64.log2() + 1.0 / 5f64.log2()) / (1.0 + 1.0 / 3f64.log2());
        assert!((ndcg_at(&run, &r, 10) - expected).abs() < 1e-12);
        assert_eq!(recall_at(&run, &r, 2), 0.5);
        assert_eq!(recall_at(&run, &r, 10), 1.0);
        assert_eq!(mrr_at(&run, &r, 10), 0.5);
        assert_eq!(mrr_at(&ranking(&["x"]), &r, 10), 0.0);
        assert_eq!(ndcg_at(&ranking(&["a", "c"]), &r, 10), 1.0);
        // Graded: the better document first scores higher.
        let g = rel(&[("a", 2), ("b", 1)]);
        assert!(ndcg_at(&ranking(&["a", "b"]), &g, 10) > ndcg_at(&ranking(&["b", "a"]), &g, 10));
    }
}
