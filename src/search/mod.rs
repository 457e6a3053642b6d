//! Searching an index (SQLite or Postgres, through [`IndexReader`]): by vector, by keyword,
//! or hybrid by reciprocal rank fusion of the two.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use thiserror::Error;

pub mod rerank;

use crate::embed::splade::{SparseModel, SparseVector};
use crate::embed::{EmbedError, EmbeddingModel};
pub use crate::indexers::filter::{Clause, FilterError, Where};
use crate::indexers::{BackendError, ChunkRow, IndexReader, IndexUri};

/// The constant of reciprocal rank fusion (Cormack et al.): score = sum of 1 / (K + rank).
pub const RRF_K: f64 = 60.0;
/// Candidates each side brings to a hybrid search, at least.
pub const HYBRID_DEPTH: usize = 100;
/// Results one search returns, at most (a larger k is cut to it; `ragline search -k`, the
/// Python `Index.search` and the reranker's candidates refuse more). Each is a chunk row read
/// and returned: past a few thousand a caller wants an export, not a search.
pub const MAX_K: usize = 10_000;

/// How a search ranks chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// By the cosine of their dense vectors to the query's.
    Vector,
    /// By BM25 over their words.
    Keyword,
    /// By the dot product of their sparse (SPLADE) vectors with the query's.
    Sparse,
    /// Reciprocal rank fusion of the rankings `Fuse` names.
    Hybrid(Fuse),
}

/// The rankings a hybrid search fuses: at least two of dense, sparse and keyword.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fuse {
    pub dense: bool,
    pub sparse: bool,
    pub keyword: bool,
}

impl Fuse {
    /// Dense and keyword: what `--mode hybrid` fuses unless told otherwise.
    pub const DEFAULT: Fuse = Fuse {
        dense: true,
        sparse: false,
        keyword: true,
    };

    /// The names, in `dense,sparse,keyword` order.
    fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.dense {
            v.push("dense");
        }
        if self.sparse {
            v.push("sparse");
        }
        if self.keyword {
            v.push("keyword");
        }
        v
    }
}

impl Default for Fuse {
    fn default() -> Self {
        Fuse::DEFAULT
    }
}

impl std::fmt::Display for Fuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

impl FromStr for Fuse {
    type Err = String;
    /// `dense,sparse,keyword` (or joined by `+`), in any order; `vector` names `dense`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut f = Fuse {
            dense: false,
            sparse: false,
            keyword: false,
        };
        for part in s.split([',', '+']).map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "dense" | "vector" => f.dense = true,
                "sparse" => f.sparse = true,
                "keyword" => f.keyword = true,
                other => {
                    return Err(format!(
                        "unknown ranking `{other}` to fuse: use dense, sparse and keyword \
                         (two or three of them, comma-separated)"
                    ))
                }
            }
        }
        if f.names().len() < 2 {
            return Err(format!(
                "--fuse {s}: a hybrid search fuses two or three of dense, sparse and keyword \
                 (for one alone, use --mode vector, sparse or keyword)"
            ));
        }
        Ok(f)
    }
}

impl Mode {
    /// The modes a search page offers: today's three.
    pub const ALL: [Mode; 3] = [Mode::Vector, Mode::Keyword, Mode::Hybrid(Fuse::DEFAULT)];

    /// The mode's name: `hybrid` for the default fusion, else `hybrid:` and what it fuses
    /// (`hybrid:dense+sparse+keyword`): what `FromStr` reads back.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Vector => "vector",
            Mode::Keyword => "keyword",
            Mode::Sparse => "sparse",
            Mode::Hybrid(f) => match (f.dense, f.sparse, f.keyword) {
                (true, false, true) => "hybrid",
                (true, true, true) => "hybrid:dense+sparse+keyword",
                (true, true, false) => "hybrid:dense+sparse",
                (false, true, true) => "hybrid:sparse+keyword",
                // Not made by FromStr (fewer than two rankings).
                _ => "hybrid:one",
            },
        }
    }

    /// Whether the mode embeds the query with the index's dense model.
    pub fn needs_dense(self) -> bool {
        match self {
            Mode::Vector => true,
            Mode::Hybrid(f) => f.dense,
            Mode::Keyword | Mode::Sparse => false,
        }
    }

    /// Whether the mode encodes the query with the index's sparse model.
    pub fn needs_sparse(self) -> bool {
        match self {
            Mode::Sparse => true,
            Mode::Hybrid(f) => f.sparse,
            Mode::Keyword | Mode::Vector => false,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vector" => Ok(Mode::Vector),
            "keyword" => Ok(Mode::Keyword),
            "sparse" => Ok(Mode::Sparse),
            "hybrid" => Ok(Mode::Hybrid(Fuse::DEFAULT)),
            _ => match s.strip_prefix("hybrid:") {
                Some(fuse) => Ok(Mode::Hybrid(fuse.parse()?)),
                None => Err(format!(
                    "unknown mode `{s}`: use vector, keyword, sparse or hybrid (hybrid fuses \
                     dense and keyword; hybrid:dense+sparse+keyword names what it fuses)"
                )),
            },
        }
    }
}

