//! What a command is asked to do, typed: the flags clap parses and the keywords the Python
//! package passes fill the same structs (`IngestRequest`, `ModelRequest`, `RemoteRequest`),
//! and each puts itself over the [`PipelineConfig`] the same way. The CLI prints what the job
//! returns; the Python package hands it back as Python objects. No argv, no JSON text between.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Deserializer};

use super::config::{ConfigError, ModelConfig, Parsed};
use super::{JobError, PipelineConfig, Progress};
use crate::embed::{DTypeChoice, DeviceChoice};
use crate::http::embed::EmbedApi;
use crate::indexers::ann::{AnnDtype, AnnMode};
use crate::run::{Observer, RunSummary};

/// What `ragline ingest` and `ragline.ingest()` ask for. Every field is a flag of `ingest`
/// (its doc comment is the flag's help) and a keyword of the Python function (the flag with
/// underscores); an unknown keyword is refused by name.
#[derive(Args, Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields, default)]
pub struct IngestRequest {
    /// Files and folders to ingest [default: `paths` under [source] in ragline.toml]. Folders
    /// are walked for .md, .markdown, .mdx, .html, .htm, .txt, .rst and .jsonl files (one
    /// document per line). A database table is a URL: 'sqlite://FILE?table=T&text=body' or
    /// 'postgres://user@host/db?table=T&id=id&text=title,body&updated=updated_at'; also
    /// s3://, gs://, az:// prefixes, http(s):// sites, sitemaps and feeds, and a NATS
    /// JetStream subject, 'nats://HOST:4222/docs.>' (README: Sources).
    pub paths: Vec<PathBuf>,

    /// Where to write: sqlite://PATH (the embedded index: vectors, full text, incremental
    /// re-runs, the enrichment queue), jsonl:PATH (one JSON object per document or chunk),
    /// null: (discard). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    pub index: Option<String>,

    /// Leave a stage to `ragline enrich`: `--defer embed` writes documents and chunks
    /// (searchable by keyword at once) and queues their embedding.
    #[arg(long, value_name = "STAGE")]
    pub defer: Option<String>,

    /// Also give every chunk a sparse (SPLADE) vector from this model (a folder, a name under
    /// models/, a hub id; `scripts/fetch-model.sh splade-tiny`), for `search --mode sparse`
    /// and `--fuse dense,sparse,keyword`: the `sparse` stage, worked after the chunks are
    /// written (queued for `ragline enrich` with --defer embed). The index records the model.
    #[arg(long, value_name = "MODEL")]
    pub sparse_model: Option<String>,

    /// Also find the named entities of every document with this token-classification model
    /// (a `*ForTokenClassification` folder, name under models/ or hub id): the `entities`
    /// stage (`[stages.entities]`), for `search --where entity.ORG=...` and `ragline entities`.
    #[arg(long, value_name = "MODEL")]
    pub ner_model: Option<String>,

    /// Also label every document with this sequence-classification model (a
    /// `*ForSequenceClassification` model): the `labels` stage (`[stages.labels]`), for
    /// `search --where label=...`.
    #[arg(long, value_name = "MODEL")]
    pub classifier_model: Option<String>,

    /// Delete from the index the documents whose source is gone, and the vectors of a model a
    /// finished migration retired.
    #[arg(long)]
    pub prune: bool,

    /// The approximate nearest-neighbour index of a sqlite:// index, kept by the indexers as
    /// they write: `auto` builds it once a vector set passes 50,000 chunks, `hnsw` always,
    /// `none` never (and drops one). Recorded in the index for later runs. [default: auto]
    #[arg(long, value_name = "auto|hnsw|none")]
    pub ann: Option<AnnMode>,

    /// What the ANN stores: f16 (2 bytes a dimension), int8 (1) or binary (1 bit); answers
    /// are re-scored against the f32 vectors either way. [default: f16]
    #[arg(long, value_name = "f16|int8|binary")]
    pub ann_dtype: Option<AnnDtype>,

