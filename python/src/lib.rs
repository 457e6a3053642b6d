//! `ragline._ragline`: the Python package's extension. Thin: each function converts Python
//! values, releases the GIL, and calls what the `ragline` command calls, so vectors, chunks,
//! runs and hits are the command's own. `python/ragline/__init__.py` puts the Python-side
//! API (progress bars, report and hit objects) over it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use ragline::embed::tokenizer::TextTokenizer;
use ragline::embed::{DTypeChoice, DeviceChoice, EmbeddingModel};
use ragline::jobs::config::{ModelConfig, Parsed};
use ragline::jobs::{ConfigError, IngestRequest, JobError, PipelineConfig};
use ragline::run::{Observer, Snapshot};
use ragline::search::{Mode, Searcher, Where};
use ragline::stages::chunk::{ChunkConfig, SizeError, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS};

/// As the binary: mimalloc, and the counting that holds a parser to `--max-extract-mb`.
#[global_allocator]
static GLOBAL: ragline::memory::Counting<mimalloc::MiMalloc> =
    ragline::memory::Counting::new(mimalloc::MiMalloc);

const DEFAULT_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";

pyo3::create_exception!(
    _ragline,
    RaglineError,
    pyo3::exceptions::PyException,
    "What ragline could not do: a model it cannot find or load, an index it cannot open, a \
     run that could not start. The message names the problem and the fix."
);

/// A library error as a Python exception, with its causes (`a: b: c`) as the CLI prints them.
fn error(e: impl Into<anyhow::Error>) -> PyErr {
    RaglineError::new_err(format!("{:#}", e.into()))
}

/// A report of the library (a run's summary, hits, a status) as Python dicts and lists.
fn to_python<'py, T: serde::Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, value).map_err(|e| RaglineError::new_err(e.to_string()))
}

fn model_config(model: &str, device: &str, dtype: &str) -> PyResult<ModelConfig> {
    Ok(ModelConfig {
        name: model.to_string(),
        device: Parsed::<DeviceChoice>::parse(device)
            .map_err(|e| PyValueError::new_err(format!("device={device:?}: {e}")))?,
        dtype: Parsed::<DTypeChoice>::parse(dtype)
            .map_err(|e| PyValueError::new_err(format!("dtype={dtype:?}: {e}")))?,
        ..ModelConfig::default()
    })
}

/// `texts` as Rust strings: a sequence of str, each checked, the bad one named by its index.
fn strings(texts: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if texts.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "texts must be a list of str, not one str: wrap it, embed([text])",
        ));
    }
    let iter = texts.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "texts must be a list of str, not {}",
            type_name(texts)
        ))
    })?;
    let mut out = Vec::with_capacity(texts.len().unwrap_or(0));
    for (i, item) in iter.enumerate() {
        let item = item?;
        match item.extract::<String>() {
            Ok(s) => out.push(s),
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "texts[{i}] is {}, not str: every text must be a str",
                    type_name(&item)
                )))
            }
        }
    }
    Ok(out)
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an object".into())
}

/// Which prompt goes before each text.
enum Prompt<'a> {
    /// The model's prompt of this name, as sentence-transformers' `prompt_name`.
    Named(&'a str),
    /// What `encode` does without one: the model's default prompt, else none.
    Default,
    Query,
    Document,
}

/// A sentence-transformers embedding model, loaded once, embedding lists of texts.
///
/// Embedder(model="sentence-transformers/all-MiniLM-L6-v2", device="auto", dtype="auto",
///          query_prompt=None, document_prompt=None, dimensions=None, batch_tokens=None)
///
/// `model`: a hub id (looked for in ./models, $RAGLINE_MODELS and the Hugging Face cache,
/// downloaded when missing) or a folder in the Hugging Face layout. `device`: auto (CUDA,
/// then Metal, then the CPU), cpu, cuda, cuda:N or metal. `dtype`: auto (f32 on the CPU, f16
/// on a GPU), f32, f16, bf16 or int8. A model that cannot be found or loaded raises
/// RaglineError naming it.
#[pyclass(frozen, module = "ragline._ragline")]
struct Embedder {
    model: EmbeddingModel,
    batch_tokens: usize,
    device: String,
}