#[derive(Debug, Error)]
pub enum SearchError {
    #[error(transparent)]
    Index(#[from] BackendError),
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error("{0}")]
    NoModel(String),
}

/// A search result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Hit {
    pub rank: usize,
    /// What orders the results: the first stage's score, or the reranker's when reranked.
    pub score: f64,
    /// Reranked results: the rank and score the first stage gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_stage_rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_stage_score: Option<f64>,
    /// Reranked results: the cross-encoder's logit (`score` is its activation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_score: Option<f64>,
    #[serde(flatten)]
    pub chunk: ChunkRow,
}

/// A query's vectors, when the caller encoded it already.
#[derive(Clone, Debug, Default)]
pub struct QueryVectors {
    /// By the index's dense model (cut to the index's dimension).
    pub dense: Option<Vec<f32>>,
    /// By the index's sparse model.
    pub sparse: Option<SparseVector>,
}

pub struct Searcher {
    reader: Box<dyn IndexReader>,
    model: Option<EmbeddingModel>,
    /// Encodes queries for sparse search (the index's sparse model).
    sparse: Option<SparseModel>,
}

impl Searcher {
    /// Open the index; `model` embeds queries (it must be the index's own model; see
    /// [`Searcher::model_spec`]). Without one only keyword search works.
    pub fn new(reader: Box<dyn IndexReader>, model: Option<EmbeddingModel>) -> Self {
        Searcher {
            reader,
            model,
            sparse: None,
        }
    }

    /// With the index's sparse model, for sparse and hybrid search over sparse vectors.
    pub fn with_sparse(mut self, sparse: Option<SparseModel>) -> Self {
        self.sparse = sparse;
        self
    }

    /// Where to load the index's sparse model from: the folder it was recorded with, when it
    /// is still there, else the name it was given.
    pub fn sparse_model_spec(reader: &dyn IndexReader) -> Option<String> {
        let meta = reader.meta();
        match (&meta.sparse_model_dir, &meta.sparse_model) {
            (Some(dir), _) if Path::new(dir).is_dir() => Some(dir.clone()),
            (_, Some(name)) => Some(name.clone()),
            _ => None,
        }
    }

    /// Open the index a URI names; `exact`: vector search scans every vector (Postgres: no
    /// HNSW).
    pub fn open(uri: &IndexUri, exact: bool) -> Result<Box<dyn IndexReader>, BackendError> {
        crate::indexers::open_reader(uri, exact)
    }

    /// Where to load the index's model from: the folder it was built with, when it is still
    /// there, else the name it was given.
    pub fn model_spec(reader: &dyn IndexReader) -> Option<String> {
        let meta = reader.meta();
        match (&meta.model_dir, &meta.model) {
            (Some(dir), _) if Path::new(dir).is_dir() => Some(dir.clone()),
            (_, Some(name)) => Some(name.clone()),
            _ => None,
        }
    }

    /// Cut `model`'s vectors to the index's dimension when the index was built with
    /// `--dimensions` (its vector set records the cut; the query must be cut the same way).
    pub fn fit_model(
        reader: &dyn IndexReader,
        model: &mut crate::embed::EmbeddingModel,
    ) -> Result<(), crate::embed::EmbedError> {
        match reader.meta().dimension {
            Some(d)
                if d < model.full_dimension() && model.dimension() == model.full_dimension() =>
            {
                model.set_dimensions(Some(d))
            }
            _ => Ok(()),
        }
    }

    pub fn reader(&self) -> &dyn IndexReader {
        self.reader.as_ref()
    }

    /// Vector searches walk the approximate index with this candidate list (HNSW ef),
    /// not the one the index chose for its recall target (`search --ef`).
    pub fn with_ef(mut self, ef: Option<usize>) -> Self {
        self.reader.set_ef(ef);
        self
    }

