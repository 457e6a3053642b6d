//! `ragline.toml`: a pipeline described in a file. It holds what the flags hold (sources,
//! model, chunking, index, run layout) plus per-stage settings (retries, backoff, lease,
//! concurrency, priority of new work). Flags override the file; the file overrides the
//! defaults. Unknown keys and wrong types are errors that name the key and the line.
//!
//! ```toml
//! [source]
//! paths = ["docs/"]
//! exclude = ["drafts/**"]
//!
//! [model]
//! name = "sentence-transformers/all-MiniLM-L6-v2"
//! device = "auto"
//!
//! [chunk]
//! tokens = 256
//! overlap = 32
//!
//! [index]
//! uri = "sqlite://rag.db"
//!
//! [stages.embed]
//! defer = true            # ingest leaves embedding to `ragline enrich`
//! retry_limit = 5
//! backoff = "1s"
//! visibility_timeout = "5m"
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::embed::{DTypeChoice, DeviceChoice, DEFAULT_MODEL};
use crate::indexers::IndexUri;
use crate::lifecycle::{Priority, StageSettings};
use crate::stages::chunk::{DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS};

pub use super::services::{LlmStageConfig, RemoteEmbedConfig};

/// The file read when no `--config` is given, from the working folder.
pub const DEFAULT_CONFIG_FILE: &str = "ragline.toml";

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    /// The file is not valid TOML, or a key is unknown or of the wrong type: the message
    /// names the file, the line and the key.
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// A value that parses but cannot work (the message names the key and the fix).
    #[error("{0}")]
    Value(String),
}

/// The whole pipeline.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Where documents come from.
    pub source: SourceConfig,
    /// The embedding model and where it runs.
    pub model: ModelConfig,
    /// How documents are cut into chunks.
    pub chunk: ChunkConfigFile,
    /// Where chunks and vectors are written.
    pub index: IndexConfig,
    /// How a run is laid out.
    pub run: RunConfig,
    /// Per-stage lifecycle settings.
    pub stages: StagesConfig,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SourceConfig {
    /// Files and folders to ingest.
    pub paths: Vec<PathBuf>,
    /// File extensions to take from folders, instead of the default list.
    pub ext: Vec<String>,
    /// Globs (relative to each folder) of files to take.
    pub include: Vec<String>,
    /// Globs (relative to each folder) of files to leave out.
    pub exclude: Vec<String>,
    /// Files larger than this many bytes are reported as failed instead of read.
    pub max_file_bytes: u64,
    /// Seconds one file may take to extract; past it the file fails.
    pub max_file_seconds: u64,
    /// MiB one file's extraction may hold; past it the file fails.
    pub max_extract_mb: u64,
    /// JSONL: the field holding the document id (default: id, else _id, else FILE:LINE).
    pub id_field: Option<String>,
    /// JSONL: the field holding the text.
    pub text_field: String,
    /// JSONL: the field holding the title.
    pub title_field: String,
    /// JSONL: put the title at the head of the text, so it is chunked and embedded with it.
    pub title_in_text: bool,
    /// Object stores: how many objects are downloaded at once (feeds: linked pages).
    pub fetch_concurrency: usize,
    /// Feeds: index the page each entry links to instead of the entry's content.
    pub follow_links: bool,
    /// Web crawls: links followed from the start page.
    pub crawl_depth: u32,
    /// Web crawls and sitemaps: pages read at most.
    pub crawl_max_pages: usize,
    /// Web crawls and sitemaps: requests per second to the site.
    pub crawl_rps: f64,
    /// Web sources: seconds one GET may take.
    pub fetch_timeout: f64,
    /// Web sources: connect to private, loopback and link-local addresses even when the
    /// source's URL does not name one (an intranet site by its name).
    pub allow_private_addresses: bool,
    /// Extract each file in a child process (the ragline binary), so a crash inside a
    /// parser that no thread can contain (a stack overflow, an abort) fails that file alone.
    pub isolate_extraction: bool,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            paths: Vec::new(),
            ext: Vec::new(),
            include: Vec::new(),
            exclude: Vec::new(),
            max_file_bytes: default_max_file_bytes(),
            max_file_seconds: crate::stages::extract::DEFAULT_MAX_FILE_SECONDS,
            max_extract_mb: crate::stages::extract::DEFAULT_MAX_EXTRACT_MB,
            id_field: None,
            text_field: "text".into(),
            title_field: "title".into(),
            title_in_text: false,
            fetch_concurrency: crate::connectors::DEFAULT_FETCH_CONCURRENCY,
            follow_links: false,
            crawl_depth: 5,
            crawl_max_pages: 10_000,
            crawl_rps: 8.0,
            fetch_timeout: 30.0,
            allow_private_addresses: false,
            isolate_extraction: false,
        }
    }
}

