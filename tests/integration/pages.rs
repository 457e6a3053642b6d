//! `ragline serve --index`: the index searched over HTTP and shown in pages. `/v1/search`
//! answers what `ragline search --json` prints for the same query; the search page renders a
//! query from its URL with the hits, their documents and the query's words marked; `/status`
//! and `/v1/status` show what `ragline status --json` says. The model is the index's own.

use serde_json::Value;

use crate::distributed::react_slice;
use crate::serve::{get, Server};
use crate::util::{model_dir, ragline, run};

/// The react-docs slice `corpus` ingested into `DIR/react.db` with the real model: its URI.
fn ingest_react(dir: &std::path::Path, corpus: &std::path::Path) -> String {
    let index = format!("sqlite://{}", dir.join("react.db").display());
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(&index)
        .arg(corpus));
    assert!(o.status.success());
    index
}

#[test]
fn serve_with_an_index_searches_it_and_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(corpus) = react_slice(dir.path(), 8) else {
        return;
    };
    let index = ingest_react(dir.path(), &corpus);

    // No --model: the server loads the index's own.
    let server = Server::start_args(&["--index", &index], &[], dir.path(), "pages");
    let query = "how does a component remember state between renders";
    for mode in ["hybrid", "vector", "keyword"] {
        let o = run(ragline()
            .args([
                "search",
                query,
                "-k",
                "5",
                "--json",
                "--no-promote",
                "--mode",
                mode,
            ])
            .arg("--index")
            .arg(&index));
        let want: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
        let (status, body) = get(&format!(
            "{}/v1/search?q={}&k=5&mode={mode}",
            server.url,
            query.replace(' ', "+")
        ));
        assert_eq!(status, 200, "{body}");
        let got: Vec<Value> = serde_json::from_str(&body).unwrap();
        assert_eq!(got.len(), want.len(), "{mode}");
        assert!(!got.is_empty());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g["id"], w["id"], "{mode}: {body}");
            assert_eq!(g["rank"], w["rank"]);
            let (gs, ws) = (g["score"].as_f64().unwrap(), w["score"].as_f64().unwrap());
            assert!((gs - ws).abs() < 1e-4, "{mode}: {gs} vs {ws}");
        }
    }

    // The search page renders the query in its URL: the top hit's document, the words marked.
    let o = run(ragline()
        .args(["search", query, "-k", "3", "--json", "--no-promote"])
        .arg("--index")
        .arg(&index));
    let want: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let top = want[0]["document_id"].as_str().unwrap();
    let (status, page) = get(&format!(
        "{}/?q={}&k=3&mode=hybrid",
        server.url,
        query.replace(' ', "+")
    ));
    assert_eq!(status, 200);
    assert!(page.starts_with("<!doctype html>"), "{page}");
    assert!(page.contains(&format!("data-document=\"{top}\"")), "{page}");
    assert!(page.contains("<mark>"), "{page}");
    assert_eq!(page.matches("class=hit ").count(), 3, "{page}");
    assert!(
        page.contains(&format!("value=\"{query}\"")),
        "the query stays in the box"
    );
    // What a query carries is escaped, never markup.
    let (_, page) = get(&format!(
        "{}/?q=%3Cscript%3Ealert(1)%3C/script%3E",
        server.url
    ));
    assert!(!page.contains("<script>") && page.contains("&lt;script&gt;"));

    // Bad parameters are refused with the reason.
    let (status, body) = get(&format!("{}/v1/search?q=x&k=0", server.url));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`k`"), "{body}");
    let (status, body) = get(&format!("{}/v1/search?k=3", server.url));
    assert_eq!(status, 400, "{body}");
    let (status, body) = get(&format!("{}/v1/search?q=x&where=nonsense", server.url));
    assert_eq!(status, 400, "{body}");
    // An index without sparse vectors: sparse search says how to add them.
    let (status, body) = get(&format!("{}/v1/search?q=x&mode=sparse", server.url));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("enrich --stage sparse"), "{body}");
    assert!(!page.contains("<option>sparse</option>"), "{page}");

    assert!(server.log().contains("GET /v1/search"), "{}", server.log());

    // The status: what `ragline status --json` says.
    let o = run(ragline().args(["status", "--json", "--index"]).arg(&index));
    let status_cli: Value = serde_json::from_slice(&o.stdout).unwrap();
    let (code, body) = get(&format!("{}/v1/status", server.url));
    assert_eq!(code, 200, "{body}");
    let status_api: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status_api["documents"], status_cli["documents"]);
    assert_eq!(status_api["chunks"], status_cli["chunks"]);
    assert_eq!(status_api["stages"], status_cli["stages"]);
    let (code, page) = get(&format!("{}/status", server.url));
    assert_eq!(code, 200);
    assert!(
        page.contains(&format!(
            "<span id=documents>{}</span>",
            status_cli["documents"]
        )) && page.contains(&format!("<span id=chunks>{}</span>", status_cli["chunks"])),
        "{page}"
    );
    let done = &status_cli["stages"]["embed"]["done"];
    assert!(
        page.contains(&format!(
            "<th scope=row>embed<td>0<td>0<td>0<td>0<td>{done}<td>"
        )),
        "{page}"
    );
}