    /// The reader back (a pool of them keeps one open between searches).
    pub fn into_reader(self) -> Box<dyn IndexReader> {
        self.reader
    }

    /// Chunk rowids and scores, best first, `depth` at most.
    pub fn ranked(
        &self,
        query: &str,
        mode: Mode,
        depth: usize,
    ) -> Result<Vec<(i64, f64)>, SearchError> {
        self.ranked_where(query, mode, depth, &Where::default())
    }

    /// [`Searcher::ranked`] among the chunks `filter` lets through.
    pub fn ranked_where(
        &self,
        query: &str,
        mode: Mode,
        depth: usize,
        filter: &Where,
    ) -> Result<Vec<(i64, f64)>, SearchError> {
        self.ranked_with(query, QueryVectors::default(), mode, depth, filter)
    }

    /// Ranked, with the query's vectors where the caller encoded them already (else the
    /// searcher's models encode it, when the mode needs them).
    pub fn ranked_with(
        &self,
        query: &str,
        given: QueryVectors,
        mode: Mode,
        depth: usize,
        filter: &Where,
    ) -> Result<Vec<(i64, f64)>, SearchError> {
        let vector = |this: &Self| match &given.dense {
            Some(v) => Ok(v.clone()),
            None => this.embed_query(query),
        };
        let sparse = given.sparse.as_ref();
        match mode {
            Mode::Vector => {
                let v = vector(self)?;
                Ok(self
                    .reader
                    .nearest_where(&v, depth, filter)?
                    .into_iter()
                    .map(|(id, d)| (id, 1.0 - d))
                    .collect())
            }
            Mode::Keyword => {
                let chunks = self.reader.keyword_where(query, depth, filter)?;
                if !filter.is_empty() {
                    // Stage outputs (summaries) match whole documents: not filtered yet.
                    return Ok(chunks);
                }
                let outputs = self.reader.keyword_outputs(query, depth)?;
                if outputs.is_empty() {
                    return Ok(chunks);
                }
                // Documents whose summary matches rank beside chunks that match.
                let mut fused = rrf(&[chunks, outputs]);
                fused.truncate(depth);
                Ok(fused)
            }
            Mode::Sparse => self.sparse_ranked(query, sparse, depth, filter),
            Mode::Hybrid(fuse) => {
                let n = depth.max(HYBRID_DEPTH);
                let mut lists = Vec::with_capacity(4);
                if fuse.dense {
                    let v = vector(self)?;
                    lists.push(self.reader.nearest_where(&v, n, filter)?);
                }
                if fuse.sparse {
                    lists.push(self.sparse_ranked(query, sparse, n, filter)?);
                }
                if fuse.keyword {
                    lists.push(self.reader.keyword_where(query, n, filter)?);
                    if filter.is_empty() {
                        let outputs = self.reader.keyword_outputs(query, n)?;
                        if !outputs.is_empty() {
                            lists.push(outputs);
                        }
                    }
                }
                let mut fused = rrf(&lists);
                fused.truncate(depth);
                Ok(fused)
            }
        }
    }

    /// Chunks by the dot product of their sparse vectors with the query's (`given`, else
    /// encoded by the searcher's sparse model).
    fn sparse_ranked(
        &self,
        query: &str,
        given: Option<&SparseVector>,
        depth: usize,
        filter: &Where,
    ) -> Result<Vec<(i64, f64)>, SearchError> {
        let encoded;
        let q = match given {
            Some(q) => q,
            None => {
                encoded = self.sparse_query(query)?;
                &encoded
            }
        };
        Ok(self
            .reader
            .sparse_where(&q.indices, &q.values, depth, filter)?)
    }

    /// The query's sparse vector, by the index's sparse model.
    pub fn sparse_query(&self, query: &str) -> Result<SparseVector, SearchError> {
        let model = self.sparse.as_ref().ok_or_else(|| {
            SearchError::NoModel(
                "this search needs the index's sparse model to encode the query; add sparse \
                 vectors with `ragline enrich --stage sparse --sparse-model MODEL`, or search \
                 another --mode"
                    .into(),
            )
        })?;
        Ok(model.embed_texts(&[query])?.pop().unwrap_or_default())
    }

    /// The `k` best chunks with their rows.
    pub fn search(&self, query: &str, mode: Mode, k: usize) -> Result<Vec<Hit>, SearchError> {
        self.search_where(query, mode, k, &Where::default())
    }

