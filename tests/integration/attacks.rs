//! The second hardening round (issue 55), each finding driven as an attacker would, against
//! the binary: a foreign Host after DNS rebinding, a replayed session cookie, a login brute
//! force, a 16 MiB body of empty strings to `/rerank`, a huge k, requests that skip the
//! concurrency limit; feeds, sitemaps and crawls led to other ports, to disallowed paths and to
//! private addresses; a sitemap index of large children; a token in a feed URL; a flipped-bytes
//! ANN file; a Postgres URL with a secret in an unknown parameter; roles that meet a locked
//! index or refuse a run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::index::ingest_into;
use crate::serve::Server;
use crate::site::Site;
use crate::util::{model_dir, ragline, random_model, root, run, stdout_json, wait_for};

/// One HTTP/1.1 request on its own connection, with the headers given (Host included when
/// given; else the server's address): the status, the headers (lower-case names) and the body.
fn raw(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let code: u16 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut text = String::new();
    let _ = r.read_to_string(&mut text);
    (code, out, text)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A markdown document of a few paragraphs about `topic`.
fn doc(topic: &str) -> String {
    format!(
        "# {topic}\n\n{topic} let a component keep what it needs between renders.\n\n\
         ## Effects\n\nAn effect of {topic} runs after render and cleans up before the next.\n\n\
         ## Caveats\n\nDo not call {topic} conditionally; keep the order of calls the same.\n"
    )
}

/// A small index of the fixture docs, embedded by a random-weight model (fast): its URI.
fn small_index(dir: &Path, extra: &[&str]) -> String {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::copy(
        root().join("tests/fixtures/react/useEffect.md"),
        corpus.join("useEffect.md"),
    )
    .unwrap();
    for topic in ["useState", "useRef", "useMemo", "useContext"] {
        std::fs::write(corpus.join(format!("{topic}.md")), doc(topic)).unwrap();
    }
    let model = random_model(dir, 32, 3);
    let uri = format!("sqlite://{}", dir.join("small.db").display());
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--index")
        .arg(&uri)
        .args(extra)
        .arg(&corpus));
    assert!(o.status.success());
    uri
}

#[test]
fn serve_answers_only_the_host_names_it_is_served_by() {
    let dir = tempfile::tempdir().unwrap();
    let index = small_index(dir.path(), &[]);
    let server = Server::start_args(&["--index", &index, "--admin"], &[], dir.path(), "hosts");
    let port = server.url.rsplit(':').next().unwrap().to_string();
    let foreign = format!("attacker.example:{port}");
    // What a page that rebound attacker.example to 127.0.0.1 would get.
    for (method, path, body) in [
        ("GET", "/v1/search?q=effects", ""),
        ("GET", "/status", ""),
        ("GET", "/v1/status", ""),
        ("GET", "/", ""),
        ("POST", "/admin/pause", "stage=embed&csrf=x"),
    ] {
        let origin = format!("http://{foreign}");
        let (code, _, text) = raw(
            &server.url,
            method,
            path,
            &[
                ("Host", &foreign),
                ("Origin", &origin),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body.as_bytes(),
        );
        assert_eq!(code, 421, "{method} {path}: {text}");
        assert!(!text.contains("csrf"), "{text}");
    }
    // The stage was not paused.
    let status = stdout_json(&run(ragline().args(["status", "--json", "--index", &index])));
    assert_eq!(
        status["stages"]["embed"]["paused"],
        json!(false),
        "{status}"
    );
    // Its own names pass: loopback, the address served on; a name only when allowed.
    let search = |server: &Server, host: &str| {
        let path = "/v1/search?q=effects&mode=keyword";
        raw(&server.url, "GET", path, &[("Host", host)], b"").0
    };
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        assert_eq!(search(&server, &host), 200, "{host}");
    }
    assert_eq!(search(&server, "search.example"), 421);
    let named = Server::start_args(
        &["--index", &index, "--allowed-host", "search.example"],
        &[],
        dir.path(),
        "hosts-allowed",
    );
    assert_eq!(search(&named, "search.example"), 200);
    assert_eq!(search(&named, &foreign), 421);
    // /health says nothing and is exempt (load balancers name the service).
    let (code, _, _) = raw(&server.url, "GET", "/health", &[("Host", &foreign)], b"");
    assert_eq!(code, 200);

    // --admin on an address other than loopback without a key is refused.
    let o = run(ragline()
        .args([
            "serve", "--port", "0", "--host", "0.0.0.0", "--device", "cpu",
        ])
        .args(["--index", &index, "--admin"]));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--api-key-env"), "{err}");
}