fn default_max_file_bytes() -> u64 {
    100 << 20
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// A folder in the Hugging Face layout, or a hub id.
    pub name: String,
    /// auto, cpu, cuda, cuda:N, cuda:0,1 or metal.
    #[serde(deserialize_with = "parsed", serialize_with = "shown")]
    pub device: Parsed<DeviceChoice>,
    /// auto, f32, f16 or bf16.
    #[serde(deserialize_with = "parsed", serialize_with = "shown")]
    pub dtype: Parsed<DTypeChoice>,
    /// Padded tokens per forward pass (default: 2048 on the CPU, 32768 on a GPU).
    pub batch_tokens: Option<usize>,
    /// How long, in milliseconds, the first chunk of a batch waits for more.
    pub max_wait_ms: u64,
    /// Text put before each query, overriding the model's own prompt.
    pub query_prompt: Option<String>,
    /// Text put before each passage (document), overriding the model's own prompt.
    #[serde(alias = "document_prompt")]
    pub passage_prompt: Option<String>,
    /// Vectors cut to their first N dimensions and re-normalised (Matryoshka models).
    pub dimensions: Option<usize>,
    /// Which kernels run (`[model.kernels]`: cpu, amx, cublaslt, pipeline); the environment
    /// variables `RAGLINE_CPU_KERNELS` ... override them.
    pub kernels: crate::embed::kernel_choice::Kernels,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            name: DEFAULT_MODEL.into(),
            device: Parsed::new("auto", DeviceChoice::Auto),
            dtype: Parsed::new("auto", DTypeChoice::Auto),
            batch_tokens: None,
            max_wait_ms: 50,
            query_prompt: None,
            passage_prompt: None,
            dimensions: None,
            kernels: Default::default(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ChunkConfigFile {
    /// false: index whole documents, no chunks, no model.
    pub enabled: bool,
    /// Chunk size to aim for, in model tokens (at most the model's limit).
    pub tokens: usize,
    /// Tokens shared by consecutive chunks of a section.
    pub overlap: usize,
    /// One chunk per document, its first tokens up to the model's limit.
    pub truncate: bool,
}

impl Default for ChunkConfigFile {
    fn default() -> Self {
        ChunkConfigFile {
            enabled: true,
            tokens: DEFAULT_CHUNK_TOKENS,
            overlap: DEFAULT_CHUNK_OVERLAP,
            truncate: false,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IndexConfig {
    /// sqlite://PATH, postgres://USER@HOST:PORT/DB[?schema=S], parquet:PATH, jsonl:PATH or
    /// null:. Printed without its password.
    #[serde(deserialize_with = "parsed", serialize_with = "shown_redacted")]
    pub uri: Parsed<IndexUri>,
    /// Delete from the index the documents whose source is gone (and vector sets a finished
    /// migration retired).
    pub prune: bool,
    /// Items per bulk write, at most.
    pub batch_size: usize,
    /// Bytes per bulk write, at most.
    pub batch_bytes: usize,
    /// Milliseconds a partial bulk write waits for more items.
    pub batch_timeout_ms: u64,
    /// Indexer threads; unset: what the backend takes well (`BackendFactory::writers`: one
    /// for a file, two for PostgreSQL).
    pub indexers: Option<usize>,
    /// sqlite:// only: the approximate nearest-neighbour index the indexers keep. `auto`
    /// (once a vector set passes 50,000 chunks), `hnsw` (always) or `none`; unset: what the
    /// index records (auto for a new one).
    pub ann: Option<crate::indexers::ann::AnnMode>,
    /// sqlite:// only: how the ANN stores vectors: `f16`, `int8` or `binary` (answers are
    /// re-scored against the f32 vectors); unset: what the index records (f16).
    pub ann_dtype: Option<crate::indexers::ann::AnnDtype>,
    /// sqlite:// only: the recall@10 the ANN's search ef is measured to reach (above 0.5, at
    /// most 1); unset: what the index records (0.95).
    pub ann_recall: Option<f64>,
}

/// The index used when none is named.
pub const DEFAULT_INDEX: &str = "sqlite://ragline.db";

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            uri: Parsed::new(
                DEFAULT_INDEX,
                DEFAULT_INDEX.parse().expect("the default index URI parses"),
            ),
            prune: false,
            batch_size: crate::indexers::batch::DEFAULT_MAX_ITEMS,
            batch_bytes: crate::indexers::batch::DEFAULT_MAX_BYTES,
            batch_timeout_ms: 100,
            indexers: None,
            ann: None,
            ann_dtype: None,
            ann_recall: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// CPU worker threads (extract, chunk, tokenize); default: the number of cores.
    pub workers: Option<usize>,
    /// auto (bars on a terminal, log lines otherwise), bars, log or none.
    pub progress: Progress,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            workers: None,
            progress: Progress::Auto,
        }
    }
}

/// How a run shows its progress.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Progress {
    Auto,
    Bars,
    Log,
    None,
}

impl FromStr for Progress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Progress::Auto),
            "bars" => Ok(Progress::Bars),
            "log" => Ok(Progress::Log),
            "none" => Ok(Progress::None),
            other => Err(format!(
                "unknown progress `{other}`: use auto, bars, log or none"
            )),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StagesConfig {
    pub embed: EmbedStageConfig,
    /// The `sparse` stage (off unless it has a `model`).
    pub sparse: SparseStageConfig,
    /// The `entities` stage (off unless it has a `model`).
    pub entities: EntitiesStageConfig,
    /// The `labels` stage (off unless it has a `model`).
    pub labels: LabelsStageConfig,
    /// The `summary` LLM stage (off unless it has a `url`).
    pub summary: LlmStageConfig,
    /// More LLM stages, each with its own `name` and prompt.
    pub llm: Vec<LlmStageConfig>,
}

