//! `ragline serve`: an embeddings server over the embedder pool (OpenAI's and TEI's APIs).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use ragline::embed::device::SelectedDevice;
use ragline::embed::{EmbeddingModel, ModelFiles};
use ragline::serve::{self, LongInputs, ModelThread, ServeOptions};

use super::model_args::{load_first, ModelArgs};
use super::EXIT_OK;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Long {
    /// Keep the first tokens, as sentence-transformers does.
    Truncate,
    /// Answer 413 naming the input.
    Refuse,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ServePrompt {
    /// No prompt (sentence-transformers' `encode` default, and `ragline embed`'s).
    None,
    /// The model's query prompt (or --query-prompt).
    Query,
    /// The model's document prompt (or --document-prompt).
    #[value(alias = "passage")]
    Document,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The address to listen on.
    #[arg(long, env = "RAGLINE_HOST", default_value = "127.0.0.1")]
    host: IpAddr,

    /// The port to listen on (0: any free port; the port is printed).
    #[arg(long, env = "RAGLINE_PORT", default_value_t = 8080)]
    port: u16,

    /// Inputs over the model's limit: truncate them, or refuse the request with 413 (TEI's
    /// per-request `truncate` overrides this on /embed).
    #[arg(long, value_enum, default_value = "truncate")]
    long_inputs: Long,

    /// Which prompt goes before each input, unless a request names one (`prompt_name`).
    /// Without it: the model's default prompt, else none, as sentence-transformers' `encode`.
    #[arg(long, value_enum)]
    prompt: Option<ServePrompt>,

    /// Inputs per request, at most.
    #[arg(long, default_value_t = 2048)]
    max_inputs: usize,

    /// Bytes per request body, at most.
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,

    /// Tokens waiting for the model, at most; past it requests are answered 503 with
    /// Retry-After [default: 32 forward passes' worth].
    #[arg(long)]
    max_queued_tokens: Option<usize>,

    /// The model name answers carry [default: the --model given].
    #[arg(long)]
    served_model_name: Option<String>,

    /// The environment variable holding the server's API key: every route but /health then
    /// needs `Authorization: Bearer <key>` (401 otherwise). Without it anyone who can reach
    /// the port can use the server: keep it on 127.0.0.1 (the default --host) then.
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,

    /// Requests being answered at once, at most; past it 503 with Retry-After (each may hold
    /// up to --max-body-bytes).
    #[arg(long, default_value_t = ServeOptions::DEFAULT_MAX_CONCURRENT_REQUESTS)]
    max_concurrent_requests: usize,

    /// The origin (https://app.example.com) whose web pages may call the server (CORS). None
    /// by default: browsers refuse cross-origin calls.
    #[arg(long, value_name = "ORIGIN")]
    cors_origin: Option<String>,

    /// Seconds one request may take, its body included; past it 408.
    #[arg(long, value_name = "SECONDS", default_value_t = ServeOptions::DEFAULT_REQUEST_TIMEOUT.as_secs())]
    request_timeout: u64,

    /// Also search this index (sqlite://PATH or postgres://...) and show it: GET /v1/search,
    /// a search page at /, the lifecycle at /status. The model is the index's own unless
    /// --model is given.
    #[arg(long, value_name = "URI")]
    index: Option<String>,

    /// With --index: the status page gets buttons that change the index's lifecycle (requeue
    /// dead documents, pause and resume stages, promote documents), each a POST carrying a
    /// CSRF token. Off by default: the pages are read-only.
    /// Refused on an address other than loopback without --api-key-env (anyone who reaches
    /// the port could change the index).
    #[arg(long, requires = "index")]
    admin: bool,

    /// A Host name the server answers to, besides loopback names and the address it listens
    /// on (repeatable): the name clients and browsers use when it sits behind a proxy or a
    /// DNS name. A request naming any other Host gets 421 (a page reaching the server through
    /// DNS rebinding names its own).
    #[arg(long, value_name = "NAME")]
    allowed_host: Vec<String>,

    /// Also rerank with this cross-encoder (a folder, a name under models/, a hub id):
    /// POST /rerank (TEI's shape) and POST /v1/rerank (Cohere's and Jina's), batched across
    /// requests on the first device.
    #[arg(long, value_name = "MODEL")]
    rerank_model: Option<String>,

    /// Also embed with this sparse (SPLADE) model: POST /embed_sparse (TEI's shape). With
    /// --index, the index's own sparse model (when it records one) is loaded without it, for
    /// `mode=sparse` and the hybrids that fuse sparse vectors.
    #[arg(long, value_name = "MODEL")]
    sparse_model: Option<String>,

    /// Also classify with this sequence classifier (`*ForSequenceClassification`): POST
    /// /predict (TEI's shape), batched across requests on the first device.
    #[arg(long, value_name = "MODEL")]
    classifier_model: Option<String>,

    /// Also find named entities with this token classifier (`*ForTokenClassification`):
    /// POST /ner (the `ner` command's JSON), batched across requests on the first device.
    #[arg(long, value_name = "MODEL")]
    ner_model: Option<String>,

    #[command(flatten)]
    model: ModelArgs,
}

/// The index `--index` names: what the server needs to search it, and the model to load (the
/// index's own unless --model names one).
fn index_setup(
    args: &ServeArgs,
    config: &ragline::jobs::PipelineConfig,
    model_config: &mut ragline::jobs::config::ModelConfig,
) -> anyhow::Result<Option<std::sync::Arc<ragline::serve::pages::SearchSetup>>> {
    if args.index.is_none() {
        return Ok(None);
    }
    let uri = config.index.uri.value.clone();
    let reader = ragline::search::Searcher::open(&uri, false)
        .with_context(|| format!("cannot open --index {uri}"))?;
    let spec = ragline::search::Searcher::model_spec(reader.as_ref()).context(
        "the index holds no vectors (it was built with --no-chunk): nothing for serve to embed \
         queries for",
    )?;
    if args.model.model.is_none() {
        model_config.name = spec;
    }
    Ok(Some(std::sync::Arc::new(
        ragline::serve::pages::SearchSetup {
            uri,
            dimension: reader.meta().dimension,
            admin: args.admin,
            sparse_model: ragline::search::Searcher::sparse_model_spec(reader.as_ref()),
        },
    )))
}

/// The limits, the API key (from the variable --api-key-env names) and the access flags,
/// checked: an error names the flag and the fix.
fn checked_access(args: &ServeArgs) -> anyhow::Result<Option<ragline::secret::Secret>> {
    if args.max_inputs == 0 {
        bail!("--max-inputs must be at least 1");
    }
    if args.max_concurrent_requests == 0 || args.request_timeout == 0 {
        bail!("--max-concurrent-requests and --request-timeout must be at least 1");
    }
    let api_key = match &args.api_key_env {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(k) if !k.is_empty() => Some(ragline::secret::Secret::new(k)),
            _ => bail!("--api-key-env {var}: the variable is not set (or empty); export it"),
        },
    };
    if api_key.is_none() && args.admin && !args.host.is_loopback() {
        bail!(
            "--admin on {} without an API key would let anyone who reaches the port change the \
             index: give --api-key-env VAR, or listen on 127.0.0.1",
            args.host
        );
    }
    if let Some(bad) = args.allowed_host.iter().find(|h| {
        h.is_empty()
            || h.contains(['/', '@', ' '])
            || (h.contains(':') && h.parse::<IpAddr>().is_err())
    }) {
        bail!("--allowed-host `{bad}` is not a host name: give the name alone (search.example.com) or an address");
    }
    if api_key.is_none() && !args.host.is_loopback() {
        eprintln!(
            "warning: listening on {} without an API key: anyone who reaches the port can use \
             the server (give --api-key-env)",
            args.host
        );
    }
    Ok(api_key)
}

