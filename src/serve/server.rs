//! The server's assembly: the state the handlers share, the model threads, the routes, the
//! listener with its connection limits, CORS, and the graceful stop.

use super::*;

/// Serve until SIGTERM/SIGINT or until `stop` resolves; `ready` hears the address bound.
pub fn serve(
    models: Vec<ModelThread>,
    tokenizer: TextTokenizer,
    dimension: usize,
    task_models: tasks::TaskModels,
    options: ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let batcher = Batcher::new(options.max_queued_tokens);
    let app = app(tokenizer, dimension, task_models, &batcher, &options)?;
    let cors = match &options.cors_origin {
        None => None,
        Some(origin) => Some(cors_layer(origin)?),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("serve-io")
        .enable_all()
        .build()
        .map_err(|e| ServeError::start("the server runtime", e))?;
    let listen = |source| ServeError::Listen {
        addr: options.addr.to_string(),
        source,
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(options.addr))
        .map_err(listen)?;
    let bound = listener.local_addr().map_err(listen)?;
    std::thread::scope(|scope| -> Result<(), ServeError> {
        for m in models {
            spawn_model(scope, m, &batcher, &app.metrics, &options)?;
        }
        app.tasks
            .spawn(scope, &app.models, options.batch_tokens, options.max_wait)?;
        let router = routes(&app, cors);
        ready(bound);
        let app2 = Arc::clone(&app);
        rt.block_on(accept(listener, router, &options, async move {
            shutdown_signal().await;
            app2.stopping.store(true, Ordering::Relaxed);
            tracing::info!(target: crate::NOTE, "stopping: answering the requests in flight");
        }));
        // Every request is answered: let the model threads drain and stop.
        batcher.close();
        app.tasks.close();
        Ok(())
    })
}

/// What the handlers share: the queues, the models' tasks, the limits and the sessions.
pub(super) fn app(
    tokenizer: TextTokenizer,
    dimension: usize,
    task_models: tasks::TaskModels,
    batcher: &Arc<Batcher>,
    options: &ServeOptions,
) -> Result<Arc<App>, ServeError> {
    let shared_models = tasks::SharedModels::from(task_models);
    let task_queues = tasks::TaskQueues::for_models(&shared_models, options.max_queued_tokens);
    let tokenize_pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("serve-tokenize-{i}"))
        .build()
        .map_err(|e| ServeError::start("the tokenizer threads", e))?;
    Ok(Arc::new(App {
        tokenizer,
        dimension,
        batcher: Arc::clone(batcher),
        metrics: ServeMetrics::new(),
        options: options.clone(),
        stopping: AtomicBool::new(false),
        requests: Arc::new(tokio::sync::Semaphore::new(
            options.max_concurrent_requests.max(1),
        )),
        tokenize_pool,
        search: options
            .index
            .clone()
            .map(|setup| Arc::new(pages::SearchService::new(setup))),
        tasks: task_queues,
        models: shared_models,
        hosts: auth::HostPolicy::new(options.addr.ip(), &options.allowed_hosts),
        sessions: auth::Sessions::default(),
        logins: auth::LoginThrottle::default(),
    }))
}

/// The thread of one embedding model: it takes windows of the batcher's queue until it closes.
pub(super) fn spawn_model<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    m: ModelThread,
    batcher: &Arc<Batcher>,
    metrics: &ServeMetrics,
    options: &'scope ServeOptions,
) -> Result<(), ServeError> {
    let (batcher, metrics) = (Arc::clone(batcher), metrics.clone());
    std::thread::Builder::new()
        .name(format!("model-{}", m.label))
        .spawn_scoped(scope, move || {
            let report = |r: &WindowReport| observe_window(&metrics, r);
            batcher.run_model(
                m.encoder.as_ref(),
                &m.label,
                options.batch_tokens,
                options.batch_tokens * crate::embed::pool::WINDOW_BATCHES,
                options.max_wait,
                &report,
            );
        })
        .map(drop)
        .map_err(|e| ServeError::start("a model thread", e))
}