impl StagesConfig {
    /// The LLM stages that are on, `summary` first.
    pub fn llm_stages(&self) -> Vec<&LlmStageConfig> {
        std::iter::once(&self.summary)
            .chain(&self.llm)
            .filter(|s| s.enabled())
            .collect()
    }
}

/// The sparse stage: sparse (SPLADE) vectors of every chunk, beside the dense ones. Its
/// retries and leases are the embed stage's.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SparseStageConfig {
    /// The SPLADE model (a folder, a name under models/, a hub id); the index records it, so
    /// `enrich` and `search --mode sparse` need it only the first time.
    pub model: Option<String>,
    /// Stages it waits for beyond `chunk`.
    pub depends_on: Vec<String>,
}

/// The entities stage: named entities of each document's chunks from a token-classification
/// (NER) model, gathered per document (type, most frequent form, normalised form, mentions,
/// best score). Its retries and leases are the embed stage's.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EntitiesStageConfig {
    /// The `*ForTokenClassification` model (a folder, a name under models/, a hub id); unset:
    /// the stage is off.
    pub model: Option<String>,
    /// How sub-word predictions become entities, as transformers' `aggregation_strategy`:
    /// simple, first, average or max (`none` gives tokens, not entities).
    pub aggregation: String,
    /// Mentions scored lower are left out.
    pub min_score: f32,
    /// Stages it waits for beyond `chunk`.
    pub depends_on: Vec<String>,
}

impl Default for EntitiesStageConfig {
    fn default() -> Self {
        EntitiesStageConfig {
            model: None,
            aggregation: "first".into(),
            min_score: 0.5,
            depends_on: Vec::new(),
        }
    }
}

/// The labels stage: a document's labels from a sequence-classification model: each chunk
/// scored, the scores averaged weighted by the chunks' tokens, the best kept. Its retries and
/// leases are the embed stage's.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LabelsStageConfig {
    /// The `*ForSequenceClassification` model (a folder, a name under models/, a hub id);
    /// unset: the stage is off.
    pub model: Option<String>,
    /// Labels kept per document, at most (best first).
    pub top_k: usize,
    /// Labels whose averaged score is lower are not kept.
    pub threshold: f32,
    /// Stages it waits for beyond `chunk`.
    pub depends_on: Vec<String>,
}

impl Default for LabelsStageConfig {
    fn default() -> Self {
        LabelsStageConfig {
            model: None,
            top_k: 3,
            threshold: 0.2,
            depends_on: Vec::new(),
        }
    }
}