    /// [`Searcher::search`] among the chunks `filter` lets through.
    pub fn search_where(
        &self,
        query: &str,
        mode: Mode,
        k: usize,
        filter: &Where,
    ) -> Result<Vec<Hit>, SearchError> {
        self.search_with(query, QueryVectors::default(), mode, k, filter)
    }

    /// [`Searcher::search_where`] with the query's vectors encoded by the caller (a server
    /// batching its queries with its other work); those left None the searcher's models
    /// encode, when the mode needs them.
    pub fn search_with(
        &self,
        query: &str,
        vectors: QueryVectors,
        mode: Mode,
        k: usize,
        filter: &Where,
    ) -> Result<Vec<Hit>, SearchError> {
        // Bounded here, whoever asks: the backends size buffers by k.
        let k = k.min(MAX_K);
        let ranked = self.ranked_with(query, vectors, mode, k, filter)?;
        let mut hits = Vec::with_capacity(ranked.len());
        for (i, (rowid, score)) in ranked.into_iter().enumerate() {
            if let Some(chunk) = self.reader.chunk(rowid)? {
                hits.push(Hit {
                    rank: i + 1,
                    score,
                    first_stage_rank: None,
                    first_stage_score: None,
                    raw_score: None,
                    chunk,
                });
            }
        }
        Ok(hits)
    }

    pub fn embed_query(&self, query: &str) -> Result<Vec<f32>, SearchError> {
        let model = self.model.as_ref().ok_or_else(|| {
            SearchError::NoModel(
                "this search needs the index's model to embed the query; use --mode keyword, \
                 or make the model available (scripts/fetch-model.sh, --model)"
                    .into(),
            )
        })?;
        let prompt = model.tokenizer.query_prompt_ids().to_vec();
        let ids = model.tokenizer.ids_for_embedding(query, &prompt)?;
        let mut v = model.embed_ids(&[&ids], &prompt)?;
        Ok(v.pop().unwrap_or_default())
    }
}

/// Reciprocal rank fusion of ranked lists of (id, score): best first.
pub fn rrf(lists: &[Vec<(i64, f64)>]) -> Vec<(i64, f64)> {
    let mut scores: HashMap<i64, f64> = HashMap::new();
    for list in lists {
        for (rank, (id, _)) in list.iter().enumerate() {
            *scores.entry(*id).or_insert(0.0) += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
    }
    let mut fused: Vec<(i64, f64)> = scores.into_iter().collect();
    fused.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_fusions_read_back_their_names() {
        for m in [
            "vector",
            "keyword",
            "sparse",
            "hybrid",
            "hybrid:dense+sparse+keyword",
            "hybrid:dense+sparse",
            "hybrid:sparse+keyword",
        ] {
            assert_eq!(m.parse::<Mode>().unwrap().name(), m);
        }
        // Any order and `vector` for dense; `hybrid:dense+keyword` is plain hybrid.
        assert_eq!(
            "hybrid:keyword+vector".parse::<Mode>().unwrap(),
            Mode::Hybrid(Fuse::DEFAULT)
        );
        let all: Fuse = "keyword,sparse,dense".parse().unwrap();
        assert!(all.dense && all.sparse && all.keyword);
        assert_eq!(all.to_string(), "dense,sparse,keyword");
        assert!(Mode::Hybrid(all).needs_dense() && Mode::Hybrid(all).needs_sparse());
        assert!(!Mode::Sparse.needs_dense() && Mode::Sparse.needs_sparse());
        assert!(!Mode::Keyword.needs_dense() && !Mode::Keyword.needs_sparse());
        for bad in ["dense", "sparse,", "dense,bm25", ""] {
            assert!(bad.parse::<Fuse>().is_err(), "{bad}");
        }
        assert!("hybrid:sparse".parse::<Mode>().is_err());
        assert!("splade".parse::<Mode>().is_err());
    }

    #[test]
    fn rrf_rewards_agreement() {
        let a = vec![(1, 0.9), (2, 0.8), (3, 0.7)];
        let b = vec![(3, 10.0), (2, 9.0), (4, 8.0)];
        let fused = rrf(&[a, b]);
        let order: Vec<i64> = fused.iter().map(|x| x.0).collect();
        // 3 (first and third) edges out 2 (second twice); 1 and 4 appear once.
        assert_eq!(order, vec![3, 2, 1, 4]);
        assert!((fused[0].1 - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-12);
        assert!((fused[1].1 - 2.0 / 62.0).abs() < 1e-12);
    }
}