#[test]
fn sessions_are_random_expire_and_die_with_the_server_and_logins_are_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let index = small_index(dir.path(), &[]);
    let env = [("SERVE_KEY", "correct-horse-battery")];
    let start = |name: &str| {
        Server::start_args(
            &["--index", &index, "--api-key-env", "SERVE_KEY"],
            &env,
            dir.path(),
            name,
        )
    };
    let login = |server: &Server, key: &str, extra: &[(&str, &str)]| {
        let mut headers = vec![("Content-Type", "application/x-www-form-urlencoded")];
        headers.extend_from_slice(extra);
        raw(
            &server.url,
            "POST",
            "/login",
            &headers,
            format!("key={key}").as_bytes(),
        )
    };
    let server = start("session-1");
    let (code, headers, _) = login(&server, "correct-horse-battery", &[]);
    assert_eq!(code, 303);
    let cookie = header(&headers, "set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("Max-Age=") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    assert!(!cookie.contains("Secure"), "plain http: {cookie}");
    let session = cookie.split(';').next().unwrap().to_string();
    // A second login gets another session: the cookie is not a function of the key.
    let (_, headers2, _) = login(&server, "correct-horse-battery", &[]);
    let session2 = header(&headers2, "set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_ne!(session, session2);
    // Behind TLS (a proxy says so), the cookie is Secure.
    let (_, headers3, _) = login(
        &server,
        "correct-horse-battery",
        &[("X-Forwarded-Proto", "https")],
    );
    assert!(header(&headers3, "set-cookie").unwrap().contains("Secure"));
    let (code, _, _) = raw(&server.url, "GET", "/status", &[("Cookie", &session)], b"");
    assert_eq!(code, 200);
    // Logged out: the session is gone.
    let (code, _, _) = raw(
        &server.url,
        "POST",
        "/logout",
        &[("Cookie", &session2)],
        b"",
    );
    assert_eq!(code, 303);
    let (code, _, _) = raw(&server.url, "GET", "/status", &[("Cookie", &session2)], b"");
    assert_eq!(code, 303, "to the login page");
    drop(server);

    // The same cookie replayed to the restarted server: refused.
    let server = start("session-2");
    let (code, headers, _) = raw(&server.url, "GET", "/status", &[("Cookie", &session)], b"");
    assert_eq!(code, 303, "a session of another process");
    assert_eq!(header(&headers, "location"), Some("/login"));
    let (code, _, _) = raw(
        &server.url,
        "GET",
        "/v1/status",
        &[("Cookie", &session)],
        b"",
    );
    assert_eq!(code, 401);

    // Wrong keys: a few, then 429 with Retry-After; the right key waits too.
    let mut codes = Vec::new();
    for i in 0..8 {
        codes.push(login(&server, &format!("guess-{i}"), &[]).0);
    }
    assert_eq!(&codes[..5], &[401; 5], "{codes:?}");
    assert!(codes[5..].iter().all(|c| *c == 429), "{codes:?}");
    let (code, headers, _) = login(&server, "correct-horse-battery", &[]);
    assert_eq!(code, 429);
    let wait: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
}

#[test]
fn searches_count_against_the_concurrency_limit() {
    let dir = tempfile::tempdir().unwrap();
    let index = small_index(dir.path(), &[]);
    let server = Server::start_args(
        &["--index", &index, "--max-concurrent-requests", "1"],
        &[],
        dir.path(),
        "permits",
    );
    // One request holds the only permit: its body arrives slowly.
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut slow = TcpStream::connect(&addr).unwrap();
    write!(
        slow,
        "POST /embed HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"inputs\": "
    )
    .unwrap();
    slow.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for path in ["/v1/search?q=effects", "/?q=effects"] {
        let (code, headers, text) = raw(&server.url, "GET", path, &[], b"");
        assert_eq!(code, 503, "{path}: {text}");
        assert!(header(&headers, "retry-after").is_some());
    }
    // Pages that search nothing are not held back.
    let (code, _, _) = raw(&server.url, "GET", "/v1/status", &[], b"");
    assert_eq!(code, 200);
    drop(slow);
    wait_for("the permit back", Duration::from_secs(30), || {
        raw(&server.url, "GET", "/v1/search?q=effects", &[], b"").0 == 200
    });
}

/// Peak RSS growth (MiB) of a fresh server answering one 16 MiB body of empty strings at `path`.
fn growth_for(dir: &Path, reranker: &Path, path: &str, field: &str) -> u64 {
    let server = Server::start(
        &model_dir(),
        &["--rerank-model", reranker.to_str().unwrap()],
        dir,
        &format!("rss{}", path.replace('/', "-")),
    );
    // Warm: the first request maps what every request uses.
    let small = json!({"query": "q", field: ["a"], "inputs": ["a"]}).to_string();
    let (code, _, text) = raw(
        &server.url,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        small.as_bytes(),
    );
    assert!(code == 200, "{path}: {text}");
    let before = server.peak_rss_mb();
    let mut body = format!("{{\"query\": \"q\", \"{field}\": [");
    while body.len() < (16 << 20) - 64 {
        body.push_str("\"\",");
    }
    body.push_str("\"\"]}");
    let (code, _, text) = raw(
        &server.url,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(code, 400, "{path}: {text}");
    assert!(text.contains("at most"), "{text}");
    server.peak_rss_mb().saturating_sub(before)
}

#[cfg(feature = "failpoints")]
#[test]
fn rerank_bodies_are_counted_as_they_are_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let reranker = dir.path().join("ce");
    ragline::embed::random_heads::save_random_reranker(&model_dir(), &reranker, "bert", 32, 1, 7)
        .unwrap();
    let embed = growth_for(dir.path(), &reranker, "/embed", "inputs");
    let tei = growth_for(dir.path(), &reranker, "/rerank", "texts");
    let cohere = growth_for(dir.path(), &reranker, "/v1/rerank", "documents");
    eprintln!("peak RSS growth: /embed {embed} MiB, /rerank {tei} MiB, /v1/rerank {cohere} MiB");
    let ceiling = (2 * embed).max(64);
    assert!(tei <= ceiling, "/rerank grew {tei} MiB, /embed {embed}");
    assert!(
        cohere <= ceiling,
        "/v1/rerank grew {cohere} MiB, /embed {embed}"
    );
    // Documents as {"text": ...} objects are still read (the Cohere shape).
    let server = Server::start(
        &model_dir(),
        &["--rerank-model", reranker.to_str().unwrap()],
        dir.path(),
        "cohere-shape",
    );
    let (code, body) = crate::serve::post(
        &format!("{}/v1/rerank", server.url),
        &json!({"query": "hooks", "documents": ["a", {"text": "b", "id": 3}], "top_n": 1, "return_documents": true}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["results"].as_array().unwrap().len(), 1);
    assert!(body["results"][0]["document"]["text"].is_string(), "{body}");
}

#[test]
fn a_huge_k_is_refused_by_the_cli_and_cut_by_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let index = small_index(dir.path(), &["--ann", "hnsw"]);
    for k in ["4611686018427387904", "100000000", "0"] {
        let o = run(ragline().args([
            "search", "effects", "--mode", "vector", "--index", &index, "-k", k,
        ]));
        assert_eq!(o.status.code(), Some(2), "k={k}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("1 to 10000"), "{err}");
    }
    // The library cuts what a caller passes to the set's size.
    let uri: ragline::indexers::IndexUri = index.parse().unwrap();
    let reader = ragline::search::Searcher::open(&uri, false).unwrap();
    let chunks = reader.counts().unwrap().1 as usize;
    let dim = reader.meta().dimension.unwrap();
    let searcher = ragline::search::Searcher::new(reader, None);
    let hits = searcher
        .search_with(
            "effects",
            ragline::search::QueryVectors {
                dense: Some(vec![0.1; dim]),
                sparse: None,
            },
            ragline::search::Mode::Vector,
            usize::MAX / 2,
            &ragline::search::Where::default(),
        )
        .unwrap();
    assert!(
        !hits.is_empty() && hits.len() <= chunks,
        "{} of {chunks}",
        hits.len()
    );
}

fn rss_feed(items: &[(&str, &str)]) -> String {
    let mut out = String::from(
        "<?xml version=\"1.0\"?><rss version=\"2.0\"><channel><title>notes</title>\
         <link>https://example.invalid/</link><description>d</description>",
    );
    for (guid, link) in items {
        out.push_str(&format!(
            "<item><title>{guid}</title><guid isPermaLink=\"false\">{guid}</guid>\
             <link>{link}</link><description>the entry {guid}</description></item>"
        ));
    }
    out.push_str("</channel></rss>");
    out
}

fn html(title: &str, text: &str) -> String {
    format!("<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>")
}

fn reason(report: &Value, id: &str) -> String {
    for list in ["failures", "dropped"] {
        if let Some(f) = report[list]
            .as_array()
            .and_then(|a| a.iter().find(|f| f["id"] == id))
        {
            return format!("{list}: {}", f["reason"].as_str().unwrap_or(""));
        }
    }
    String::new()
}

#[test]
fn feeds_and_sitemaps_stay_on_their_origin_and_obey_robots_after_every_redirect() {
    let (site, other) = (Site::start(), Site::start());
    site.put(
        "/robots.txt",
        "text/plain",
        "User-agent: *\nDisallow: /private/\n",
    );
    for p in ["/ok.html", "/private/secret.html"] {
        site.put(p, "text/html", &html("page", "Hooks let you use state."));
    }
    other.put(
        "/elsewhere.html",
        "text/html",
        &html("other", "Another port."),
    );
    site.redirect("/to-other.html", &other.url("/elsewhere.html"));
    site.redirect("/to-private.html", "/private/secret.html");
    site.put(
        "/feed.xml",
        "application/rss+xml",
        &rss_feed(&[
            ("ok", &site.url("/ok.html")),
            ("other-port", &other.url("/elsewhere.html")),
            ("redirect-out", &site.url("/to-other.html")),
            ("disallowed", &site.url("/private/secret.html")),
            ("redirect-disallowed", &site.url("/to-private.html")),
        ]),
    );
    let dir = tempfile::tempdir().unwrap();
    let feed = site.url("/feed.xml");
    let uri = format!("sqlite://{}", dir.path().join("f.db").display());
    let (code, report) = ingest_into(
        Path::new(&feed),
        &uri,
        &dir.path().join("feed.json"),
        &["--follow-links", "--fetch-timeout", "5"],
    );
    assert!(code.is_some(), "{report}");
    let id = |g: &str| format!("{feed}#{g}");
    assert_eq!(reason(&report, &id("ok")), "", "{report}");
    assert_eq!(
        other.hits("/elsewhere.html"),
        0,
        "another port of 127.0.0.1 was read"
    );
    assert_eq!(
        site.hits("/private/secret.html"),
        0,
        "a disallowed page was read"
    );
    assert!(
        reason(&report, &id("redirect-out")).contains("another site"),
        "{report}"
    );
    assert!(
        reason(&report, &id("redirect-disallowed")).contains("robots.txt"),
        "{report}"
    );
    assert!(
        reason(&report, &id("disallowed")).contains("robots.txt"),
        "{report}"
    );

    // A sitemap entry that redirects to another port, or to a disallowed path: not read.
    site.put(
        "/sitemap.xml",
        "application/xml",
        &format!(
            "<urlset><url><loc>{}</loc></url><url><loc>{}</loc></url><url><loc>{}</loc></url></urlset>",
            site.url("/ok.html"),
            site.url("/to-other.html"),
            site.url("/to-private.html")
        ),
    );
    let uri = format!("sqlite://{}", dir.path().join("s.db").display());
    let (_, report) = ingest_into(
        Path::new(&site.url("/sitemap.xml")),
        &uri,
        &dir.path().join("sitemap.json"),
        &["--crawl-rps", "1000", "--fetch-timeout", "5"],
    );
    assert_eq!(report["counts"]["indexed"], json!(1), "{report}");
    assert_eq!(other.hits("/elsewhere.html"), 0);
    assert_eq!(site.hits("/private/secret.html"), 0);
    let ids: Vec<String> = crate::objects::documents(&dir.path().join("s.db"))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, [site.url("/ok.html")], "{report}");
}

#[test]
fn robots_txt_is_read_before_the_start_page_and_a_sitemap_index_stops_when_enough_is_known() {
    let site = Site::start();
    site.put(
        "/robots.txt",
        "text/plain",
        "User-agent: *\nDisallow: /closed/\nDisallow: /maps/closed.xml\n",
    );
    site.put(
        "/closed/index.html",
        "text/html",
        &html("closed", "not for crawlers"),
    );
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("sqlite://{}", dir.path().join("r.db").display());
    let (code, report) = ingest_into(
        Path::new(&site.url("/closed/index.html")),
        &uri,
        &dir.path().join("r.json"),
        &["--crawl-rps", "1000"],
    );
    assert_ne!(code, Some(0), "{report}");
    assert_eq!(
        site.hits("/closed/index.html"),
        0,
        "the start page was fetched first"
    );
    assert_eq!(site.hits("/robots.txt"), 1);

    // An index of 20 sitemaps of 200 pages each (each padded to ~1 MB): with
    // --crawl-max-pages 5 only the first is read; a disallowed child never is.
    let mut index = String::from("<sitemapindex>");
    index.push_str(&format!(
        "<sitemap><loc>{}</loc></sitemap>",
        site.url("/maps/closed.xml")
    ));
    for m in 0..20 {
        let mut map = String::from("<urlset>");
        for p in 0..200 {
            let path = format!("/pages/{m}-{p}.html");
            map.push_str(&format!("<url><loc>{}</loc></url>", site.url(&path)));
            site.put(
                &path,
                "text/html",
                &html(&format!("page {m}-{p}"), "Effects and state."),
            );
        }
        map.push_str(&"<!-- padding -->".repeat(60_000));
        map.push_str("</urlset>");
        site.put(&format!("/maps/{m}.xml"), "application/xml", &map);
        index.push_str(&format!(
            "<sitemap><loc>{}</loc></sitemap>",
            site.url(&format!("/maps/{m}.xml"))
        ));
    }
    site.put("/maps/closed.xml", "application/xml", "<urlset></urlset>");
    index.push_str("</sitemapindex>");
    site.put("/sitemap_index.xml", "application/xml", &index);
    let uri = format!("sqlite://{}", dir.path().join("m.db").display());
    let (code, report) = ingest_into(
        Path::new(&site.url("/sitemap_index.xml")),
        &uri,
        &dir.path().join("m.json"),
        &["--crawl-rps", "1000", "--crawl-max-pages", "5"],
    );
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["counts"]["indexed"], json!(5), "{report}");
    assert_eq!(site.hits("/maps/0.xml"), 1);
    let later: usize = (1..20).map(|m| site.hits(&format!("/maps/{m}.xml"))).sum();
    assert_eq!(later, 0, "sitemaps read past what --crawl-max-pages needs");
    assert_eq!(
        site.hits("/maps/closed.xml"),
        0,
        "a disallowed sitemap was read"
    );
}

