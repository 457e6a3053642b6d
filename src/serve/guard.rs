//! What every request passes before its handler: the Host (against DNS rebinding), the API
//! key or a session, a JSON body, a permit among the requests in flight, its deadline.

use super::*;

/// Every request: a Host this server answers to (all but `/health`: 421), the API key (all
/// but `/health`), JSON bodies only (415), room among the requests in flight for the routes
/// that run a model or a search (503), and the request's deadline (408).
pub(super) async fn guard(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path().to_string();
    if path != "/health" {
        if let Some(refused) = misdirected(&app, &request) {
            return refused;
        }
    }
    if let Some(refused) = unauthorized(&app, &request, &path) {
        return refused;
    }
    let embeds = request.method() == axum::http::Method::POST
        && path != "/login"
        && path != "/logout"
        && !path.starts_with("/admin/");
    // The search page and the search API embed the query and search: they take a permit too.
    let searches = request.method() == axum::http::Method::GET
        && app.search.is_some()
        && (path == "/" || path == "/v1/search");
    if embeds && !is_json(request.headers()) {
        app.metrics.error("unsupported_media_type");
        return ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            kind: "unsupported_media_type",
            message: "send the body as JSON, with `Content-Type: application/json`".into(),
            retry_after: None,
        }
        .into_response();
    }
    let _permit = if embeds || searches {
        match Arc::clone(&app.requests).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                app.metrics.error("overloaded");
                return ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    kind: "overloaded",
                    message: format!(
                        "{} requests are being answered, the limit \
                         (--max-concurrent-requests): retry after a moment",
                        app.options.max_concurrent_requests
                    ),
                    retry_after: Some(1),
                }
                .into_response();
            }
        }
    } else {
        None
    };
    match tokio::time::timeout(app.options.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            app.metrics.error("timeout");
            ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                kind: "timeout",
                message: format!(
                    "the request took longer than {}s (its body arrived too slowly, or the \
                     model is overloaded); retry",
                    app.options.request_timeout.as_secs()
                ),
                retry_after: None,
            }
            .into_response()
        }
    }
}

/// With an API key: 401 for a request without it (a page: to the login form). `/health`,
/// and the login and logout of the search pages, are open.
pub(super) fn unauthorized(
    app: &App,
    request: &axum::extract::Request,
    path: &str,
) -> Option<Response> {
    let key = app.options.api_key.as_ref()?;
    let open =
        path == "/health" || (app.search.is_some() && (path == "/login" || path == "/logout"));
    if open || authorized(&app.sessions, request.headers(), key) {
        return None;
    }
    if app.search.is_some() && pages::is_page(path) {
        // A browser: to the login form.
        return Some(pages::to_login());
    }
    app.metrics.error("unauthorized");
    let mut r = ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: "unauthorized",
        message: "this server needs an API key: send `Authorization: Bearer KEY`".into(),
        retry_after: None,
    }
    .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(r)
}

/// 421 for a request whose Host (or HTTP/2 authority) this server does not answer to.
pub(super) fn misdirected(app: &App, request: &axum::extract::Request) -> Option<Response> {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{0}"))
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    let local = request
        .extensions()
        .get::<auth::Connection>()
        .map(|c| c.local);
    if app.hosts.allows(host, local) {
        return None;
    }
    app.metrics.error("misdirected");
    let refused = ApiError {
        status: StatusCode::MISDIRECTED_REQUEST,
        kind: "misdirected",
        message: "this server does not answer to that Host name (a page reaching it through \
                  DNS rebinding?): use its address, or start it with --allowed-host NAME"
            .into(),
        retry_after: None,
    };
    Some(refused.into_response())
}

/// `Authorization: Bearer KEY` with the server's key (compared in constant time), or the
/// cookie of a live session the login page opened (a browser).
pub(super) fn authorized(
    sessions: &auth::Sessions,
    headers: &axum::http::HeaderMap,
    key: &Secret,
) -> bool {
    use subtle::ConstantTimeEq;
    if let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    {
        return bool::from(given.ct_eq(key.expose().as_bytes()));
    }
    pages::session_ids(headers).any(|id| sessions.valid(id))
}

/// `Content-Type: application/json` (or a `+json` type), parameters allowed.
pub(super) fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let mime = v
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false)
}