impl StagesConfig {
    /// The stage graph of this config: every stage that is on (embed always) with what it
    /// depends on, checked (unknown names, cycles).
    pub fn graph(&self) -> Result<crate::lifecycle::StageGraph, crate::lifecycle::GraphError> {
        use crate::lifecycle::{EMBED, ENTITIES, LABELS, SPARSE};
        let mut stages: Vec<(String, Vec<String>)> = vec![(EMBED.into(), Vec::new())];
        if self.sparse.model.is_some() {
            stages.push((SPARSE.into(), self.sparse.depends_on.clone()));
        }
        if self.entities.model.is_some() {
            stages.push((ENTITIES.into(), self.entities.depends_on.clone()));
        }
        if self.labels.model.is_some() {
            stages.push((LABELS.into(), self.labels.depends_on.clone()));
        }
        for l in self.llm_stages() {
            stages.push((l.name.clone(), l.depends_on.clone()));
        }
        crate::lifecycle::StageGraph::new(stages)
    }

    /// Check the stage graph and what the LLM stages' prompts use of it.
    fn validate_graph(&self) -> Result<(), ConfigError> {
        let graph = self
            .graph()
            .map_err(|e| ConfigError::Value(format!("stages: {e}")))?;
        let names: Vec<String> = graph.stages().map(str::to_string).collect();
        for l in self.llm_stages() {
            for slot in super::services::prompt_slots(&l.prompt) {
                if names.iter().any(|n| n == slot) && !l.depends_on.iter().any(|d| d == slot) {
                    return Err(ConfigError::Value(format!(
                        "stages.{}.prompt uses {{{slot}}}, but the stage does not depend on \
                         `{slot}`: add depends_on = [\"{slot}\"] so that it waits for it",
                        l.name
                    )));
                }
            }
        }
        if let Some(bad) = [&self.entities.aggregation].into_iter().find(|a| {
            a.parse::<crate::embed::ner::aggregate::Aggregation>()
                .map_or(true, |a| {
                    a == crate::embed::ner::aggregate::Aggregation::None
                })
        }) {
            return Err(ConfigError::Value(format!(
                "stages.entities.aggregation = `{bad}`: use simple, first, average or max \
                 (none gives tokens, not entities)"
            )));
        }
        if self.labels.top_k == 0 {
            return Err(ConfigError::Value(
                "stages.labels.top_k must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// The embed stage's settings.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EmbedStageConfig {
    /// `ingest` writes documents and chunks (keyword-searchable at once) and leaves the
    /// embedding to `ragline enrich`.
    pub defer: bool,
    /// Attempts before a document is dead-lettered.
    pub retry_limit: u32,
    /// Wait before the first retry ("500ms", "2s", "1m"); doubled each attempt, with jitter.
    #[serde(with = "human_duration")]
    pub backoff: Duration,
    /// The longest wait between retries.
    #[serde(with = "human_duration")]
    pub max_backoff: Duration,
    /// How long a claim holds its documents before another worker may take them (renewed
    /// while a long batch runs).
    #[serde(with = "human_duration")]
    pub visibility_timeout: Duration,
    /// Worker threads of `enrich` (one per device for several GPUs).
    pub concurrency: usize,
    /// The priority new work is queued at: interactive, fresh or backfill.
    pub priority: Priority,
    /// Embed with a service instead of a model in this process.
    pub remote: RemoteEmbedConfig,
}

impl Default for EmbedStageConfig {
    fn default() -> Self {
        let d = StageSettings::default();
        EmbedStageConfig {
            defer: false,
            retry_limit: d.retry_limit,
            backoff: d.backoff,
            max_backoff: d.max_backoff,
            visibility_timeout: d.visibility_timeout,
            concurrency: d.concurrency,
            priority: d.priority,
            remote: RemoteEmbedConfig::default(),
        }
    }
}

impl EmbedStageConfig {
    pub fn settings(&self) -> StageSettings {
        StageSettings {
            retry_limit: self.retry_limit,
            backoff: self.backoff,
            max_backoff: self.max_backoff,
            visibility_timeout: self.visibility_timeout,
            concurrency: self.concurrency,
            priority: self.priority,
        }
    }
}

impl PipelineConfig {
    /// Read `path` if given (it must exist), else `ragline.toml` in the working folder if there
    /// is one, else the defaults. Returns the file read too.
    pub fn load(path: Option<&Path>) -> Result<(Self, Option<PathBuf>), ConfigError> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None => {
                let p = PathBuf::from(DEFAULT_CONFIG_FILE);
                if !p.is_file() {
                    return Ok((PipelineConfig::default(), None));
                }
                p
            }
        };
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::Unreadable {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let config = Self::parse(&text).map_err(|e| ConfigError::Invalid {
            path: path.clone(),
            message: e.0,
        })?;
        Ok((config, Some(path)))
    }

    /// Parse TOML text; the error names the line and the key.
    pub fn parse(text: &str) -> Result<Self, BadValue> {
        toml::from_str(text).map_err(|e| BadValue(e.to_string().trim_end().to_string()))
    }

    /// Check what can be checked without any I/O; the message names the key and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Value(m));
        if self.chunk.tokens == 0 {
            return bad("chunk.tokens (--chunk-tokens) must be at least 1".into());
        }
        if self.chunk.overlap * 2 >= self.chunk.tokens {
            return bad(format!(
                "chunk.overlap (--chunk-overlap) = {} must be less than half of chunk.tokens \
                 = {}; lower it",
                self.chunk.overlap, self.chunk.tokens
            ));
        }
        if self.source.max_file_seconds == 0 {
            return bad("source.max_file_seconds (--max-file-seconds) must be at least 1".into());
        }
        if self.source.max_extract_mb < 16 {
            return bad(
                "source.max_extract_mb (--max-extract-mb) must be at least 16: parsers need some \
                 room"
                    .into(),
            );
        }
        if self.run.workers == Some(0) {
            return bad("run.workers (--workers) must be at least 1".into());
        }
        if self.index.indexers == Some(0)
            || self.index.batch_size == 0
            || self.index.batch_bytes == 0
        {
            return bad(
                "index.indexers, index.batch_size and index.batch_bytes must be at least 1".into(),
            );
        }
        if let Some(r) = self.index.ann_recall {
            if let Err(e) = crate::indexers::ann::parse_recall(&r.to_string()) {
                return bad(format!("index.ann_recall (--ann-recall): {e}"));
            }
        }
        let e = &self.stages.embed;
        if e.retry_limit == 0 {
            return bad("stages.embed.retry_limit must be at least 1 (1: no retries)".into());
        }
        if e.concurrency == 0 {
            return bad("stages.embed.concurrency must be at least 1".into());
        }
        if e.visibility_timeout < Duration::from_secs(1) {
            return bad(format!(
                "stages.embed.visibility_timeout = {} is too short for a batch to finish; \
                 use at least 1s",
                human_duration::show(e.visibility_timeout)
            ));
        }
        if e.max_backoff < e.backoff {
            return bad("stages.embed.max_backoff must not be shorter than backoff".into());
        }
        e.remote.validate()?;
        self.stages.validate_graph()?;
        let mut names = std::collections::HashSet::new();
        for stage in std::iter::once(&self.stages.summary).chain(&self.stages.llm) {
            stage.validate()?;
            if stage.enabled() && !names.insert(stage.name.as_str()) {
                return bad(format!(
                    "two LLM stages are named `{}`: give each [[stages.llm]] its own name",
                    stage.name
                ));
            }
        }
        Ok(())
    }

    /// Write to the index at `uri` (`--index`, `index=`).
    pub fn set_index(&mut self, uri: &str) -> Result<(), ConfigError> {
        self.index.uri =
            Parsed::parse(uri).map_err(|e| ConfigError::Value(format!("bad --index: {e}")))?;
        Ok(())
    }

    /// The resolved pipeline as TOML (for `ragline check`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot show the pipeline: {e}"))
    }
}

/// A value that does not parse (a flag's, a key's, a settings text's): the message says which
/// and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct BadValue(pub String);

/// A value kept with the text it was parsed from, so the resolved pipeline prints as it was
/// written.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed<T> {
    pub text: String,
    pub value: T,
}