#[test]
fn a_name_that_resolves_to_a_private_address_is_refused_unless_allowed() {
    let site = Site::start();
    site.put(
        "/feed.xml",
        "application/rss+xml",
        &rss_feed(&[("one", "https://example.invalid/one")]),
    );
    let port = site.url("").rsplit(':').next().unwrap().to_string();
    // rebind.test resolves to 127.0.0.1 (the test build's resolver table): a public-looking
    // name pointing inside, as DNS rebinding or a metadata service's alias would.
    let feed = format!("http://rebind.test:{port}/feed.xml");
    let dir = tempfile::tempdir().unwrap();
    let ingest = |extra: &[&str], name: &str| {
        let uri = format!(
            "sqlite://{}",
            dir.path().join(format!("{name}.db")).display()
        );
        run(ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(model_dir())
            .args(["--index", &uri, "--fetch-timeout", "5"])
            .args(extra)
            .arg(&feed)
            .env("RAGLINE_TEST_RESOLVE", "rebind.test=127.0.0.1"))
    };
    let o = ingest(&[], "refused");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--allow-private-addresses"), "{err}");
    assert_eq!(site.hits("/feed.xml"), 0);
    let o = ingest(&["--allow-private-addresses"], "allowed");
    assert!(o.status.success());
    assert_eq!(site.hits("/feed.xml"), 1);
}