/// Prompts' token ids by name.
type Prompts = std::collections::BTreeMap<String, Vec<u32>>;

/// The prompt put before every input (the model's default unless --prompt says), and the
/// model's prompts by name with the sentence-transformers aliases of the two roles.
fn prompts_of(
    first: &ragline::embed::EmbeddingModel,
    asked: Option<ServePrompt>,
) -> anyhow::Result<(Vec<u32>, Prompts)> {
    let prompt: Vec<u32> = match (asked, &first.files.default_prompt_name) {
        (None, Some(name)) => first.tokenizer.prompt_ids(first.files.prompt(name)?)?,
        (None | Some(ServePrompt::None), _) => Vec::new(),
        (Some(ServePrompt::Query), _) => first.tokenizer.query_prompt_ids().to_vec(),
        (Some(ServePrompt::Document), _) => first.tokenizer.passage_prompt_ids().to_vec(),
    };
    // The model's prompts by name, and the sentence-transformers aliases of the two roles.
    let mut prompts = std::collections::BTreeMap::new();
    for (name, text) in &first.files.prompts {
        prompts.insert(name.clone(), first.tokenizer.prompt_ids(text)?);
    }
    prompts.insert("query".into(), first.tokenizer.query_prompt_ids().to_vec());
    for name in ["document", "passage"] {
        prompts.insert(name.into(), first.tokenizer.passage_prompt_ids().to_vec());
    }
    Ok((prompt, prompts))
}