    /// The recall@10 the ANN's search is tuned to: after each build (and each time the set
    /// doubles) ef is measured on stored vectors against the exact scan and the smallest that
    /// reaches it is kept (`ragline status` shows both). [default: 0.95]
    #[arg(long, value_name = "R", value_parser = crate::indexers::ann::parse_recall)]
    pub ann_recall: Option<f64>,

    /// CPU worker threads (extract, chunk, tokenize) [default: the number of cores].
    #[arg(long)]
    pub workers: Option<usize>,

    /// Indexer threads writing to the index. [default: 1; 2 for postgres://, where one
    /// writer leaves the server waiting on it]
    #[arg(long)]
    pub indexers: Option<usize>,

    /// Write the summary and every failure and drop (document, stage, reason) as JSON.
    #[arg(long)]
    pub report: Option<PathBuf>,

    /// Index whole documents: no chunking, no embedding, no model needed.
    #[arg(long)]
    pub no_chunk: bool,

    /// Chunk size to aim for, in model tokens (at most the model's limit). [default: 256]
    #[arg(long)]
    pub chunk_tokens: Option<usize>,

    /// Tokens shared by consecutive chunks of a section. [default: 32]
    #[arg(long)]
    pub chunk_overlap: Option<usize>,

    /// One chunk per document, its first tokens up to the model's limit; the rest is not
    /// indexed (what sentence-transformers' encode does with long texts).
    #[arg(long)]
    pub truncate: bool,

    #[command(flatten)]
    #[serde(flatten)]
    pub model: ModelRequest,

    #[command(flatten)]
    #[serde(flatten)]
    pub remote: RemoteRequest,

    /// File extensions to take from folders (comma-separated), instead of the default list.
    #[arg(long, value_delimiter = ',')]
    #[serde(deserialize_with = "comma_list")]
    pub ext: Vec<String>,

    /// Globs (relative to each folder given) of files to take, instead of the extension list.
    #[arg(long)]
    #[serde(deserialize_with = "one_or_more")]
    pub include: Vec<String>,

    /// Globs (relative to each folder given) of files to leave out.
    #[arg(long)]
    #[serde(deserialize_with = "one_or_more")]
    pub exclude: Vec<String>,

    /// Files larger than this many bytes are reported as failed instead of read.
    /// [default: 104857600]
    #[arg(long)]
    pub max_file_bytes: Option<u64>,

    /// Feeds (http:// and https:// URLs): index the page each entry links to (on the feed's
    /// own host) instead of the entry's content.
    #[arg(long)]
    pub follow_links: bool,

    /// Web crawls (an http:// or https:// URL of an HTML page): how many links from the start
    /// page are followed (0: the start page only). [default: 5]
    #[arg(long, value_name = "N")]
    pub crawl_depth: Option<u32>,

    /// Web crawls and sitemaps: read at most this many pages. [default: 10000]
    #[arg(long, value_name = "N")]
    pub crawl_max_pages: Option<usize>,

    /// Web crawls and sitemaps: requests per second to the site (robots.txt's Crawl-delay
    /// slows it further). [default: 8]
    #[arg(long, value_name = "R")]
    pub crawl_rps: Option<f64>,

    /// Web sources: seconds one GET may take; a page past it fails. [default: 30]
    #[arg(long, value_name = "SECS")]
    pub fetch_timeout: Option<f64>,

    /// Web sources: also connect to private, loopback and link-local addresses (an intranet
    /// site by its name). Without it they are read only when the source's own URL names one
    /// (http://127.0.0.1:8080/, http://10.0.0.7/wiki/); a public name that resolves to one (DNS
    /// rebinding, a cloud's metadata service) is refused.
    #[arg(long)]
    pub allow_private_addresses: bool,

