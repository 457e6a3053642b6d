//! What an operator asks of an index's approximate nearest-neighbour search (`index.ann`,
//! `--ann`, `--ann-dtype`), and what a run recorded: neutral settings every layer above the
//! backends names. The ANN itself belongs to the SQLite backend (`sqlite/ann.rs`).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// When a vector set gets an ANN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnnMode {
    /// Once the set holds [`AUTO_MIN_CHUNKS`] vectors.
    #[default]
    Auto,
    /// Always.
    Hnsw,
    /// Never (an existing one is dropped).
    None,
}

impl AnnMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AnnMode::Auto => "auto",
            AnnMode::Hnsw => "hnsw",
            AnnMode::None => "none",
        }
    }
}

impl FromStr for AnnMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(AnnMode::Auto),
            "hnsw" => Ok(AnnMode::Hnsw),
            "none" => Ok(AnnMode::None),
            _ => Err(format!("unknown ANN mode `{s}`: use auto, hnsw or none")),
        }
    }
}

/// How the graph stores vectors (answers are re-scored in f32 either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnnDtype {
    /// Half precision: 2 bytes a dimension.
    #[default]
    F16,
    /// 8-bit integers: 1 byte a dimension.
    Int8,
    /// One bit a dimension (Hamming distance): for large sets where memory counts most.
    Binary,
}

impl AnnDtype {
    pub fn as_str(self) -> &'static str {
        match self {
            AnnDtype::F16 => "f16",
            AnnDtype::Int8 => "int8",
            AnnDtype::Binary => "binary",
        }
    }
}

impl FromStr for AnnDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f16" => Ok(AnnDtype::F16),
            "int8" | "i8" => Ok(AnnDtype::Int8),
            "binary" | "b1" => Ok(AnnDtype::Binary),
            _ => Err(format!("unknown ANN dtype `{s}`: use f16, int8 or binary")),
        }
    }
}

/// What the operator asked for (`index.ann`, `index.ann_dtype`, `index.ann_recall`, `--ann`,
/// `--ann-dtype`, `--ann-recall`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AnnSettings {
    pub mode: AnnMode,
    pub dtype: AnnDtype,
    /// The recall@10 the search's ef is measured to reach (see `sqlite/ann/tune.rs`).
    pub recall: f64,
}

impl Default for AnnSettings {
    fn default() -> Self {
        AnnSettings {
            mode: AnnMode::default(),
            dtype: AnnDtype::default(),
            recall: DEFAULT_RECALL,
        }
    }
}

/// The default recall target: the 10 nearest found 95 times in 100.
pub const DEFAULT_RECALL: f64 = 0.95;

/// A recall target as `--ann-recall` and `index.ann_recall` take it: above 0.5, at most 1.
pub fn parse_recall(s: &str) -> Result<f64, BadRecall> {
    match s.trim().parse::<f64>() {
        Ok(r) if r > 0.5 && r <= 1.0 => Ok(r),
        _ => Err(BadRecall(s.to_string())),
    }
}

/// A recall target that is not a number in (0.5, 1].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("ANN recall target `{0}` is not a number above 0.5 and at most 1 (e.g. 0.95)")]
pub struct BadRecall(pub String);

/// What a run asked for, each part `None` where it left the index's recorded choice alone.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AnnChoice {
    pub mode: Option<AnnMode>,
    pub dtype: Option<AnnDtype>,
    pub recall: Option<f64>,
}

impl AnnChoice {
    pub fn is_empty(&self) -> bool {
        self.mode.is_none() && self.dtype.is_none() && self.recall.is_none()
    }

    /// `recorded` with this choice's parts in it.
    pub fn over(&self, recorded: AnnSettings) -> AnnSettings {
        AnnSettings {
            mode: self.mode.unwrap_or(recorded.mode),
            dtype: self.dtype.unwrap_or(recorded.dtype),
            recall: self.recall.unwrap_or(recorded.recall),
        }
    }
}

/// How a vector search was answered (`search --explain`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VectorPlan {
    /// `ann` (the approximate index) or `exact` (every vector compared).
    pub index: &'static str,
    /// How the candidates were found: `graph` (an HNSW walk), `graph+filter` (a walk that
    /// skips what the filter leaves out), `filter-scan` (every chunk the filter lets through
    /// scored), `scan` (every vector).
    pub path: &'static str,
    /// Why this path (the cost estimate, or why not the ANN).
    pub why: String,
    /// The graph's candidate list (HNSW ef), when it was walked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ef: Option<usize>,
    /// Candidates re-scored exactly.
    pub candidates: usize,
    /// Chunks the filter let through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filtered_to: Option<usize>,
    /// Chunks changed since the ANN was saved (scored from the index's tables).
    pub changed_since_saved: usize,
    /// Where the exact scores' f32 vectors were read: `vectors-file` or `index`.
    pub rescored_from: &'static str,
}

/// `auto` builds the ANN of a set once it holds this many vectors: below it the exact scan
/// takes a few milliseconds (31 ms at 100k on 2 cores).
pub const AUTO_MIN_CHUNKS: u64 = 50_000;
