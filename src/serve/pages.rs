//! `ragline serve --index URI`: the index searched over HTTP, and seen in a browser.
//!
//! - `GET /v1/search?q=&k=&mode=&where=` answers what `ragline search --json` prints (the
//!   hits, best first); `where` may repeat (`source=GLOB` or `KEY=VALUE`, ANDed).
//! - `GET /` is a search page: the query lives in the URL (`/?q=...&mode=...&k=...` renders
//!   its results, so a link can be shared); each hit shows its score, document (a link when it
//!   has a URL), heading path, pages and a snippet with the query's words highlighted.
//! - `GET /status` shows where the index's lifecycle stands (what `ragline status --json`
//!   says), refreshed every few seconds; `GET /v1/status` is the same as JSON.
//!
//! Server-rendered HTML with a few lines of CSS, no JavaScript needed; every value from the
//! index is escaped. The query is embedded through the server's own batcher (the model the
//! index was built with), then searched on a reader of the index taken from a small pool.

use std::sync::{Arc, Mutex};

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{embed, ApiError, App};
use crate::indexers::{open_store, IndexReader, IndexUri};
use crate::lifecycle::StoreError;
use crate::search::{Hit, Mode, QueryVectors, SearchError, Searcher, Where};

/// The cookie that carries a browser's session when the server has an API key: a random id
/// the server keeps with an expiry ([`super::auth::Sessions`]), never the key or a hash of it.
pub(super) const SESSION_COOKIE: &str = "ragline_session";

/// The session ids a request's cookies carry.
pub(super) fn session_ids(headers: &axum::http::HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(SESSION_COOKIE))
        .filter_map(|c| c.strip_prefix('='))
}

/// Whether `path` is one of the pages (a browser is sent to the login form for them).
pub(super) fn is_page(path: &str) -> bool {
    matches!(path, "/" | "/status")
}

/// 303 to the login form.
pub(super) fn to_login() -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/login"));
    r
}

/// `GET /login`: the API key, asked for once per browser session.
pub(super) async fn login_page() -> Response {
    html(
        "ragline: sign in",
        "<form method=post action=/login><label for=key>This server needs its API key</label> \
         <input id=key name=key type=password autocomplete=current-password autofocus required> \
         <button type=submit>Sign in</button></form>",
        None,
    )
}