    /// Extract each file in a child process, so a crash inside a third-party parser that no
    /// thread can contain (a stack overflow, an abort) fails that file alone instead of the
    /// run. Costs a copy of each file's bytes and text through a pipe (BENCHMARKS.md).
    #[arg(long)]
    pub isolate_extraction: bool,

    /// Object stores (s3://, gs://, az://) and feeds with --follow-links: how many objects or
    /// pages are downloaded at once. [default: 16]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub fetch_concurrency: Option<u16>,

    /// Seconds one file may take to extract; past it the file fails with the reason and the
    /// run goes on. [default: 60]
    #[arg(long)]
    pub max_file_seconds: Option<u64>,

    /// MiB one file's extraction may hold (what its parser allocated and still holds); past
    /// it the file fails with the reason and the run goes on. [default: 1024]
    #[arg(long, value_name = "MIB")]
    pub max_extract_mb: Option<u64>,

    /// JSONL: the field holding the document id [default: id, else _id, else FILE:LINE].
    #[arg(long)]
    pub id_field: Option<String>,

    /// JSONL: the field holding the text. [default: text]
    #[arg(long)]
    pub text_field: Option<String>,

    /// JSONL: the field holding the title. [default: title]
    #[arg(long)]
    pub title_field: Option<String>,

    /// JSONL: put the title at the head of the text, so it is chunked and embedded with it.
    #[arg(long)]
    pub title_in_text: bool,

    /// Items per bulk write, at most. [default: 1024]
    #[arg(long)]
    pub batch_size: Option<usize>,

    /// Bytes per bulk write, at most. [default: 8388608]
    #[arg(long)]
    pub batch_bytes: Option<usize>,

    /// Milliseconds a partial bulk write waits for more items. [default: 100]
    #[arg(long)]
    pub batch_timeout_ms: Option<u64>,

    /// Progress display: auto (bars on a terminal, log lines otherwise), bars, log, none.
    #[arg(long)]
    pub progress: Option<Progress>,

    /// Run distributed through a NATS JetStream broker: this process reads the sources and
    /// follows the run to its end; `ragline worker`, `embedder` and `indexer` processes
    /// started with the same URL (on any machine) do the work. nats://HOST:PORT[,nats://...]
    /// with optional ?prefix=NAME&replicas=N&ack_wait=SECS&max_deliver=N&max_pending=N&limit=N.
    #[arg(long, env = "RAGLINE_QUEUE", value_name = "URL")]
    pub queue: Option<String>,
}

impl IngestRequest {
    /// The names of the request's fields (the flags with underscores): what the Python
    /// package's `ingest(**options)` takes.
    pub fn keywords() -> Vec<String> {
        use clap::Args as _;
        IngestRequest::augment_args(clap::Command::new("ingest"))
            .get_arguments()
            .map(|a| a.get_id().as_str().to_string())
            .collect()
    }

    /// The pipeline this request runs: `config_file` (or ./ragline.toml, or the defaults)
    /// with the request over it.
    pub fn config(&self, config_file: Option<&Path>) -> Result<PipelineConfig, JobError> {
        let mut config = PipelineConfig::load(config_file)?.0;
        self.apply(&mut config)?;
        Ok(config)
    }

    /// The request's values, over `config`: each one given replaces the config's.
    pub fn apply(&self, config: &mut PipelineConfig) -> Result<(), ConfigError> {
        if let Some(uri) = &self.index {
            config.set_index(uri)?;
        }
        self.apply_source(config);
        self.model.apply(&mut config.model);
        self.remote.apply(config)?;
        self.apply_chunking(config);
        self.apply_index(config);
        self.apply_stages(config)
    }