/// A GET or form POST that does not follow redirects: (status, Location, Set-Cookie, body).
fn exchange(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    form: Option<&str>,
) -> (u16, String, String, String) {
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let mut req = agent.request(method, url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let answer = match form {
        Some(body) => req
            .set("Content-Type", "application/x-www-form-urlencoded")
            .send_string(body),
        None => req.call(),
    };
    let r = match answer {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    let header = |name: &str| r.header(name).unwrap_or("").to_string();
    let (status, location, cookie) = (r.status(), header("location"), header("set-cookie"));
    (
        status,
        location,
        cookie,
        r.into_string().unwrap_or_default(),
    )
}

/// With an API key, the API wants the bearer key and a browser signs in once: the login form
/// sets a session cookie (HttpOnly, SameSite=Strict, not the key itself) that opens the pages.
#[test]
fn an_api_key_guards_the_pages_through_a_login() {
    let dir = tempfile::tempdir().unwrap();
    let Some(corpus) = react_slice(dir.path(), 2) else {
        return;
    };
    let index = ingest_react(dir.path(), &corpus);
    let key = "k3y-for-the-pages";
    let server = Server::start_args(
        &["--index", &index, "--api-key-env", "PAGES_KEY"],
        &[("PAGES_KEY", key)],
        dir.path(),
        "pages-key",
    );
    let url = |p: &str| format!("{}{p}", server.url);
    assert_eq!(
        exchange("GET", &url("/v1/search?q=state"), &[], None).0,
        401
    );
    let bearer = format!("Bearer {key}");
    let (status, ..) = exchange(
        "GET",
        &url("/v1/search?q=state"),
        &[("Authorization", &bearer)],
        None,
    );
    assert_eq!(status, 200);
    let (status, location, ..) = exchange("GET", &url("/?q=state"), &[], None);
    assert_eq!((status, location.as_str()), (303, "/login"));
    assert_eq!(exchange("GET", &url("/login"), &[], None).0, 200);
    let (status, _, cookie, _) = exchange("POST", &url("/login"), &[], Some("key=wrong"));
    assert_eq!((status, cookie.as_str()), (401, ""));
    let (status, location, cookie, _) =
        exchange("POST", &url("/login"), &[], Some(&format!("key={key}")));
    assert_eq!((status, location.as_str()), (303, "/"));
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && !cookie.contains(key),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap();
    let (status, _, _, page) = exchange("GET", &url("/?q=state"), &[("Cookie", session)], None);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("class=hit "), "{page}");
    assert_eq!(
        exchange(
            "GET",
            &url("/status"),
            &[("Cookie", "ragline_session=forged")],
            None
        )
        .0,
        303
    );
}

#[test]
fn serve_without_an_index_has_no_pages() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&model_dir(), &[], dir.path(), "no-index");
    for path in ["/", "/status", "/v1/search?q=x"] {
        let (status, _) = get(&format!("{}{path}", server.url));
        assert_eq!(status, 404, "{path}");
    }
}