impl Embedder {
    fn prompt_ids(&self, prompt: Prompt<'_>) -> PyResult<Vec<u32>> {
        let m = &self.model;
        let named = match prompt {
            Prompt::Named(name) => Some(name.to_string()),
            Prompt::Default => m.files.default_prompt_name.clone(),
            Prompt::Query => return Ok(m.tokenizer.query_prompt_ids().to_vec()),
            Prompt::Document => return Ok(m.tokenizer.passage_prompt_ids().to_vec()),
        };
        match named {
            None => Ok(Vec::new()),
            Some(name) => {
                let text = m
                    .files
                    .prompt(&name)
                    .map_err(|e| PyValueError::new_err(format!("prompt_name={name:?}: {e}")))?;
                m.tokenizer.prompt_ids(text).map_err(error)
            }
        }
    }

    fn run<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        prompt: Prompt<'_>,
        dimensions: Option<usize>,
        batch_tokens: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let texts = strings(texts)?;
        let prompt = self.prompt_ids(prompt)?;
        let width = match dimensions {
            Some(n) if n == 0 || n > self.model.dimension() => {
                return Err(PyValueError::new_err(format!(
                    "dimensions={n}: model `{}` gives vectors of {} dimensions; ask for 1 to {}",
                    self.model.files.name,
                    self.model.dimension(),
                    self.model.dimension()
                )))
            }
            Some(n) => n,
            None => self.model.dimension(),
        };
        if batch_tokens == Some(0) {
            return Err(PyValueError::new_err("batch_tokens must be at least 1"));
        }
        let budget = batch_tokens.unwrap_or(self.batch_tokens);
        let model = &self.model;
        let flat = py
            .detach(|| -> Result<Vec<f32>, ragline::embed::EmbedError> {
                let mut flat = vec![0f32; texts.len() * width];
                ragline::embed::texts::embed_texts(model, &texts, &prompt, budget, |i, mut v| {
                    if width < v.len() {
                        model.shorten(&mut v, width)?;
                    }
                    flat[i * width..(i + 1) * width].copy_from_slice(&v);
                    Ok(())
                })?;
                Ok(flat)
            })
            .map_err(error)?;
        let rows = texts.len();
        Ok(PyArray1::from_vec(py, flat)
            .reshape([rows, width])?
            .into_any())
    }
}

#[pymethods]
impl Embedder {
    #[new]
    #[pyo3(signature = (model = DEFAULT_MODEL, device = "auto", dtype = "auto", query_prompt = None, document_prompt = None, dimensions = None, batch_tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &str,
        device: &str,
        dtype: &str,
        query_prompt: Option<String>,
        document_prompt: Option<String>,
        dimensions: Option<usize>,
        batch_tokens: Option<usize>,
    ) -> PyResult<Self> {
        let mut config = model_config(model, device, dtype)?;
        config.query_prompt = query_prompt;
        config.passage_prompt = document_prompt;
        config.dimensions = dimensions;
        config.batch_tokens = batch_tokens;
        py.detach(|| -> anyhow::Result<Embedder> {
            let files = ragline::jobs::model_files(&config.name)?;
            let devices = ragline::jobs::devices(&config)?;
            let model = ragline::jobs::load_model(&files, &devices[0], &config)?;
            Ok(Embedder {
                batch_tokens: ragline::jobs::batch_tokens(&config, &devices[0]),
                device: devices[0].label.clone(),
                model,
            })
        })
        .map_err(error)
    }

    /// One float32 row per text, shape (len(texts), dimension), as sentence-transformers'
    /// `encode`: `prompt_name` picks one of the model's prompts (default: the model's
    /// `default_prompt_name`, else none); `dimensions` cuts the vectors to their first N
    /// (re-normalised when the model normalises); `batch_tokens` caps the padded tokens of a
    /// forward pass. Runs with the GIL released. A text that is not a str raises TypeError
    /// naming its index.
    #[pyo3(signature = (texts, prompt_name = None, dimensions = None, batch_tokens = None))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        prompt_name: Option<&str>,
        dimensions: Option<usize>,
        batch_tokens: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let prompt = prompt_name.map_or(Prompt::Default, Prompt::Named);
        self.run(py, texts, prompt, dimensions, batch_tokens)
    }

    /// As `embed`, with the model's query prompt (or the Embedder's `query_prompt`):
    /// sentence-transformers' `encode_query`.
    #[pyo3(signature = (texts, dimensions = None, batch_tokens = None))]
    fn embed_query<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        dimensions: Option<usize>,
        batch_tokens: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, texts, Prompt::Query, dimensions, batch_tokens)
    }

    /// As `embed`, with the model's document prompt (or the Embedder's `document_prompt`):
    /// sentence-transformers' `encode_document`.
    #[pyo3(signature = (texts, dimensions = None, batch_tokens = None))]
    fn embed_documents<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        dimensions: Option<usize>,
        batch_tokens: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, texts, Prompt::Document, dimensions, batch_tokens)
    }

    /// The vectors' dimension.
    #[getter]
    fn dimension(&self) -> usize {
        self.model.dimension()
    }

    /// Tokens of a text the model reads (special tokens included); the rest is cut.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.model.tokenizer.max_len()
    }

    /// The model's name: its hub id, or the folder it was loaded from.
    #[getter]
    fn model_id(&self) -> String {
        self.model.files.name.clone()
    }

    /// Where the model runs (`cpu`, `cuda:0`, ...).
    #[getter]
    fn device(&self) -> String {
        self.device.clone()
    }

    /// Which encoder and kernels run the model.
    #[getter]
    fn encoder(&self) -> String {
        self.model.encoder_kind()
    }

    /// The model's named prompts (config_sentence_transformers.json).
    #[getter]
    fn prompts(&self) -> HashMap<String, String> {
        self.model.files.prompts.clone().into_iter().collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Embedder(model={:?}, device={:?}, dimension={})",
            self.model.files.name,
            self.device,
            self.model.dimension()
        )
    }
}