pub fn run(args: ServeArgs, config_file: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let mut model_config = args.model.resolve(&config);
    let index = index_setup(&args, &config, &mut model_config)?;
    // Refused before the model loads.
    let api_key = checked_access(&args)?;
    let (files, devices, first) = load_first(&model_config)?;
    let batch_tokens = ragline::jobs::batch_tokens(&model_config, &devices[0]);
    let (prompt, prompts) = prompts_of(&first, args.prompt)?;
    let tokenizer = first.tokenizer.clone();
    let dimension = first.dimension();
    let normalized = files.normalize;
    for d in &devices {
        eprintln!("embedding on {} ({})", d.label, d.reason);
    }
    eprintln!("encoder: {}", first.encoder_kind());
    let models = model_threads(first, &files, &devices, &model_config)?;
    let options = ServeOptions {
        model_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| model_config.name.clone()),
        max_queued_tokens: args.max_queued_tokens.unwrap_or(batch_tokens * 32),
        batch_tokens,
        max_wait: Duration::from_millis(model_config.max_wait_ms),
        prompt,
        prompts,
        normalized,
        api_key,
        index,
        ..serve_options(&args)
    };
    if let Some(d) = options.index.as_ref().and_then(|i| i.dimension) {
        if d > dimension {
            bail!(
                "--model `{}` makes {dimension}-dimensional vectors and the index holds \
                 {d}-dimensional ones: leave --model out to use the index's own model",
                model_config.name
            );
        }
    }
    let searching = options.index.is_some();
    let sparse_spec = args
        .sparse_model
        .clone()
        .or_else(|| options.index.as_ref().and_then(|i| i.sparse_model.clone()));
    let (tasks, extra_routes) = task_models(&args, sparse_spec, &devices[0].device, &model_config)?;
    serve::serve(models, tokenizer, dimension, tasks, options, |addr| {
        // The first line on stdout, for scripts that start the server on port 0.
        println!("listening on http://{addr}");
        eprintln!(
            "serving {} on http://{addr}: POST /v1/embeddings (OpenAI), POST /embed (TEI), \
             GET /health, GET /metrics{extra_routes}{}",
            model_config.name,
            if searching {
                ", GET /v1/search, GET /v1/status; pages: / (search), /status"
            } else {
                ""
            }
        );
    })
    .context("ragline serve")?;
    Ok(ExitCode::from(EXIT_OK))
}