impl<T> Parsed<T> {
    pub fn new(text: &str, value: T) -> Self {
        Parsed {
            text: text.to_string(),
            value,
        }
    }
}

impl<T: FromStr> Parsed<T>
where
    T::Err: fmt::Display,
{
    /// Parse a flag's value.
    pub fn parse(text: &str) -> Result<Self, BadValue> {
        text.parse::<T>()
            .map(|value| Parsed::new(text, value))
            .map_err(|e| BadValue(e.to_string()))
    }
}

impl<'de, T: FromStr> Deserialize<'de> for Parsed<T>
where
    T::Err: fmt::Display,
{
    /// From the text a flag or a keyword gives (`"cuda:0"`, `"bf16"`).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        parsed(d)
    }
}

fn parsed<'de, D, T>(d: D) -> Result<Parsed<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let text = String::deserialize(d)?;
    Parsed::parse(&text).map_err(serde::de::Error::custom)
}

fn shown<S: Serializer, T>(v: &Parsed<T>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.text)
}

/// A URI as it parses back, without the password it may hold.
fn shown_redacted<S: Serializer>(v: &Parsed<IndexUri>, s: S) -> Result<S::Ok, S::Error> {
    match &v.value {
        #[cfg(feature = "postgres")]
        IndexUri::Postgres(_) => s.serialize_str(&v.value.to_string()),
        _ => s.serialize_str(&v.text),
    }
}