/// The tokenizers `chunk` loaded, by model name: a notebook chunks text after text.
fn tokenizer(model: &str) -> anyhow::Result<Arc<TextTokenizer>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<TextTokenizer>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(model) {
        return Ok(Arc::clone(t));
    }
    let files = ragline::jobs::model_files(model)?;
    let t = Arc::new(
        ragline::embed::service::load_tokenizer(&files)
            .map_err(|e| anyhow::anyhow!("model `{model}`: {e}"))?,
    );
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(model.to_string(), Arc::clone(&t));
    Ok(t)
}

/// `chunk(text, model, tokens, overlap, format)`: (text, heading_path, tokens, start, end)
/// per chunk, start and end in characters of the extracted text, and the extracted text.
#[pyfunction]
#[pyo3(signature = (text, model = DEFAULT_MODEL, tokens = DEFAULT_CHUNK_TOKENS, overlap = DEFAULT_CHUNK_OVERLAP, format = "markdown"))]
#[allow(clippy::type_complexity)]
fn chunk(
    py: Python<'_>,
    text: &Bound<'_, PyAny>,
    model: &str,
    tokens: usize,
    overlap: usize,
    format: &str,
) -> PyResult<(Vec<(String, Vec<String>, usize, usize, usize)>, String)> {
    let text: String = text.extract().map_err(|_| {
        PyTypeError::new_err(format!("text must be a str, not {}", type_name(text)))
    })?;
    py.detach(|| -> PyResult<_> {
        let tokenizer = tokenizer(model).map_err(error)?;
        let limit = tokenizer.max_content_len() - tokenizer.passage_prompt_ids().len();
        let sizes = ChunkConfig {
            target: tokens,
            overlap,
        }
        .validate(limit, tokens != DEFAULT_CHUNK_TOKENS)
        .map_err(|e| {
            // The keywords' names, not the flags'.
            PyValueError::new_err(match e {
                SizeError::OverLimit { target, limit } => format!(
                    "tokens={target} exceeds the model's limit of {limit} tokens per chunk; \
                     lower it to at most {limit}"
                ),
                SizeError::Zero => "tokens must be at least 1".into(),
                SizeError::Overlap { overlap, target } => format!(
                    "overlap={overlap} must be less than half of the chunk size ({target}); \
                     lower it"
                ),
            })
        })?;
        let (extracted, children) =
            ragline::stages::chunk::chunk_text(&text, format, (*tokenizer).clone(), sizes)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        // Byte offsets to character offsets (Python indexes str by code point).
        let mut chars = Vec::with_capacity(children.len());
        for c in children {
            let Some(meta) = c.chunk else { continue };
            let start = extracted[..meta.start].chars().count();
            let end = start + extracted[meta.start..meta.end].chars().count();
            chars.push((
                c.fields.text,
                meta.heading_path,
                meta.token_count as usize,
                start,
                end,
            ));
        }
        Ok((chars, extracted))
    })
}

