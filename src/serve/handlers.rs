//! The embeddings routes (`/v1/embeddings`, `/embed`), `/health` and `/metrics`: a request's
//! inputs tokenized, queued for the model threads, answered with their vectors.

use super::*;

/// The prompt a request asks for by `prompt_name`, else the server's.
pub(super) fn request_prompt(app: &App, name: Option<&str>) -> Result<Vec<u32>, ApiError> {
    match name {
        None => Ok(app.options.prompt.clone()),
        Some(n) => app.options.prompts.get(n).cloned().ok_or_else(|| {
            ApiError::bad(format!(
                "`prompt_name` `{n}` is not one of the model's prompts ({})",
                if app.options.prompts.is_empty() {
                    "it has none".to_string()
                } else {
                    app.options
                        .prompts
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ))
        }),
    }
}

/// Cut vectors to `dimensions` (re-normalised when the model normalises); more than the
/// model makes is refused.
pub(super) fn cut(
    app: &App,
    vectors: &mut [Vec<f32>],
    dimensions: Option<usize>,
) -> Result<(), ApiError> {
    let Some(d) = dimensions else {
        return Ok(());
    };
    if d == 0 || d > app.dimension {
        return Err(ApiError::bad(format!(
            "`dimensions` = {d}: this model makes {}-dimensional vectors; ask for 1 to {}",
            app.dimension, app.dimension
        )));
    }
    for v in vectors {
        v.truncate(d);
        if app.options.normalized {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
    }
    Ok(())
}

/// Tokenize (on the server's pool), queue, wait for the vectors. Returns them with the tokens.
pub(super) async fn embed(
    app: &Arc<App>,
    endpoint: &'static str,
    texts: Vec<String>,
    truncate: bool,
    prompt: Vec<u32>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    if app.stopping.load(Ordering::Relaxed) {
        app.metrics.error("shutting_down");
        return Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "shutting_down",
            message: "the server is stopping".into(),
            retry_after: Some(1),
        });
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let app2 = Arc::clone(app);
    let prompt2 = prompt.clone();
    app.tokenize_pool.spawn(move || {
        // A panic in the tokenizer fails this request, never the server.
        let tokenized = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokenize(&app2, &texts, truncate, &prompt2)
        }));
        let _ = tx.send(tokenized.unwrap_or_else(|panic| Err(ApiError::tokenizer_panic(&*panic))));
    });
    let ids = rx
        .await
        .map_err(|_| ApiError::bad("tokenization failed"))??;
    let tokens: usize = ids.iter().map(|i| i.len() + prompt.len() + 2).sum();
    queue_and_wait(app, endpoint, ids, tokens, prompt).await
}

/// Each text's ids, truncated or refused (413) when over the model's limit.
pub(super) fn tokenize(
    app: &App,
    texts: &[String],
    truncate: bool,
    prompt: &[u32],
) -> Result<Vec<Vec<u32>>, ApiError> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("serve-tokenize");
    let room = app.tokenizer.max_content_len().saturating_sub(prompt.len());
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if truncate {
                app.tokenizer
                    .ids_for_embedding(t, prompt)
                    .map_err(|e| ApiError::bad(format!("input {i}: {e}")))
            } else {
                let ids = app
                    .tokenizer
                    .content_ids(t)
                    .map_err(|e| ApiError::bad(format!("input {i}: {e}")))?;
                if ids.len() > room {
                    return Err(ApiError::too_long(format!(
                        "input {i} has {} tokens, over the model's limit of {room}; send \
                         shorter texts, or ask to truncate (TEI: \"truncate\": true; the \
                         server: --long-inputs truncate)",
                        ids.len()
                    )));
                }
                Ok(ids)
            }
        })
        .collect()
}

/// Queue tokenized inputs for the model threads and wait for their vectors.
pub(super) async fn queue_and_wait(
    app: &Arc<App>,
    endpoint: &'static str,
    ids: Vec<Vec<u32>>,
    tokens: usize,
    prompt: Vec<u32>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Job {
        inputs: ids,
        prompt,
        enqueued: Instant::now(),
        // A search query: someone is waiting for the page.
        interactive: endpoint == "search",
        reply,
    };
    refused(app, app.batcher.submit(job).0)?;
    observe_queue(app);
    let vectors = answer
        .await
        .map_err(|_| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "model",
            message: "the model thread stopped".into(),
            retry_after: None,
        })?
        .map_err(|e| {
            app.metrics.error("model");
            ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                kind: "model",
                message: e.0,
                retry_after: None,
            }
        })?;
    let labels = EndpointLabels {
        endpoint: endpoint.to_string(),
    };
    app.metrics
        .inputs
        .get_or_create(&labels)
        .inc_by(vectors.len() as u64);
    app.metrics
        .tokens
        .get_or_create(&labels)
        .inc_by(tokens as u64);
    observe_queue(app);
    Ok((vectors, tokens))
}