/// Durations written as "250ms", "2s", "5m", "1h".
pub mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn parse(text: &str) -> Result<Duration, super::BadValue> {
        let bad = || {
            super::BadValue(format!(
                "bad duration `{text}`: use e.g. 250ms, 2s, 5m or 1h"
            ))
        };
        let t = text.trim();
        let at = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let (n, unit) = t.split_at(at);
        let n: u64 = n.parse().map_err(|_| bad())?;
        match unit {
            "ms" => Ok(Duration::from_millis(n)),
            "s" => Ok(Duration::from_secs(n)),
            "m" => Ok(Duration::from_secs(n * 60)),
            "h" => Ok(Duration::from_secs(n * 3600)),
            _ => Err(bad()),
        }
    }

    pub fn show(d: Duration) -> String {
        let ms = d.as_millis();
        if ms.is_multiple_of(3_600_000) && ms > 0 {
            format!("{}h", ms / 3_600_000)
        } else if ms.is_multiple_of(60_000) && ms > 0 {
            format!("{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&show(*d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_parses_and_unknown_keys_and_wrong_types_name_their_line() {
        let good = r#"
[source]
paths = ["docs"]

[model]
device = "cpu"

[chunk]
tokens = 128
overlap = 16

[index]
uri = "sqlite://x.db"

[stages.embed]
defer = true
backoff = "250ms"
priority = "backfill"
"#;
        let c = PipelineConfig::parse(good).unwrap();
        assert_eq!(c.chunk.tokens, 128);
        assert_eq!(c.model.device.value, DeviceChoice::Cpu);
        assert_eq!(c.index.uri.value, IndexUri::Sqlite("x.db".into()));
        assert_eq!(c.stages.embed.backoff, Duration::from_millis(250));
        assert_eq!(c.stages.embed.priority, Priority::Backfill);
        assert!(c.stages.embed.defer);
        // What is not written keeps its default.
        assert_eq!(c.stages.embed.retry_limit, 5);
        c.validate().unwrap();
        // The resolved pipeline reads back as the same pipeline.
        assert_eq!(PipelineConfig::parse(&c.to_toml()).unwrap(), c);

        let unknown = "[chunk]\ntokens = 128\nsize = 3\n";
        let e = PipelineConfig::parse(unknown).unwrap_err().0;
        assert!(
            e.contains("line 3") && e.contains("unknown field `size`"),
            "{e}"
        );

        let wrong = "[chunk]\n\ntokens = \"many\"\n";
        let e = PipelineConfig::parse(wrong).unwrap_err().0;
        assert!(e.contains("line 3") && e.contains("invalid type"), "{e}");

        let bad_duration = "[stages.embed]\nbackoff = \"soon\"\n";
        let e = PipelineConfig::parse(bad_duration).unwrap_err().0;
        assert!(e.contains("line 2") && e.contains("bad duration"), "{e}");

        let bad_device = "[model]\ndevice = \"tpu\"\n";
        let e = PipelineConfig::parse(bad_device).unwrap_err().0;
        assert!(e.contains("unknown device `tpu`"), "{e}");
    }

    #[test]
    fn values_that_cannot_work_are_refused_with_their_key() {
        let mut c = PipelineConfig::default();
        c.chunk.overlap = 200;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("chunk.overlap"), "{e}");
        let mut c = PipelineConfig::default();
        c.stages.embed.visibility_timeout = Duration::from_millis(10);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("visibility_timeout"), "{e}");
    }

    #[test]
    fn durations_round_trip() {
        for s in ["250ms", "2s", "5m", "1h", "0s"] {
            assert_eq!(human_duration::show(human_duration::parse(s).unwrap()), s);
        }
        assert!(human_duration::parse("5 parsecs").is_err());
        assert!(human_duration::parse("s").is_err());
    }
}