    /// Where documents come from and how they are read.
    fn apply_source(&self, config: &mut PipelineConfig) {
        let src = &mut config.source;
        replace_list(&mut src.paths, &self.paths);
        replace_list(&mut src.ext, &self.ext);
        replace_list(&mut src.include, &self.include);
        replace_list(&mut src.exclude, &self.exclude);
        replace(&mut src.max_file_bytes, self.max_file_bytes);
        replace(&mut src.max_file_seconds, self.max_file_seconds);
        replace(
            &mut src.fetch_concurrency,
            self.fetch_concurrency.map(usize::from),
        );
        src.follow_links |= self.follow_links;
        replace(&mut src.crawl_depth, self.crawl_depth);
        replace(&mut src.crawl_max_pages, self.crawl_max_pages);
        replace(&mut src.crawl_rps, self.crawl_rps);
        replace(&mut src.fetch_timeout, self.fetch_timeout);
        src.allow_private_addresses |= self.allow_private_addresses;
        src.isolate_extraction |= self.isolate_extraction;
        replace(&mut src.max_extract_mb, self.max_extract_mb);
        if self.id_field.is_some() {
            src.id_field = self.id_field.clone();
        }
        replace(&mut src.text_field, self.text_field.clone());
        replace(&mut src.title_field, self.title_field.clone());
        src.title_in_text |= self.title_in_text;
    }

    fn apply_chunking(&self, config: &mut PipelineConfig) {
        let chunk = &mut config.chunk;
        chunk.enabled &= !self.no_chunk;
        replace(&mut chunk.tokens, self.chunk_tokens);
        replace(&mut chunk.overlap, self.chunk_overlap);
        chunk.truncate |= self.truncate;
    }

    /// How the index is written, and the run's threads and display.
    fn apply_index(&self, config: &mut PipelineConfig) {
        let index = &mut config.index;
        index.prune |= self.prune;
        if self.ann.is_some() {
            index.ann = self.ann;
        }
        if self.ann_dtype.is_some() {
            index.ann_dtype = self.ann_dtype;
        }
        if self.ann_recall.is_some() {
            index.ann_recall = self.ann_recall;
        }
        if self.indexers.is_some() {
            index.indexers = self.indexers;
        }
        replace(&mut index.batch_size, self.batch_size);
        replace(&mut index.batch_bytes, self.batch_bytes);
        replace(&mut index.batch_timeout_ms, self.batch_timeout_ms);
        if self.workers.is_some() {
            config.run.workers = self.workers;
        }
        replace(&mut config.run.progress, self.progress);
    }

    /// The model stages asked for, and the one left to `ragline enrich`.
    fn apply_stages(&self, config: &mut PipelineConfig) -> Result<(), ConfigError> {
        let stages = &mut config.stages;
        if self.sparse_model.is_some() {
            stages.sparse.model = self.sparse_model.clone();
        }
        if self.ner_model.is_some() {
            stages.entities.model = self.ner_model.clone();
        }
        if self.classifier_model.is_some() {
            stages.labels.model = self.classifier_model.clone();
        }
        match self.defer.as_deref() {
            None => Ok(()),
            Some("embed") => {
                stages.embed.defer = true;
                Ok(())
            }
            Some(other) => Err(ConfigError::Value(format!(
                "--defer {other}: only `embed` can be deferred (chunking is what ingest does)"
            ))),
        }
    }

    /// Fail on an unwritable `report` before any work is done.
    pub fn check_report(&self) -> Result<(), JobError> {
        match &self.report {
            Some(path) => std::fs::File::create(path)
                .map(drop)
                .map_err(|source| JobError::Write {
                    what: "--report",
                    path: path.clone(),
                    source,
                }),
            None => Ok(()),
        }
    }

    /// The run's summary written where `report` says (pretty JSON), if it says.
    pub fn write_report(&self, summary: &RunSummary) -> Result<(), JobError> {
        let Some(path) = &self.report else {
            return Ok(());
        };
        let json =
            serde_json::to_vec_pretty(summary).expect("a run summary serializes: this is a bug");
        std::fs::write(path, json).map_err(|source| JobError::Write {
            what: "--report",
            path: path.clone(),
            source,
        })
    }
}