#[test]
fn a_token_in_a_feed_url_is_kept_out_of_the_index_and_the_pages() {
    const TOKEN: &str = "s3cr3t-t0ken-42";
    let site = Site::start();
    let path = format!("/feed.xml?token={TOKEN}&page=1");
    site.put(
        &path,
        "application/rss+xml",
        &rss_feed(&[
            ("one", "https://example.invalid/one"),
            ("two", "https://example.invalid/two"),
        ]),
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let uri = format!("sqlite://{}", db.display());
    let (code, report) = ingest_into(
        Path::new(&site.url(&path)),
        &uri,
        &dir.path().join("t.json"),
        &[],
    );
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["counts"]["indexed"], json!(2), "{report}");
    assert!(!report.to_string().contains(TOKEN));
    // Not in any byte of the index (ids, source, metadata, full text), WAL included.
    for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
        let bytes = std::fs::read(f.path()).unwrap_or_default();
        let found = bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes());
        assert!(!found, "{} holds the token", f.path().display());
    }
    let server = Server::start_args(&["--index", &uri], &[], dir.path(), "token-page");
    let (code, _, page) = raw(&server.url, "GET", "/?q=entry&mode=keyword", &[], b"");
    assert_eq!(code, 200);
    assert!(page.contains("token=***"), "{page}");
    assert!(!page.contains(TOKEN));
}