/// The batcher's queue, in the metrics.
pub(super) fn observe_queue(app: &App) {
    app.metrics
        .queue_tokens
        .set(app.batcher.queued_tokens() as i64);
    app.metrics
        .queue_requests
        .set(app.batcher.queued_jobs() as i64);
}

/// The answer to a job the batcher did not queue (503), counted.
pub(super) fn refused(app: &App, admission: Admission) -> Result<(), ApiError> {
    let (kind, message, retry_after) = match admission {
        Admission::Queued => return Ok(()),
        Admission::Full { tokens: queued } => (
            "overloaded",
            format!("the queue holds {queued} tokens, its limit: retry after a moment"),
            Some(1),
        ),
        Admission::Closed => ("shutting_down", "the server is stopping".into(), Some(1)),
        Admission::NoModel => (
            "model",
            "no model thread is running (they failed; see the server's log): restart the \
             server"
                .into(),
            None,
        ),
    };
    app.metrics.error(kind);
    Err(ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind,
        message,
        retry_after,
    })
}

/// Time and count a request, whatever its answer.
pub(super) async fn observed(
    app: &Arc<App>,
    endpoint: &'static str,
    handle: impl std::future::Future<Output = Result<Response, ApiError>>,
) -> Response {
    let started = Instant::now();
    // Decremented however the request ends: a client that disconnects drops this future.
    struct InFlight<'a>(&'a ServeMetrics);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.in_flight.dec();
        }
    }
    app.metrics.in_flight.inc();
    let in_flight = InFlight(&app.metrics);
    let response = match handle.await {
        Ok(r) => r,
        Err(e) => {
            if e.kind == "bad_request" {
                app.metrics.error("bad_request");
            } else if e.kind == "too_long" {
                app.metrics.error("too_long");
            }
            e.into_response()
        }
    };
    drop(in_flight);
    app.metrics
        .observe_request(endpoint, response.status().as_u16(), started.elapsed());
    response
}

pub(super) async fn openai_embeddings(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/v1/embeddings", async move {
        let req = parse_request(&body, "input", app2.options.max_inputs)?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "`encoding_format` `{other}` is not supported: use float or base64"
                )))
            }
        };
        let prompt = request_prompt(&app2, req.prompt_name.as_deref())?;
        cut(&app2, &mut [], req.dimensions)?;
        let texts = req.texts;
        let truncate = app2.options.long_inputs == LongInputs::Truncate;
        let (mut vectors, tokens) = embed(&app2, "/v1/embeddings", texts, truncate, prompt).await?;
        cut(&app2, &mut vectors, req.dimensions)?;
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(axum::Json(json!({
            "object": "list",
            "data": data,
            "model": req.model.unwrap_or_else(|| app2.options.model_name.clone()),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
        .into_response())
    })
    .await
}

pub(super) async fn tei_embed(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/embed", async move {
        let req = parse_request(&body, "inputs", app2.options.max_inputs)?;
        if req.normalize == Some(false) && app2.options.normalized {
            return Err(ApiError::bad(
                "`normalize: false`: this model's configuration normalises its vectors, and \
                 the server returns them as the model makes them; leave it out",
            ));
        }
        let prompt = request_prompt(&app2, req.prompt_name.as_deref())?;
        cut(&app2, &mut [], req.dimensions)?;
        let texts = req.texts;
        let truncate = req
            .truncate
            .unwrap_or(app2.options.long_inputs == LongInputs::Truncate);
        let (mut vectors, _) = embed(&app2, "/embed", texts, truncate, prompt).await?;
        cut(&app2, &mut vectors, req.dimensions)?;
        Ok(axum::Json(vectors).into_response())
    })
    .await
}

pub(super) async fn health(State(app): State<Arc<App>>) -> Response {
    if app.stopping.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "stopping"})),
        )
            .into_response();
    }
    if app.batcher.models_gone() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "model_down"})),
        )
            .into_response();
    }
    axum::Json(json!({
        "status": "ok",
        "model": app.options.model_name,
        "dimension": app.dimension,
        "max_input_tokens": app.tokenizer.max_content_len(),
        "queued_tokens": app.batcher.queued_tokens(),
    }))
    .into_response()
}

pub(super) async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    app.metrics
        .queue_tokens
        .set(app.batcher.queued_tokens() as i64);
    app.metrics
        .queue_requests
        .set(app.batcher.queued_jobs() as i64);
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        app.metrics.encode(),
    )
        .into_response()
}