/// One ingest run as `request` asks, over `config` (the request already applied): on a broker
/// when `queue` names one, else in this process followed by the model stages; its summary
/// written to `report`. What `ragline ingest` runs each pass and `ragline.ingest()` once.
pub fn ingest(
    request: &IngestRequest,
    config: &PipelineConfig,
    observer: &mut dyn Observer,
) -> Result<RunSummary, JobError> {
    let summary = match &request.queue {
        #[cfg(feature = "nats")]
        Some(url) => super::distributed::ingest(config, url, observer)?,
        #[cfg(not(feature = "nats"))]
        Some(_) => {
            return Err(JobError::NotBuilt {
                what: "ingest --queue".into(),
                feature: "nats",
            })
        }
        None => {
            let mut summary = super::ingest(config, observer)?;
            super::model_stages::after_ingest(config, &mut summary, observer)?;
            summary
        }
    };
    request.write_report(&summary)?;
    Ok(summary)
}

/// `value` over `slot` when given.
fn replace<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

/// `values` over `slot` when any are given.
fn replace_list<T: Clone>(slot: &mut Vec<T>, values: &[T]) {
    if !values.is_empty() {
        *slot = values.to_vec();
    }
}

/// A list of strings given as a list or as one string (Python's `exclude="drafts/*"`).
fn one_or_more<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMore {
        One(String),
        More(Vec<String>),
    }
    Ok(match OneOrMore::deserialize(d)? {
        OneOrMore::One(s) => vec![s],
        OneOrMore::More(v) => v,
    })
}