/// One model thread per device: `first` on the first, the model loaded again on each other.
fn model_threads(
    first: EmbeddingModel,
    files: &ModelFiles,
    devices: &[SelectedDevice],
    model_config: &ragline::jobs::config::ModelConfig,
) -> anyhow::Result<Vec<ModelThread>> {
    let mut models = vec![ModelThread {
        encoder: Box::new(first),
        label: devices[0].label.clone(),
    }];
    for d in &devices[1..] {
        models.push(ModelThread {
            encoder: Box::new(ragline::jobs::load_model(files, d, model_config)?),
            label: d.label.clone(),
        });
    }
    Ok(models)
}

/// The server's limits and addresses from the flags; the model's part filled by the caller.
fn serve_options(args: &ServeArgs) -> ServeOptions {
    ServeOptions {
        addr: SocketAddr::new(args.host, args.port),
        model_name: String::new(),
        long_inputs: match args.long_inputs {
            Long::Truncate => LongInputs::Truncate,
            Long::Refuse => LongInputs::Refuse,
        },
        max_inputs: args.max_inputs,
        max_body_bytes: args.max_body_bytes,
        max_queued_tokens: 0,
        batch_tokens: 0,
        max_wait: Duration::ZERO,
        prompt: Vec::new(),
        prompts: Default::default(),
        normalized: false,
        api_key: None,
        max_concurrent_requests: args.max_concurrent_requests,
        // Each request holds a connection; idle keep-alive connections on top of those.
        max_connections: args.max_concurrent_requests.saturating_mul(4).max(64),
        cors_origin: args.cors_origin.clone(),
        header_timeout: ServeOptions::DEFAULT_HEADER_TIMEOUT,
        request_timeout: Duration::from_secs(args.request_timeout),
        index: None,
        allowed_hosts: args.allowed_host.clone(),
    }
}

/// The task models `serve` runs beside the embedder, loaded on `device` (`sparse_spec`:
/// --sparse-model, or the index's own sparse model, which encodes `mode=sparse` queries), and
/// the routes they add, in words.
fn task_models(
    args: &ServeArgs,
    sparse_spec: Option<String>,
    device: &candle_core::Device,
    model_config: &ragline::jobs::config::ModelConfig,
) -> anyhow::Result<(serve::TaskModels, String)> {
    let mut tasks = serve::TaskModels::default();
    if let Some(spec) = &args.rerank_model {
        let m = ragline::jobs::load_reranker(spec, model_config)?;
        eprintln!("reranker: {spec} ({})", m.encoder_kind());
        tasks.reranker = Some(m);
    }
    if let Some(spec) = &sparse_spec {
        let m = ragline::embed::splade::SparseModel::load(spec, device, model_config.dtype.value)
            .with_context(|| format!("cannot load the sparse model `{spec}`"))?;
        eprintln!("sparse model: {spec} ({})", m.encoder_kind());
        tasks.sparse = Some(m);
    }
    if let Some(spec) = &args.classifier_model {
        let m = ragline::embed::classify::SequenceClassifier::load(
            spec,
            device,
            model_config.dtype.value,
        )
        .with_context(|| format!("cannot load the classifier `{spec}`"))?;
        eprintln!("classifier: {spec} ({})", m.encoder_kind());
        tasks.classifier = Some(m);
    }
    if let Some(spec) = &args.ner_model {
        let m = ragline::embed::ner::TokenClassifier::load(
            spec,
            device,
            model_config.dtype.value,
            None,
        )
        .with_context(|| format!("cannot load the token classifier `{spec}`"))?;
        eprintln!("token classifier: {spec} ({})", m.encoder_kind());
        tasks.ner = Some(m);
    }
    let extra_routes = format!(
        "{}{}{}{}",
        if tasks.reranker.is_some() {
            ", POST /rerank (TEI), POST /v1/rerank (Cohere/Jina)"
        } else {
            ""
        },
        if tasks.sparse.is_some() {
            ", POST /embed_sparse (TEI)"
        } else {
            ""
        },
        if tasks.classifier.is_some() {
            ", POST /predict (TEI)"
        } else {
            ""
        },
        if tasks.ner.is_some() {
            ", POST /ner"
        } else {
            ""
        }
    );
    Ok((tasks, extra_routes))
}