/// `POST /login`: the key checked in constant time; for the right one a new session's cookie
/// (HttpOnly, SameSite=Strict, Secure when the login came over TLS, for the session's life).
/// Wrong keys are throttled per client address and in all (429 with Retry-After).
pub(super) async fn login(
    State(app): State<Arc<App>>,
    connection: Option<axum::Extension<super::auth::Connection>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    use subtle::ConstantTimeEq;
    let Some(key) = &app.options.api_key else {
        return to_home();
    };
    let client = connection.map(|c| c.remote);
    if let Some(wait) = app.logins.wait(client) {
        app.metrics.error("throttled");
        let mut r = html(
            "ragline: sign in",
            &format!(
                "<p class=error role=alert>Too many wrong keys: try again in {wait} s.</p>\
                 <p><a href=/login>Sign in</a></p>"
            ),
            None,
        );
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        if let Ok(v) = HeaderValue::from_str(&wait.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let given = url::form_urlencoded::parse(&body)
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if !bool::from(given.as_bytes().ct_eq(key.expose().as_bytes())) {
        app.logins.failed(client);
        app.metrics.error("unauthorized");
        let mut r = html(
            "ragline: sign in",
            "<p class=error role=alert>That is not this server's key.</p>\
             <p><a href=/login>Try again</a></p>",
            None,
        );
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return r;
    }
    let mut r = to_home();
    let cookie = format!(
        "{SESSION_COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        app.sessions.open(),
        super::auth::SESSION_TTL.as_secs(),
        if super::auth::over_tls(&headers) {
            "; Secure"
        } else {
            ""
        }
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `POST /logout`: the session ends here and in the browser.
pub(super) async fn logout(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
) -> Response {
    for id in session_ids(&headers) {
        app.sessions.close(id);
    }
    let mut r = to_login();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("ragline_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    r
}

fn to_home() -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/"));
    r
}

/// Results a search may ask for, at most.
pub const MAX_K: usize = 100;
/// Readers kept open between searches.
const POOLED_READERS: usize = 8;

/// What `serve` needs to search an index and show its status.
#[derive(Debug)]
pub struct SearchSetup {
    pub uri: IndexUri,
    /// The index's vector dimension, when it holds vectors (a query vector is cut to it).
    pub dimension: Option<usize>,
    /// `--admin`: the status page's buttons (requeue, pause and resume, promote).
    pub admin: bool,
    /// The sparse model the index records (where its sparse vectors came from), which the
    /// server loads to encode sparse queries unless `--sparse-model` names one.
    pub sparse_model: Option<String>,
}

/// The index, searched by the server.
pub(super) struct SearchService {
    setup: Arc<SearchSetup>,
    readers: Mutex<Vec<Box<dyn IndexReader>>>,
    /// The token the admin forms carry (CSRF): a keyed hash of a secret drawn at start.
    csrf: String,
}

impl SearchService {
    pub(super) fn new(setup: Arc<SearchSetup>) -> SearchService {
        SearchService {
            setup,
            readers: Mutex::new(Vec::new()),
            csrf: blake3::keyed_hash(&process_secret(), b"ragline serve csrf")
                .to_hex()
                .to_string(),
        }
    }

    /// Run `f` on a reader of the index (opened when none is free), off the I/O threads.
    async fn with_reader<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Searcher) -> Result<T, SearchError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let pooled = this.readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let reader = match pooled {
                Some(r) => r,
                None => Searcher::open(&this.setup.uri, false)?,
            };
            let searcher = Searcher::new(reader, None);
            let out = f(&searcher);
            let mut readers = this.readers.lock().unwrap_or_else(|e| e.into_inner());
            if readers.len() < POOLED_READERS {
                readers.push(searcher.into_reader());
            }
            out
        })
        .await
        .map_err(|e| format!("the search failed: {e}"))
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|message| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "index_error",
            message,
            retry_after: None,
        })
    }
}

/// 32 bytes no one else knows, drawn once per process.
fn process_secret() -> [u8; 32] {
    let mut key = [0u8; 32];
    super::auth::fill_random(&mut key);
    key
}

/// A search's parameters, from a query string.
#[derive(Debug, PartialEq)]
struct SearchParams {
    q: String,
    k: usize,
    mode: Mode,
    filters: Vec<String>,
}

impl SearchParams {
    fn parse(raw: Option<&str>) -> Result<SearchParams, ApiError> {
        let mut p = SearchParams {
            q: String::new(),
            k: 10,
            mode: Mode::Hybrid(crate::search::Fuse::DEFAULT),
            filters: Vec::new(),
        };
        for (key, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            match key.as_ref() {
                "q" => p.q = value.trim().to_string(),
                "k" => {
                    p.k = value
                        .parse::<usize>()
                        .ok()
                        .filter(|k| (1..=MAX_K).contains(k))
                        .ok_or_else(|| {
                            ApiError::bad(format!("`k` must be a number from 1 to {MAX_K}"))
                        })?
                }
                "mode" => p.mode = value.parse().map_err(ApiError::bad)?,
                "where" if !value.trim().is_empty() => p.filters.push(value.into_owned()),
                _ => {}
            }
        }
        Ok(p)
    }
}

/// The server's index, or the 404 of a server started without `--index`.
fn service(app: &App) -> Result<&Arc<SearchService>, ApiError> {
    app.search.as_ref().ok_or_else(|| ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "not_found",
        message: "this server has no index: start it with --index URI".into(),
        retry_after: None,
    })
}