/// `--ext md,txt` as a keyword: a list, or one comma-separated string as the flag takes.
fn comma_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(one_or_more(d)?
        .iter()
        .flat_map(|s| s.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

/// The model flags: what runs the embedding model and how. Each overrides the `[model]`
/// section of ragline.toml when given.
#[derive(Args, Deserialize, Clone, Debug, Default)]
#[serde(default)]
pub struct ModelRequest {
    /// The embedding model: a folder in the Hugging Face layout, or a hub id (downloaded
    /// through the Hugging Face cache; HF_HUB_OFFLINE=1 uses the cache only). A hub id is
    /// also looked for under ./models/ and $RAGLINE_MODELS, where scripts/fetch-model.sh
    /// puts it. [default: sentence-transformers/all-MiniLM-L6-v2]
    #[arg(long, env = "RAGLINE_MODEL")]
    pub model: Option<String>,

    /// Where the model runs: auto (CUDA, then Metal, then the CPU), cpu, cuda, cuda:N,
    /// cuda:0,1 (one embedder per GPU) or metal. [default: auto]
    #[arg(long, env = "RAGLINE_DEVICE", value_parser = Parsed::<DeviceChoice>::parse)]
    pub device: Option<Parsed<DeviceChoice>>,

    /// Number format of the model: auto (f32 on the CPU, f16 on a GPU), f32, f16, bf16, int8.
    /// On the CPU, bf16 needs AVX512-BF16 and int8 AVX512-VNNI (and the avx512 kernels);
    /// both are opt-in, lossy, and measured in BENCHMARKS.md.
    #[arg(long, value_parser = Parsed::<DTypeChoice>::parse)]
    pub dtype: Option<Parsed<DTypeChoice>>,

    /// Padded tokens per forward pass [default: 2048 on the CPU, 32768 on a GPU].
    #[arg(long)]
    pub batch_tokens: Option<usize>,

    /// How long, in milliseconds, the first chunk of a batch waits for more to arrive.
    /// [default: 50]
    #[arg(long)]
    pub max_wait_ms: Option<u64>,

    /// Text put before each query, overriding the model's own prompt ("query: " for E5); ""
    /// for none.
    #[arg(long)]
    pub query_prompt: Option<String>,

    /// Text put before each document (passage), overriding the model's own prompt
    /// ("passage: " for E5); "" for none.
    #[arg(long, visible_alias = "passage-prompt")]
    pub document_prompt: Option<String>,

    /// Cut vectors to their first N dimensions, re-normalised (Matryoshka models); at most
    /// the model's dimension. Recorded in the index's vector set.
    #[arg(long)]
    pub dimensions: Option<usize>,
}

impl ModelRequest {
    /// The flags given, over `config`.
    pub fn apply(&self, config: &mut ModelConfig) {
        if let Some(m) = &self.model {
            config.name = m.clone();
        }
        if let Some(d) = &self.device {
            config.device = d.clone();
        }
        if let Some(d) = &self.dtype {
            config.dtype = d.clone();
        }
        if self.batch_tokens.is_some() {
            config.batch_tokens = self.batch_tokens;
        }
        if let Some(w) = self.max_wait_ms {
            config.max_wait_ms = w;
        }
        if self.query_prompt.is_some() {
            config.query_prompt = self.query_prompt.clone();
        }
        if self.document_prompt.is_some() {
            config.passage_prompt = self.document_prompt.clone();
        }
        if self.dimensions.is_some() {
            config.dimensions = self.dimensions;
        }
    }

    /// The model settings: ragline.toml's `[model]` with these flags over it.
    pub fn resolve(&self, config: &PipelineConfig) -> ModelConfig {
        let mut m = config.model.clone();
        self.apply(&mut m);
        m
    }
}

/// The flags that make the embed stage call a service instead of a model in this process
/// (`ingest`, `enrich`, `embed`). Each overrides `[stages.embed.remote]` of ragline.toml. The
/// API key is never a flag: it is read from the variable `--embed-api-key-env` (or
/// `api_key_env`) names, and no key is sent unless one is named.
#[derive(Args, Deserialize, Clone, Debug, Default)]
#[serde(default)]
pub struct RemoteRequest {
    /// Embed with a service at this base URL instead of in this process: an OpenAI-compatible
    /// server (OpenAI, vLLM, Infinity, Ollama, `ragline serve`) or Hugging Face TEI. --model
    /// still names the tokenizer that sizes the chunks; its weights are not loaded.
    #[arg(long, env = "RAGLINE_EMBED_URL", value_name = "URL")]
    pub embed_url: Option<String>,

    /// The service's API: openai (POST /v1/embeddings) or tei (POST /embed). [default: openai]
    #[arg(long, value_parser = Parsed::<EmbedApi>::parse, value_name = "API")]
    pub embed_api: Option<Parsed<EmbedApi>>,

    /// The model name sent to an OpenAI-compatible service (needed there; TEI ignores it).
    #[arg(long, value_name = "NAME")]
    pub embed_model: Option<String>,

    /// The environment variable holding the service's API key (e.g. OPENAI_API_KEY), sent as
    /// a bearer token, only over https or to a loopback address. Without it no key is sent.
    #[arg(long, value_name = "VAR")]
    pub embed_api_key_env: Option<String>,
}

impl RemoteRequest {
    /// The flags given, over `config`.
    pub fn apply(&self, config: &mut PipelineConfig) -> Result<(), ConfigError> {
        let r = &mut config.stages.embed.remote;
        if let Some(url) = &self.embed_url {
            r.url = Some(url.clone());
        }
        if let Some(api) = &self.embed_api {
            r.api = api.value;
        }
        if let Some(m) = &self.embed_model {
            r.model = Some(m.clone());
        }
        if let Some(v) = &self.embed_api_key_env {
            r.api_key_env = Some(v.clone());
        }
        if r.url.is_none()
            && (self.embed_api.is_some()
                || self.embed_model.is_some()
                || self.embed_api_key_env.is_some())
        {
            return Err(ConfigError::Value(
                "--embed-api, --embed-model and --embed-api-key-env need --embed-url (the \
                 service's URL, from you: a key is never sent to a URL read from an index)"
                    .into(),
            ));
        }
        Ok(())
    }
}