/// Debian's Chromium, or None (with a message) when the browser test is not asked for.
pub(crate) fn chromium() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("RAGLINE_CHROMIUM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/chromium".into());
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("RAGLINE_REQUIRE_BROWSER").as_deref() != Ok("1"),
        "no Chromium at {} and RAGLINE_REQUIRE_BROWSER=1: `apt-get install chromium` (or \
         scripts/browser-venv.sh --chromium), or set RAGLINE_CHROMIUM",
        path.display()
    );
    eprintln!(
        "SKIPPED (browser): no Chromium at {}; `apt-get install chromium` to include the \
         browser test",
        path.display()
    );
    None
}

/// A real browser (headless Chromium driven by Playwright) types a query into the search
/// page, submits it and finds the document `ragline search` ranks first among the results;
/// the status page shows the counts `ragline status --json` gives; the page fits a phone's
/// width. Screenshots of both pages land in the test target's `screenshots/`.
#[test]
fn a_browser_searches_the_index_and_reads_its_status() {
    let Some(chromium) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(corpus) = react_slice(dir.path(), 8) else {
        return;
    };
    let index = ingest_react(dir.path(), &corpus);
    let query = "how does a component remember state between renders";
    let o = run(ragline()
        .args([
            "search",
            query,
            "-k",
            "10",
            "--json",
            "--no-promote",
            "--index",
        ])
        .arg(&index));
    let want: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let top = want[0]["document_id"].as_str().unwrap().to_string();
    let o = run(ragline().args(["status", "--json", "--index"]).arg(&index));
    let status: Value = serde_json::from_slice(&o.stdout).unwrap();

    let server = Server::start_args(&["--index", &index], &[], dir.path(), "browser");
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let python = std::process::Command::new(crate::util::root().join("scripts/browser-venv.sh"))
        .output()
        .expect("scripts/browser-venv.sh");
    assert!(
        python.status.success(),
        "scripts/browser-venv.sh: {}",
        String::from_utf8_lossy(&python.stderr)
    );
    let python = String::from_utf8_lossy(&python.stdout).trim().to_string();
    let o = run(std::process::Command::new(python)
        .arg(crate::util::root().join("scripts/browser-check.py"))
        .arg(&server.url)
        .arg(query)
        .arg(&shots)
        .arg("--chromium")
        .arg(&chromium));
    assert!(
        o.status.success(),
        "browser-check: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let seen: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(seen["focused_on_load"], "q", "{seen}");
    assert_eq!(seen["query_in_box"], query, "{seen}");
    assert!(
        seen["search_url"]
            .as_str()
            .unwrap()
            .contains("q=how+does+a+component"),
        "the query lives in the URL: {seen}"
    );
    let hits = seen["hits"].as_array().unwrap();
    assert_eq!(hits.len(), want.len(), "{seen}");
    assert_eq!(hits[0]["document"], top.as_str(), "{seen}");
    assert!(
        hits.iter().all(|h| h["marked"].as_u64().unwrap() > 0),
        "{seen}"
    );
    assert_eq!(seen["phone_overflow"], false, "{seen}");
    assert_eq!(
        seen["status"]["documents"].as_str().unwrap(),
        status["documents"].to_string()
    );
    assert_eq!(
        seen["status"]["chunks"].as_str().unwrap(),
        status["chunks"].to_string()
    );
    let embed = &seen["status"]["stages"]["embed"];
    assert_eq!(
        embed[4].as_str().unwrap(),
        status["stages"]["embed"]["done"].to_string()
    );
    for shot in ["search.png", "search-phone.png", "status.png"] {
        let size = std::fs::metadata(shots.join(shot)).map_or(0, |m| m.len());
        assert!(size > 10_000, "{shot}: {size} bytes");
    }
}