/// Search: the query embedded by the server's model when the mode needs it.
async fn run_search(app: &Arc<App>, p: &SearchParams) -> Result<Vec<Hit>, ApiError> {
    let service = service(app)?;
    let filter = Where::parse(&p.filters).map_err(|e| ApiError::bad(e.to_string()))?;
    if p.q.is_empty() {
        return Ok(Vec::new());
    }
    let vector = if !p.mode.needs_dense() {
        None
    } else {
        let prompt = app
            .options
            .prompts
            .get("query")
            .cloned()
            .unwrap_or_default();
        let (mut v, _) = embed(app, "search", vec![p.q.clone()], true, prompt).await?;
        let mut v = v.pop().unwrap_or_default();
        if let Some(d) = service.setup.dimension.filter(|d| *d < v.len()) {
            v.truncate(d);
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
        Some(v)
    };
    let sparse = if !p.mode.needs_sparse() {
        None
    } else if app.tasks.sparse.is_none() {
        return Err(ApiError::bad(format!(
            "mode `{}` needs sparse vectors, and this index has none (or the server has no \
             sparse model): add them with `ragline enrich --stage sparse --sparse-model MODEL` \
             and restart the server, or search another mode",
            p.mode
        )));
    } else {
        let (mut v, _) = super::tasks::sparse_vectors(app, vec![p.q.clone()], true).await?;
        v.pop()
    };
    let (q, mode, k) = (p.q.clone(), p.mode, p.k);
    let vectors = QueryVectors {
        dense: vector,
        sparse,
    };
    service
        .with_reader(move |s| s.search_with(&q, vectors, mode, k, &filter))
        .await
}

/// `GET /v1/search`: the hits as `ragline search --json` prints them.
pub(super) async fn search_json(State(app): State<Arc<App>>, RawQuery(raw): RawQuery) -> Response {
    let p = match SearchParams::parse(raw.as_deref()) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if p.q.is_empty() {
        return ApiError::bad("`q` is missing: /v1/search?q=WORDS[&k=10&mode=hybrid&where=...]")
            .into_response();
    }
    match run_search(&app, &p).await {
        Ok(hits) => axum::Json(hits).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/status`: the index's lifecycle, as `ragline status --json` prints it.
pub(super) async fn status_json(State(app): State<Arc<App>>) -> Response {
    match status_report(&app).await {
        Ok(r) => axum::Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn status_report(app: &Arc<App>) -> Result<crate::lifecycle::report::StatusReport, ApiError> {
    let service = service(app)?;
    let uri = service.setup.uri.clone();
    tokio::task::spawn_blocking(move || {
        open_store(&uri)
            .and_then(|mut s| s.status())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|message| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        kind: "index_error",
        message,
        retry_after: None,
    })
}

/// `GET /`: the search page.
pub(super) async fn search_page(State(app): State<Arc<App>>, RawQuery(raw): RawQuery) -> Response {
    let (params, error) = match SearchParams::parse(raw.as_deref()) {
        Ok(p) => (p, None),
        Err(e) => (
            SearchParams::parse(None).expect("defaults"),
            Some(e.message),
        ),
    };
    let mut body = String::new();
    search_form(&mut body, &params, app.tasks.sparse.is_some());
    if let Some(e) = error {
        body.push_str(&format!("<p class=error role=alert>{}</p>", escape(&e)));
    } else if !params.q.is_empty() {
        match run_search(&app, &params).await {
            Ok(hits) => results(&mut body, &hits, &params),
            Err(e) => body.push_str(&format!(
                "<p class=error role=alert>{}</p>",
                escape(&e.message)
            )),
        }
    }
    let title = if params.q.is_empty() {
        "ragline search".to_string()
    } else {
        format!("{} - ragline search", params.q)
    };
    html(&title, &body, None)
}

/// Dead documents shown on the status page, at most (each with every attempt's error).
const DEAD_SHOWN: usize = 50;

/// What the status page shows beside the report: the dead letters (the first
/// [`DEAD_SHOWN`], each with its stages and every attempt's error) and how many there are.
struct Dead {
    total: usize,
    shown: Vec<crate::lifecycle::report::DocumentLifecycle>,
}

/// `GET /status`: the lifecycle dashboard.
pub(super) async fn status_page(State(app): State<Arc<App>>, RawQuery(raw): RawQuery) -> Response {
    let notice = url::form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "done")
        .map(|(_, v)| v.chars().take(200).collect::<String>());
    let admin = app
        .search
        .as_ref()
        .filter(|s| s.setup.admin)
        .map(|s| s.csrf.clone());
    let report = status_report(&app).await;
    let dead = match app.search.as_ref() {
        Some(service) => {
            let uri = service.setup.uri.clone();
            tokio::task::spawn_blocking(move || dead_letters(&uri))
                .await
                .ok()
                .and_then(Result::ok)
        }
        None => None,
    };
    let body = match report {
        Ok(r) => {
            let mut body = String::new();
            if let Some(n) = notice {
                body.push_str(&format!("<p class=notice role=status>{}</p>", escape(&n)));
            }
            body.push_str(&status_html(&r));
            if let Some(token) = &admin {
                admin_html(&mut body, &r, token);
            }
            if let Some(dead) = dead {
                dead_html(&mut body, &dead, admin.as_deref());
            }
            body
        }
        Err(e) => format!("<p class=error role=alert>{}</p>", escape(&e.message)),
    };
    // An admin page is not refreshed under the operator's hands.
    html(
        "ragline status",
        &body,
        if admin.is_some() { None } else { Some(5) },
    )
}

/// A form that POSTs one admin action (with the CSRF token and `fields`), as a button.
fn action(out: &mut String, path: &str, token: &str, fields: &[(&str, &str)], label: &str) {
    out.push_str(&format!(
        "<form class=action method=post action=\"{}\"><input type=hidden name=csrf value=\"{}\">",
        escape(path),
        escape(token)
    ));
    for (k, v) in fields {
        out.push_str(&format!(
            "<input type=hidden name=\"{}\" value=\"{}\">",
            escape(k),
            escape(v)
        ));
    }
    out.push_str(&format!(
        "<button type=submit>{}</button></form>",
        escape(label)
    ));
}

/// The admin controls: pause or resume each stage, requeue every dead document, promote
/// documents by id.
fn admin_html(out: &mut String, r: &crate::lifecycle::report::StatusReport, token: &str) {
    out.push_str("<section id=admin aria-label=\"admin\"><h3>Admin</h3><p>");
    for (name, c) in &r.stages {
        if c.paused {
            action(
                out,
                "/admin/resume",
                token,
                &[("stage", name)],
                &format!("Resume {name}"),
            );
        } else {
            action(
                out,
                "/admin/pause",
                token,
                &[("stage", name)],
                &format!("Pause {name}"),
            );
        }
    }
    action(
        out,
        "/admin/requeue",
        token,
        &[],
        "Requeue every dead document",
    );
    out.push_str(&format!(
        "</p><form class=action method=post action=/admin/promote>\
         <input type=hidden name=csrf value=\"{}\"><label for=promote-ids>Embed first \
         (document ids, comma-separated)</label> <input id=promote-ids name=ids> \
         <button type=submit>Promote</button></form></section>",
        escape(token)
    ));
}

fn dead_letters(uri: &IndexUri) -> Result<Dead, StoreError> {
    let mut store = open_store(uri)?;
    let all = store.dead_letters(None)?;
    let mut shown = Vec::new();
    let mut ids: Vec<&str> = Vec::new();
    for d in &all {
        if ids.len() >= DEAD_SHOWN {
            break;
        }
        if ids.contains(&d.document_id.as_str()) {
            continue;
        }
        ids.push(&d.document_id);
        if let Some(doc) = store.document_lifecycle(&d.document_id)? {
            shown.push(doc);
        }
    }
    Ok(Dead {
        total: all.len(),
        shown,
    })
}

fn dead_html(out: &mut String, dead: &Dead, admin: Option<&str>) {
    out.push_str(&format!(
        "<h3 id=dead-letters>Dead letters: <span id=dead-total>{}</span></h3>",
        dead.total
    ));
    if dead.total > dead.shown.len() {
        out.push_str(&format!(
            "<p>The first {} (<code>ragline dlq list</code> shows them all).</p>",
            dead.shown.len()
        ));
    }
    for doc in &dead.shown {
        out.push_str(&format!(
            "<details class=dead data-document=\"{0}\" open><summary>{0}</summary>",
            escape(&doc.document_id)
        ));
        if let Some(token) = admin {
            action(
                out,
                "/admin/requeue",
                token,
                &[("doc", &doc.document_id)],
                "Requeue",
            );
        }
        out.push_str("<ul>");
        for stage in doc.stages.iter().filter(|s| s.status == "dead") {
            for e in &stage.errors {
                out.push_str(&format!(
                    "<li><b>{}</b> attempt {} ({}, {}): {}</li>",
                    escape(&stage.stage),
                    e.attempt,
                    escape(&crate::lifecycle::report::format_ms(e.at)),
                    escape(&e.worker),
                    escape(&e.message)
                ));
            }
        }
        out.push_str("</ul></details>");
    }
}

/// `POST /admin/{action}` (`--admin` only): requeue (`doc=ID`, or every dead document),
/// pause or resume (`stage=NAME`), promote (`ids=A,B`). The form's CSRF token must be the
/// server's, and a browser's Origin (when sent) this server; then 303 back to /status saying
/// what was done.
pub(super) async fn admin(
    State(app): State<Arc<App>>,
    axum::extract::Path(what): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    use subtle::ConstantTimeEq;
    let Some(service) = app.search.as_ref().filter(|s| s.setup.admin) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let form: Vec<(String, String)> = url::form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_string())
    };
    let token = field("csrf").unwrap_or_default();
    if !same_origin(&headers) || !bool::from(token.as_bytes().ct_eq(service.csrf.as_bytes())) {
        app.metrics.error("forbidden");
        return forbidden();
    }
    let uri = service.setup.uri.clone();
    let stage = field("stage");
    let doc = field("doc").filter(|d| !d.is_empty());
    let ids: Vec<String> = field("ids")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let done = tokio::task::spawn_blocking(move || -> Result<String, StoreError> {
        let mut store = open_store(&uri)?;
        Ok(match what.as_str() {
            "requeue" => {
                let one = doc.map(|d| vec![d]);
                let n = store.requeue(None, one.as_deref())?;
                format!("{n} documents queued again")
            }
            "pause" | "resume" => {
                let stage = stage.unwrap_or_default();
                store.set_paused(&stage, what == "pause")?;
                format!("{stage} {}d", what)
            }
            "promote" => {
                let n = store.promote(&ids)?;
                format!(
                    "{n} of {} documents moved to the front of the queue",
                    ids.len()
                )
            }
            _ => return Ok(String::new()),
        })
    })
    .await;
    match done {
        Ok(Ok(said)) if said.is_empty() => StatusCode::NOT_FOUND.into_response(),
        Ok(Ok(said)) => back_to_status(&said),
        Ok(Err(e)) => ApiError::bad(e.to_string()).into_response(),
        Err(e) => ApiError::bad(format!("the action failed: {e}")).into_response(),
    }
}

/// A browser's form from this server: its Origin (when sent) names the Host it was sent to.
fn same_origin(headers: &axum::http::HeaderMap) -> bool {
    match (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        (Some(origin), Some(host)) => origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .is_some_and(|(_, o)| host.to_str().is_ok_and(|h| h == o)),
        _ => true,
    }
}

/// 403 for an admin form that did not come from this server's status page.
fn forbidden() -> Response {
    let mut r = html(
        "ragline: refused",
        "<p class=error role=alert>Refused: this form did not come from this server's \
         status page (its CSRF token or origin is wrong). Reload <a href=/status>the status \
         page</a> and try again.</p>",
        None,
    );
    *r.status_mut() = StatusCode::FORBIDDEN;
    r
}

/// 303 to the status page, saying what was done.
fn back_to_status(said: &str) -> Response {
    let to = format!(
        "/status?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("done", said)
            .finish()
    );
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(&to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Bars of the last hour, one a minute, for one series; an SVG drawn on the server.
fn chart(out: &mut String, id: &str, label: &str, now_minute: i64, per_minute: &[(i64, u64)]) {
    let max = per_minute.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let total: u64 = per_minute.iter().map(|(_, n)| n).sum();
    let (w, h) = (600.0_f64, 80.0_f64);
    let bar = w / 60.0;
    out.push_str(&format!(
        "<figure id={id}><svg viewBox=\"0 0 {w} {h}\" width=100% role=img \
         aria-label=\"{label}: {total} in the last hour, at most {max} a minute\">\
         <rect width={w} height={h} fill=#f1f4f9></rect>"
    ));
    for (minute, n) in per_minute {
        let age = now_minute - minute;
        if !(0..60).contains(&age) || *n == 0 {
            continue;
        }
        let x = w - (age as f64 + 1.0) * bar;
        let bh = (*n as f64 / max as f64 * (h - 2.0)).max(1.0);
        out.push_str(&format!(
            "<rect x={x:.1} y={:.1} width={:.1} height={bh:.1} fill=#1d5fd6><title>{n}</title></rect>",
            h - bh,
            bar - 1.0
        ));
    }
    out.push_str(&format!(
        "</svg><figcaption><span>an hour ago</span><span>{label} per minute: {total} in the \
         hour, at most {max} a minute</span><span>now</span></figcaption></figure>"
    ));
}

/// The query form; `sparse`: the server encodes sparse queries, so the modes that use them
/// are offered too.
fn search_form(out: &mut String, p: &SearchParams, sparse: bool) {
    out.push_str(
        "<form method=get action=/ role=search><label for=q>Search the index</label> \
         <input id=q name=q type=search autofocus value=\"",
    );
    out.push_str(&escape(&p.q));
    out.push_str("\"> <label for=mode>mode</label> <select id=mode name=mode>");
    let mut modes = Mode::ALL.to_vec();
    if sparse {
        modes.push(Mode::Sparse);
        modes.push(Mode::Hybrid(crate::search::Fuse {
            dense: true,
            sparse: true,
            keyword: true,
        }));
    }
    if !modes.contains(&p.mode) {
        modes.push(p.mode);
    }
    for m in modes {
        out.push_str(&format!(
            "<option{}>{}</option>",
            if m == p.mode { " selected" } else { "" },
            m.name()
        ));
    }
    for f in &p.filters {
        out.push_str(&format!(
            "<input type=hidden name=where value=\"{}\">",
            escape(f)
        ));
    }
    out.push_str(&format!(
        "</select> <label for=k>k</label> <input id=k name=k type=number min=1 max={MAX_K} \
         value={}> <button type=submit>Search</button></form>",
        p.k
    ));
}

/// The search page's URL for `p` with `filters` instead of its own.
fn search_url(p: &SearchParams, filters: &[&str]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    s.append_pair("q", &p.q)
        .append_pair("mode", p.mode.name())
        .append_pair("k", &p.k.to_string());
    for f in filters {
        s.append_pair("where", f);
    }
    format!("/?{}", s.finish())
}

fn results(out: &mut String, hits: &[Hit], p: &SearchParams) {
    let query = p.q.as_str();
    let active: Vec<&str> = p.filters.iter().map(String::as_str).collect();
    super::facets::active_filters(out, &p.filters, &|i| {
        let mut rest = active.clone();
        rest.remove(i);
        search_url(p, &rest)
    });
    if hits.is_empty() {
        out.push_str("<p id=results>No results.</p>");
        return;
    }
    out.push_str(&format!(
        "<p>{} results</p><div class=layout><ol id=results class=hits>",
        hits.len()
    ));
    for h in hits {
        let c = &h.chunk;
        let url = c.metadata.get("url").and_then(|u| u.as_str());
        let doc = escape(&c.document_id);
        let title = match url.filter(|u| u.starts_with("http://") || u.starts_with("https://")) {
            Some(u) => format!("<a href=\"{}\">{doc}</a>", escape(u)),
            None => doc,
        };
        let pages = match c.pages {
            Some((a, b)) if a == b => format!(" &middot; p. {a}"),
            Some((a, b)) => format!(" &middot; pp. {a}-{b}"),
            None => String::new(),
        };
        out.push_str(&format!(
            "<li class=hit data-document=\"{}\"><div class=head><span class=score>{:.4}</span> \
             {title}{pages}</div><div class=path>{}</div><p class=snippet>{}</p>",
            escape(&c.document_id),
            h.score,
            escape(&c.heading_path),
            highlight(&snippet(&c.text, query, 320), query)
        ));
        super::facets::annotations(out, h);
        out.push_str("</li>");
    }
    out.push_str("</ol>");
    super::facets::facet_column(out, hits, &p.filters, &|f| {
        let mut more = active.clone();
        more.push(f);
        search_url(p, &more)
    });
    out.push_str("</div>");
}

fn status_html(r: &crate::lifecycle::report::StatusReport) -> String {
    let mut out = format!(
        "<h2>{}</h2><p><span id=documents>{}</span> documents, <span id=chunks>{}</span> \
         chunks</p><table id=stages><caption>Stages</caption><tr><th scope=col>stage\
         <th scope=col>pending<th scope=col>in progress<th scope=col>failed<th scope=col>dead\
         <th scope=col>done<th scope=col>oldest pending<th scope=col>state</tr>",
        escape(&r.index),
        r.documents,
        r.chunks
    );
    stage_rows(&mut out, r);
    vector_set_rows(&mut out, r);
    let now_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        / 60_000;
    let series = |f: fn(&crate::lifecycle::report::MinuteActivity) -> u64| -> Vec<(i64, u64)> {
        r.activity
            .iter()
            .map(|a| (a.minute / 60_000, f(a)))
            .collect()
    };
    chart(
        &mut out,
        "documents-chart",
        "Documents chunked",
        now_minute,
        &series(|a| a.documents),
    );
    chart(
        &mut out,
        "chunks-chart",
        "Chunks embedded",
        now_minute,
        &series(|a| a.chunks),
    );
    if let Some(b) = &r.backfill {
        out.push_str(&format!(
            "<p id=backfill>Backfill to <code>{}</code>: {} of {} documents done, {} chunks \
             embedded.</p>",
            escape(&b.model),
            b.documents_done,
            b.documents_total,
            b.chunks_embedded
        ));
    }
    out
}

/// The stages' table rows, and its end.
fn stage_rows(out: &mut String, r: &crate::lifecycle::report::StatusReport) {
    for (name, c) in &r.stages {
        let state = match (&c.circuit, c.paused) {
            (Some(open), _) => format!("circuit open: {}", escape(&open.reason)),
            (None, true) => "paused".into(),
            (None, false) => "running".into(),
        };
        let state = match c.waiting_on_dependency {
            0 => state,
            n => format!("{state}; {n} wait for a stage it depends on"),
        };
        out.push_str(&format!(
            "<tr data-stage=\"{0}\"><th scope=row>{0}<td>{1}<td>{2}<td>{3}<td>{4}<td>{5}<td>{6}<td>{7}</tr>",
            escape(name),
            c.pending,
            c.in_progress,
            c.failed,
            c.dead,
            c.done,
            c.oldest_pending_secs
                .map(|s| format!("{s:.0} s"))
                .unwrap_or_else(|| "-".into()),
            state
        ));
    }
    out.push_str("</table>");
}

/// The vector sets' table, when the index has any.
fn vector_set_rows(out: &mut String, r: &crate::lifecycle::report::StatusReport) {
    if r.vector_sets.is_empty() {
        return;
    }
    out.push_str(
        "<table id=vector-sets><caption>Vector sets</caption><tr><th scope=col>set\
         <th scope=col>model<th scope=col>dimensions<th scope=col>embedded<th scope=col>state</tr>",
    );
    for s in &r.vector_sets {
        out.push_str(&format!(
            "<tr><td>{}<td>{}<td>{}<td>{} of {}<td>{}</tr>",
            s.id,
            escape(&s.model),
            s.dimension,
            s.embedded,
            s.total,
            escape(&s.state)
        ));
    }
    out.push_str("</table>");
}

/// A page: the shared head and styles, `body`, and a refresh every `refresh` seconds.
fn html(title: &str, body: &str, refresh: Option<u32>) -> Response {
    let refresh = refresh
        .map(|s| format!("<meta http-equiv=refresh content={s}>"))
        .unwrap_or_default();
    let page = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width, initial-scale=1\">{refresh}\
         <title>{}</title><style>{STYLE}</style></head><body><header><nav aria-label=pages>\
         <a href=/>Search</a> <a href=/status>Status</a></nav></header><main>{body}</main>\
         </body></html>",
        escape(title)
    );
    let mut r = (StatusCode::OK, page).into_response();
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Nothing from elsewhere: no scripts, no frames, styles inline only.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

const STYLE: &str = "body{font:16px/1.5 system-ui,sans-serif;margin:0 auto;max-width:52rem;\
padding:0 1rem;color:#1a1a1a}nav a{margin-right:1rem}form{display:flex;flex-wrap:wrap;gap:.5rem;\
align-items:center;margin:1rem 0}input[type=search]{flex:1 1 16rem;font-size:1rem;padding:.4rem}\
input,select,button{font-size:1rem}:focus{outline:3px solid #1d5fd6;outline-offset:2px}\
.hits{padding-left:1.5rem}.hit{margin:0 0 1.2rem}.score{font-variant-numeric:tabular-nums;\
color:#555}.path{color:#555;font-size:.9rem}.snippet{margin:.2rem 0}mark{background:#ffe08a}\
.error{color:#a40000}.notice{background:#e8f5e9;padding:.4rem .6rem}\
form.action{display:inline-block;margin:0 .5rem .5rem 0}figure{margin:1rem 0}\
figcaption{display:flex;justify-content:space-between;gap:1rem;font-size:.85rem;color:#555}table{border-collapse:collapse;margin:1rem 0;width:100%}caption{text-align:\
left;font-weight:600}th,td{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left}\
.layout{display:flex;gap:1.5rem;align-items:flex-start}.layout .hits{flex:1 1 auto;min-width:0}\
#facets{flex:0 0 13rem;font-size:.9rem;overflow-wrap:anywhere}#facets ul{list-style:none;\
padding:0;margin:0 0 .8rem}#facets h2{font-size:1rem;margin:0}#facets h3{font-size:.9rem;\
margin:.6rem 0 .2rem;color:#555}.count{color:#555}.summary{margin:.2rem 0;font-style:italic}\
.labels,.entities{margin:.2rem 0;font-size:.85rem}.label,.entity,.filter{display:inline-block;\
border:1px solid #ccd;border-radius:.8rem;padding:0 .5rem;margin:0 .2rem .2rem 0}\
.hit{overflow-wrap:anywhere}\
@media (max-width:40rem){.layout{flex-direction:column}#facets{flex-basis:auto}}\
@media (max-width:30rem){table{font-size:.85rem}}";

/// HTML-escape `s` (text and attribute values).
pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The query's words (three letters or more) in `text`, marked; everything escaped.
fn highlight(text: &str, query: &str) -> String {
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
        .collect();
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.is_empty() {
            return;
        }
        let lower = word.to_lowercase();
        if words.iter().any(|w| lower.starts_with(w.as_str())) {
            out.push_str(&format!("<mark>{}</mark>", escape(word)));
        } else {
            out.push_str(&escape(word));
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push_str(&escape(&c.to_string()));
        }
    }
    flush(&mut word, &mut out);
    out
}

/// About `width` bytes of `text` around the first query word found in it, on one line.
fn snippet(text: &str, query: &str, width: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let lower = flat.to_lowercase();
    let at = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .filter_map(|w| lower.find(&w.to_lowercase()))
        .min()
        .unwrap_or(0);
    // `lower` may differ in length from `flat` (a few characters change size in lowercase):
    // clamp to a boundary of `flat`.
    let mut start = at.min(flat.len()).saturating_sub(width / 3);
    while !flat.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + width).min(flat.len());
    while !flat.is_char_boundary(end) {
        end += 1;
    }
    format!(
        "{}{}{}",
        if start > 0 { "... " } else { "" },
        &flat[start..end],
        if end < flat.len() { " ..." } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_come_from_the_query_string_with_bounds() {
        let p = SearchParams::parse(Some("q=use+state&k=5&mode=keyword&where=lang%3Den&where="))
            .unwrap();
        assert_eq!(
            p,
            SearchParams {
                q: "use state".into(),
                k: 5,
                mode: Mode::Keyword,
                filters: vec!["lang=en".into()],
            }
        );
        assert!(SearchParams::parse(Some("q=x&k=0")).is_err());
        assert!(SearchParams::parse(Some("q=x&k=1000")).is_err());
        assert!(SearchParams::parse(Some("q=x&mode=magic")).is_err());
        assert_eq!(SearchParams::parse(None).unwrap().k, 10);
    }

    #[test]
    fn pages_escape_what_the_index_holds_and_mark_the_query() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(
            highlight("Hooks let <b>you</b> use state.", "state hooks"),
            "<mark>Hooks</mark> let &lt;b&gt;you&lt;/b&gt; use <mark>state</mark>."
        );
        let s = snippet(
            &format!("{} needle {}", "a ".repeat(400), "b ".repeat(400)),
            "needle",
            60,
        );
        assert!(
            s.contains("needle") && s.starts_with("... ") && s.ends_with(" ..."),
            "{s}"
        );
        // Lowercasing that changes a character's length never cuts inside one.
        let _ = snippet("İİİİİİ needle ǅǅǅ", "needle", 4);
    }
}