#[test]
fn a_flipped_ann_file_is_found_out_scanned_exactly_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let index = small_index(dir.path(), &["--ann", "hnsw"]);
    let db = PathBuf::from(index.trim_start_matches("sqlite://"));
    let ann_dir = ragline::indexers::sqlite::ann::dir_of(&db);
    let files: Vec<PathBuf> = std::fs::read_dir(&ann_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "usearch"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let search = |exact: bool| {
        let mut cmd = ragline();
        cmd.args([
            "search",
            "how do effects clean up",
            "--mode",
            "vector",
            "-k",
            "3",
            "--json",
            "--no-promote",
        ])
        .args(["--index", &index]);
        if exact {
            cmd.arg("--exact");
        }
        let o = run(&mut cmd);
        assert!(o.status.success());
        (
            stdout_json(&o),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (want, _) = search(true);
    // Bytes 200..n/2 overwritten; the header (and the length) intact.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let n = bytes.len();
    for b in &mut bytes[200..n / 2] {
        *b ^= 0x5a;
    }
    std::fs::write(&files[0], &bytes).unwrap();
    let (got, err) = search(false);
    assert!(err.contains("checksum"), "{err}");
    assert_eq!(got[0]["id"], want[0]["id"]);
    assert_eq!(got[0]["score"], want[0]["score"], "the exact answer");
    // The next writer rebuilds it: then the ANN answers again, without a warning.
    let o = run(ragline().args(["enrich", "--index", &index, "--progress", "none"]));
    assert!(o.status.success());
    let (got, err) = search(false);
    assert!(!err.contains("checksum"), "{err}");
    assert_eq!(got[0]["id"], want[0]["id"]);
}

#[test]
fn a_postgres_url_never_shows_the_values_of_unknown_parameters() {
    let uri = "postgres://me@127.0.0.1:1/db?sslpassword=hunter2-secret&application_name=rl&bogus_option=zz-private";
    let o = run(ragline().args(["search", "x", "--mode", "keyword", "--index", uri]));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("hunter2-secret") && !err.contains("zz-private"),
        "{err}"
    );
    assert!(
        err.contains("sslpassword=***") || err.contains("bogus_option"),
        "{err}"
    );
}

#[test]
fn processes_opening_one_index_together_wait_for_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 5);
    let db = dir.path().join("shared.db");
    let uri = format!("sqlite://{}", db.display());
    // The test holds the new file's write lock while the processes start.
    let holder = rusqlite::Connection::open(&db).unwrap();
    holder
        .execute_batch("BEGIN EXCLUSIVE; CREATE TABLE t(x);")
        .unwrap();
    let mut children = Vec::new();
    for topic in ["useState", "useRef", "useMemo"] {
        let corpus = dir.path().join(topic);
        std::fs::create_dir_all(&corpus).unwrap();
        std::fs::write(corpus.join(format!("{topic}.md")), doc(topic)).unwrap();
        children.push(
            ragline()
                .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
                .arg(&model)
                .args(["--index", &uri])
                .arg(&corpus)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    std::thread::sleep(Duration::from_millis(1500));
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    for child in children {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let status = stdout_json(&run(ragline().args(["status", "--json", "--index", &uri])));
    assert_eq!(status["documents"], json!(3), "{status}");
}

#[test]
fn a_publisher_says_when_roles_refuse_its_run() {
    let Some(nats) = crate::distributed::Nats::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let queue = nats.url();
    // The worker was given another index than the run's: it refuses the run.
    let wrong = dir.path().join("wrong.db");
    std::fs::write(&wrong, b"this is not an index").unwrap();
    let mut worker = ragline()
        .args(["worker", "--queue", &queue, "--index"])
        .arg(format!("sqlite://{}", wrong.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let corpus = dir.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::copy(
        root().join("tests/fixtures/react/useEffect.md"),
        corpus.join("a.md"),
    )
    .unwrap();
    let log = dir.path().join("publisher.log");
    let mut publisher = ragline()
        .args([
            "ingest",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--queue",
            &queue,
            "--model",
        ])
        .arg(model_dir())
        .arg("--index")
        .arg(format!("sqlite://{}", dir.path().join("good.db").display()))
        .arg(&corpus)
        .env("RAGLINE_TEST_JOIN_WARNING_SECS", "3")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    wait_for(
        "the publisher to say the worker refused",
        Duration::from_secs(120),
        || {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            said.contains("refused run") && said.contains("no worker has joined")
        },
    );
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("wrong.db"), "the reason: {said}");
    assert!(said.contains("(1 refused it, said above)"), "{said}");
    eprintln!("said after {:?}:\n{said}", started.elapsed());
    let _ = publisher.kill();
    let _ = publisher.wait();
    let _ = worker.kill();
    let _ = worker.wait();
}

/// A PDF whose one object is an array nested `depth` deep: a recursive parser runs out of
/// stack long before the end.
pub fn nested_pdf(depth: usize) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n");
    body.extend_from_slice(b"2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n");
    body.extend_from_slice(b"3 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>\nendobj\n");
    body.extend_from_slice(b"4 0 obj\n");
    body.extend(std::iter::repeat_n(b'[', depth));
    body.extend(std::iter::repeat_n(b']', depth));
    body.extend_from_slice(b"\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n");
    body
}

#[test]
fn a_parser_that_overflows_its_stack_fails_its_file_alone_when_isolated() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::write(corpus.join("deep.pdf"), nested_pdf(200_000)).unwrap();
    std::fs::copy(
        root().join("tests/fixtures/react/useEffect.md"),
        corpus.join("good.md"),
    )
    .unwrap();
    let o = run(ragline()
        .args(["extract", "--json", "--isolate-extraction"])
        .arg(corpus.join("deep.pdf"))
        .arg(corpus.join("good.md"))
        .env("RAGLINE_BIN", env!("CARGO_BIN_EXE_ragline")));
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "both files answered");
    assert_eq!(lines[0]["status"], "failed", "{}", lines[0]);
    assert!(
        lines[0]["reason"].as_str().unwrap().contains("crashed"),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1]["status"], "indexed", "{}", lines[1]["status"]);
    // An ingest with it: the run ends, the good file indexed, the bad one failed alone.
    let uri = format!("sqlite://{}", dir.path().join("i.db").display());
    let (code, report) = ingest_into(
        &corpus,
        &uri,
        &dir.path().join("i.json"),
        &["--isolate-extraction"],
    );
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["counts"]["indexed"], json!(1), "{report}");
    assert_eq!(report["counts"]["failed"], json!(1), "{report}");
}