/// Progress of a run, handed to a Python callable as a dict.
struct Callback {
    callable: Py<PyAny>,
    /// The first exception the callable raised: the run goes on, and it is raised at the end.
    raised: Option<PyErr>,
}

impl Observer for Callback {
    fn tick(&mut self, s: &Snapshot<'_>) {
        if self.raised.is_some() {
            return;
        }
        Python::attach(|py| {
            let call = || -> PyResult<()> {
                let d = PyDict::new(py);
                d.set_item("documents_done", s.documents_done())?;
                d.set_item("documents_total", s.announced)?;
                d.set_item("indexed", s.counts.indexed)?;
                d.set_item("failed", s.counts.failed)?;
                d.set_item("dropped", s.counts.dropped)?;
                d.set_item("in_flight", s.pending)?;
                d.set_item("chunks_embedded", s.stats.chunks())?;
                d.set_item("elapsed_secs", s.elapsed.as_secs_f64())?;
                self.callable.call1(py, (d,))?;
                Ok(())
            };
            if let Err(e) = call() {
                self.raised = Some(e);
            }
        });
    }
}

/// `ingest(paths, index, model, config, progress, options)`: the run of `ragline ingest`,
/// with `options` its flags by name (underscores for dashes); its summary (what `--report`
/// writes) as a dict.
#[pyfunction]
#[pyo3(signature = (paths, index, model = None, config = None, progress = None, options = None))]
fn ingest<'py>(
    py: Python<'py>,
    paths: Vec<std::path::PathBuf>,
    index: String,
    model: Option<String>,
    config: Option<std::path::PathBuf>,
    progress: Option<Py<PyAny>>,
    options: Option<Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut request = ingest_request(options.as_ref())?;
    request.paths = paths;
    request.index = Some(index);
    if model.is_some() {
        request.model.model = model;
    }
    let mut callback = progress.map(|callable| Callback {
        callable,
        raised: None,
    });
    let mut silent = ragline::run::progress::Silent;
    let summary = py
        .detach(|| {
            let observer: &mut (dyn Observer + Send) = match callback.as_mut() {
                Some(c) => c,
                None => &mut silent,
            };
            let config = request.config(config.as_deref())?;
            ragline::jobs::request::ingest(&request, &config, observer)
        })
        .map_err(|e| match e {
            // A value that cannot work (`defer="tokenize"`, `chunk_overlap` over half the
            // chunk): the caller's argument.
            JobError::Config(ConfigError::Value(message)) => PyValueError::new_err(message),
            e => error(e),
        })?;
    if let Some(e) = callback.and_then(|c| c.raised) {
        return Err(e);
    }
    to_python(py, &summary)
}

/// The keywords of `ingest()` as the library's typed request: an unknown one is refused by
/// name, a value of the wrong type names its keyword.
fn ingest_request(options: Option<&Bound<'_, PyDict>>) -> PyResult<IngestRequest> {
    let Some(options) = options else {
        return Ok(IngestRequest::default());
    };
    let known = IngestRequest::keywords();
    for key in options.keys() {
        let key: String = key.extract()?;
        if !known.contains(&key) {
            let hint = match key.as_str() {
                "follow" | "poll_interval" => {
                    " (--follow never returns: run `ragline ingest --follow` as a process, or \
                     call ingest() in a loop)"
                }
                _ => " (ingest's options are its flags with underscores: `ragline ingest --help`)",
            };
            return Err(PyTypeError::new_err(format!(
                "ingest() got an unknown option `{key}`{hint}"
            )));
        }
    }
    let mut from = pythonize::Depythonizer::from_object(options.as_any());
    serde_path_to_error::deserialize::<_, IngestRequest>(&mut from).map_err(|e| {
        PyTypeError::new_err(format!("ingest(): option `{}`: {}", e.path(), e.inner()))
    })
}