/// A model thread's window in the metrics: its requests' waits, the compute, its size.
pub(super) fn observe_window(metrics: &ServeMetrics, r: &WindowReport) {
    for w in &r.queue_waits {
        metrics.queue_seconds.observe(w.as_secs_f64());
    }
    metrics.compute_seconds.observe(r.compute.as_secs_f64());
    metrics.window_requests.observe(r.requests as f64);
    metrics.batch_tokens.observe(r.tokens as f64);
    if r.batches > 0 {
        metrics
            .batch_inputs
            .observe(r.inputs as f64 / r.batches as f64);
    }
}

/// The server's routes (the pages and `/v1/search` with an index), every request through
/// [`guard`], the body limit, and CORS for one origin when asked.
pub(super) fn routes(app: &Arc<App>, cors: Option<tower_http::cors::CorsLayer>) -> Router {
    let mut router = Router::new()
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/rerank", post(tasks::tei_rerank))
        .route("/v1/rerank", post(tasks::cohere_rerank))
        .route("/embed_sparse", post(tasks::tei_embed_sparse))
        .route("/predict", post(predict::tei_predict))
        .route("/ner", post(predict::ner))
        .route("/embed", post(tei_embed))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text));
    if app.search.is_some() {
        router = router
            .route("/", get(pages::search_page))
            .route("/status", get(pages::status_page))
            .route("/v1/search", get(pages::search_json))
            .route("/v1/status", get(pages::status_json))
            .route("/login", get(pages::login_page).post(pages::login))
            .route("/logout", post(pages::logout))
            .route("/admin/{action}", post(pages::admin));
    }
    let mut router = router
        .layer(DefaultBodyLimit::max(app.options.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(app), guard))
        .with_state(Arc::clone(app));
    if let Some(cors) = cors {
        router = router.layer(cors);
    }
    router
}

/// Serve connections until `stop` resolves, then let every connection finish the request it
/// is answering (and close idle ones). At most `max_connections` at once; a client gets
/// `header_timeout` to send its headers.
pub(super) async fn accept(
    listener: tokio::net::TcpListener,
    router: Router,
    options: &ServeOptions,
    stop: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt as _;
    let connections = Arc::new(tokio::sync::Semaphore::new(options.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    builder.http2().timer(TokioTimer::new());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(accepted) => accepted,
                    // Out of file descriptors and the like: wait a moment, go on.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    // Full: closed at once, the client retries elsewhere or later.
                    drop(stream);
                    continue;
                };
                // Where the request came in, for the Host check and the login throttle.
                let connection = auth::Connection {
                    local: stream.local_addr().map_or(remote.ip(), |a| a.ip()),
                    remote: remote.ip(),
                };
                let service = TowerToHyperService::new(router.clone().map_request(
                    move |mut r: axum::http::Request<hyper::body::Incoming>| {
                        r.extensions_mut().insert(connection);
                        r
                    },
                ));
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = connection.await;
                    drop(permit);
                });
            }
            _ = &mut stop => break,
        }
    }
    drop(listener);
    // Requests in flight are answered; past their own deadline nothing is waited for.
    let _ = tokio::time::timeout(
        options.request_timeout + Duration::from_secs(5),
        graceful.shutdown(),
    )
    .await;
}

/// CORS for one origin: its pages may POST JSON with an Authorization header.
pub(super) fn cors_layer(origin: &str) -> Result<tower_http::cors::CorsLayer, ServeError> {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let value = HeaderValue::from_str(origin.trim_end_matches('/')).map_err(|_| {
        ServeError::Setting(format!("--cors-origin `{origin}` is not a valid origin"))
    })?;
    if !(origin.starts_with("http://") || origin.starts_with("https://")) {
        return Err(ServeError::Setting(format!(
            "--cors-origin `{origin}` must be an origin such as https://app.example.com"
        )));
    }
    // Allowed only for that origin: another one's request gets no CORS headers at all.
    Ok(CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |o: &HeaderValue, _| {
            *o == value
        }))
        .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .max_age(Duration::from_secs(600)))
}

pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