/// An index opened for searching: its own model loaded once for vector and hybrid search.
#[pyclass(frozen, module = "ragline._ragline")]
struct Index {
    /// The URI without its secrets (a password, a token): what `repr` and `.uri` show.
    uri: String,
    config: PipelineConfig,
    model: ModelConfig,
    exact: bool,
    /// Opened at the first search of each kind, by the models it holds (dense, sparse):
    /// keyword search needs none; one that holds more serves the searches that need less.
    searchers: Mutex<HashMap<(bool, bool), Shared>>,
}

/// A searcher the Python threads share.
type Shared = Arc<Mutex<Searcher>>;

impl Index {
    fn searcher(&self, mode: Mode) -> anyhow::Result<Shared> {
        let need = (mode.needs_dense(), mode.needs_sparse());
        let mut open = self.searchers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = open
            .iter()
            .find(|((d, sp), _)| (*d || !need.0) && (*sp || !need.1))
            .map(|(_, s)| s)
        {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Mutex::new(ragline::jobs::open_searcher(
            &self.config,
            &self.model,
            self.exact,
            mode,
        )?));
        open.insert(need, Arc::clone(&s));
        Ok(s)
    }
}

#[pymethods]
impl Index {
    #[new]
    #[pyo3(signature = (uri = "sqlite://ragline.db", device = "auto", dtype = "auto", exact = false, config = None))]
    fn new(
        uri: &str,
        device: &str,
        dtype: &str,
        exact: bool,
        config: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let (mut pipeline, _) = PipelineConfig::load(config.as_deref()).map_err(error)?;
        pipeline
            .set_index(uri)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut model = model_config(&pipeline.model.name, device, dtype)?;
        model.query_prompt = pipeline.model.query_prompt.clone();
        model.batch_tokens = pipeline.model.batch_tokens;
        Ok(Index {
            uri: ragline::secret::redact_url(uri),
            config: pipeline,
            model,
            exact,
            searchers: Mutex::new(HashMap::new()),
        })
    }

    /// `search(query, k, mode, where)`: the hits as `ragline search --json` prints them, as
    /// dicts.
    #[pyo3(signature = (query, k = 10, mode = "hybrid", r#where = None))]
    fn search<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyAny>,
        k: usize,
        mode: &str,
        r#where: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let query: String = query.extract().map_err(|_| {
            PyTypeError::new_err(format!("query must be a str, not {}", type_name(query)))
        })?;
        let max = ragline::search::MAX_K;
        if !(1..=max).contains(&k) {
            return Err(PyValueError::new_err(format!(
                "k={k}: give a number of results from 1 to {max}"
            )));
        }
        let mode: Mode = mode
            .parse()
            .map_err(|e| PyValueError::new_err(format!("mode={mode:?}: {e}")))?;
        let filter = Where::parse(&r#where.unwrap_or_default())
            .map_err(|e| PyValueError::new_err(format!("where: {e}")))?;
        let hits = py
            .detach(|| -> anyhow::Result<_> {
                let searcher = self.searcher(mode)?;
                let searcher = searcher.lock().unwrap_or_else(|e| e.into_inner());
                Ok(searcher.search_where(&query, mode, k, &filter)?)
            })
            .map_err(error)?;
        to_python(py, &hits)
    }

    /// `status()`: the index's lifecycle as `ragline status --json` prints it, as a dict.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let report = py
            .detach(|| ragline::jobs::status(&self.config))
            .map_err(error)?;
        to_python(py, &report)
    }

    #[getter]
    fn uri(&self) -> String {
        self.uri.clone()
    }

    fn __repr__(&self) -> String {
        format!("Index({:?})", self.uri)
    }
}

/// `cli_main(argv)`: the `ragline` command run in this process; its exit code.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    let code = py.detach(|| {
        let code = ragline::cli::main(argv);
        use std::io::Write;
        let _ = std::io::stdout().flush();
        code
    });
    (0..=255u8)
        .find(|&k| std::process::ExitCode::from(k) == code)
        .unwrap_or(1)
}

/// The version of the ragline crate this extension was built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _ragline(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("RaglineError", m.py().get_type::<RaglineError>())?;
    m.add_class::<Embedder>()?;
    m.add_class::<Index>()?;
    m.add_function(wrap_pyfunction!(chunk, m)?)?;
    m.add_function(wrap_pyfunction!(ingest, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add("DEFAULT_MODEL", DEFAULT_MODEL)?;
    Ok(())
}
