//! Web sites as a source, against a local HTTP server serving a generated site (`site.rs`)
//! with a robots.txt, a sitemap, a redirect, a 404, a slow page, a page reached under two URLs
//! and a page outside the crawl's prefix. A crawl reads what it may and reports the rest per
//! page; a re-run embeds nothing that did not change; a changed, an added and a removed page
//! are re-embedded, added and pruned. A sitemap's dates spare the downloads of unchanged pages.

use std::path::Path;

use serde_json::{json, Value};

use crate::index::ingest_into;
use crate::objects::documents;
use crate::site::Site;

fn page(title: &str, text: &str, links: &[&str]) -> String {
    let links: String = links
        .iter()
        .map(|l| format!("<li><a href=\"{l}\">{l}</a></li>"))
        .collect();
    format!(
        "<!doctype html><html><head><title>{title}</title></head><body><h1>{title}</h1>\
         <p>{text}</p><ul>{links}</ul></body></html>"
    )
}

/// The reason the report's `list` (`failures`, `dropped`) gives for `id`.
pub fn outcome<'a>(r: &'a Value, list: &str, id: &str) -> &'a str {
    r[list]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no {list} entry for {id}: {r}"))["reason"]
        .as_str()
        .unwrap()
}

const INDEX_LINKS: &[&str] = &[
    "a.html",
    "a.html?ref=nav#top",
    "b.html",
    "private/secret.html",
    "missing.html",
    "old.html",
    "slow.html",
    "../outside.html",
    "c1.html",
];

fn site() -> Site {
    let site = Site::start();
    site.put(
        "/robots.txt",
        "text/plain",
        "User-agent: *\nDisallow: /docs/private/\n",
    );
    site.put(
        "/docs/index.html",
        "text/html",
        &page(
            "Docs",
            "The documentation of the widget library.",
            INDEX_LINKS,
        ),
    );
    let a = "<!doctype html><html><head><link rel=\"canonical\" href=\"/docs/a.html\"></head>\
             <body><h1>Hooks</h1><p>Hooks let you use state without writing a class.</p>\
             <a href=\"index.html\">home</a></body></html>";
    site.put("/docs/a.html", "text/html", a);
    site.put("/docs/a.html?ref=nav", "text/html", a);
    site.put(
        "/docs/b.html",
        "text/html",
        &page("Routing", "A router maps URLs to pages.", &[]),
    );
    site.put(
        "/docs/private/secret.html",
        "text/html",
        &page("Secret", "Not for crawlers.", &[]),
    );
    site.redirect("/docs/old.html", "/docs/moved.html");
    site.put(
        "/docs/moved.html",
        "text/html",
        &page("Moved", "This page moved here.", &[]),
    );
    site.put_slow(
        "/docs/slow.html",
        &page("Slow", "Too slow.", &[]),
        std::time::Duration::from_secs(3),
    );
    site.put(
        "/outside.html",
        "text/html",
        &page("Outside", "Not under /docs/.", &[]),
    );
    site.put(
        "/docs/c1.html",
        "text/html",
        &page("C1", "One link deep.", &["c2.html"]),
    );
    site.put(
        "/docs/c2.html",
        "text/html",
        &page("C2", "Two links deep.", &["c3.html"]),
    );
    site.put(
        "/docs/c3.html",
        "text/html",
        &page("C3", "Three links deep.", &[]),
    );
    site
}

const CRAWL: &[&str] = &[
    "--crawl-rps",
    "1000",
    "--fetch-timeout",
    "1",
    "--crawl-depth",
    "2",
];

#[test]
fn a_site_is_crawled_within_its_prefix_obeying_robots_and_reporting_each_page() {
    let site = site();
    let start = site.url("/docs/index.html");
    let u = |p: &str| site.url(&format!("/docs/{p}"));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("site.db");
    let uri = format!("sqlite://{}", db.display());
    let report = dir.path().join("r.json");

    let (code, first) = ingest_into(Path::new(&start), &uri, &report, CRAWL);
    // 1: the slow page failed; the crawl went on.
    assert_eq!(code, Some(1), "{first}");
    let c = &first["counts"];
    assert_eq!(
        (&c["published"], &c["indexed"], &c["failed"], &c["dropped"]),
        (&json!(9), &json!(6), &json!(1), &json!(2)),
        "{first}"
    );
    assert!(outcome(&first, "failures", &u("slow.html")).contains("timed out"));
    assert!(outcome(&first, "dropped", &u("private/secret.html")).contains("robots.txt"));
    assert!(outcome(&first, "dropped", &u("missing.html")).contains("HTTP 404"));
    let ids: Vec<String> = documents(&db).into_iter().map(|d| d.0).collect();
    assert_eq!(
        ids,
        [
            u("a.html"),
            u("b.html"),
            u("c1.html"),
            u("c2.html"),
            u("index.html"),
            u("moved.html")
        ]
    );
    // Not asked for: disallowed, outside the prefix, past the depth.
    for path in [
        "/docs/private/secret.html",
        "/outside.html",
        "/docs/c3.html",
    ] {
        assert_eq!(site.hits(path), 0, "{path}");
    }
    // The page reached under a second URL was read and recognised by its canonical URL.
    assert_eq!(site.hits("/docs/a.html?ref=nav"), 1);

    // Nothing changed: every page the index holds is asked for with a conditional GET and
    // answers 304 (no body): nothing chunked or embedded, and nothing downloaded but the page
    // reached under a second URL (`?ref=nav`: the index knows its canonical URL only). Their
    // stored links are followed as if they had been read: the slow page is tried again, the
    // 404 found again.
    let (_, same) = ingest_into(Path::new(&start), &uri, &report, CRAWL);
    let c = &same["counts"];
    assert_eq!(
        (
            &c["published"],
            &c["unchanged"],
            &c["failed"],
            &c["dropped"]
        ),
        (&json!(9), &json!(6), &json!(1), &json!(2)),
        "{same}"
    );
    for path in [
        "/docs/index.html",
        "/docs/a.html",
        "/docs/b.html",
        "/docs/c1.html",
        "/docs/c2.html",
        "/docs/moved.html",
    ] {
        assert_eq!(site.not_modified(path), 1, "{path}: {same}");
    }
    assert_eq!(
        (
            &same["fetched"]["items"],
            &c["children_created"],
            &same["chunks_embedded"]
        ),
        (&json!(1), &json!(0), &json!(0)),
        "{same}"
    );
    assert_eq!(site.hits("/docs/a.html?ref=nav"), 2);
    assert!(outcome(&same, "failures", &u("slow.html")).contains("timed out"));

    // b changed, d added (linked from the index, which changes too), c2 removed (404).
    site.put(
        "/docs/b.html",
        "text/html",
        &page("Routing", "A router maps each URL to a page and back.", &[]),
    );
    let mut links = INDEX_LINKS.to_vec();
    links.push("d.html");
    site.put(
        "/docs/index.html",
        "text/html",
        &page("Docs", "The documentation of the widget library.", &links),
    );
    site.put(
        "/docs/d.html",
        "text/html",
        &page("Context", "Context passes data deep down the tree.", &[]),
    );
    site.remove("/docs/c2.html");
    let mut args = CRAWL.to_vec();
    args.push("--prune");
    let (_, third) = ingest_into(Path::new(&start), &uri, &report, &args);
    let c = &third["counts"];
    assert_eq!(
        (&c["indexed"], &c["unchanged"], &third["pruned"]),
        (&json!(6), &json!(3), &json!(1)),
        "{third}"
    );
    // Downloaded: what changed (the index page, b), what is new (d), and the second URL.
    assert_eq!(third["fetched"]["items"], 4, "{third}");
    let ids: Vec<String> = documents(&db).into_iter().map(|d| d.0).collect();
    assert!(
        ids.contains(&u("d.html")) && !ids.contains(&u("c2.html")),
        "{ids:?}"
    );
    assert!(documents(&db)[1].1.contains("and back"));
}

#[test]
fn a_sitemap_spares_the_downloads_of_pages_whose_date_did_not_move() {
    let site = site();
    let map = |b_date: &str| {
        format!(
            "<?xml version=\"1.0\"?><urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\">\
             <url><loc>{}</loc><lastmod>2026-12-01</lastmod></url>\
             <url><loc>{}</loc><lastmod>{b_date}</lastmod></url>\
             <url><loc>{}</loc></url>\
             <url><loc>{}</loc><lastmod>2026-12-01</lastmod></url></urlset>",
            site.url("/docs/a.html"),
            site.url("/docs/b.html"),
            site.url("/docs/private/secret.html"),
            site.url("/docs/missing.html"),
        )
    };
    site.put("/docs/sitemap.xml", "application/xml", &map("2026-12-01"));
    let sitemap = site.url("/docs/sitemap.xml");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("map.db");
    let uri = format!("sqlite://{}", db.display());
    let report = dir.path().join("r.json");
    let args = ["--crawl-rps", "1000"];

    let (code, first) = ingest_into(Path::new(&sitemap), &uri, &report, &args);
    assert_eq!(code, Some(0), "{first}");
    assert_eq!(
        (&first["counts"]["indexed"], &first["counts"]["dropped"]),
        (&json!(2), &json!(2)),
        "{first}"
    );
    // The sitemap and the two pages.
    assert_eq!(first["fetched"]["items"], 3, "{first}");

    let (_, same) = ingest_into(Path::new(&sitemap), &uri, &report, &args);
    assert_eq!(same["counts"]["unchanged"], 2, "{same}");
    assert_eq!(same["fetched"]["items"], 1, "only the sitemap: {same}");
    assert_eq!(
        (site.hits("/docs/a.html"), site.hits("/docs/b.html")),
        (1, 1)
    );

    site.put(
        "/docs/b.html",
        "text/html",
        &page("Routing", "Routes, revised.", &[]),
    );
    site.put("/docs/sitemap.xml", "application/xml", &map("2026-12-04"));
    let (_, moved) = ingest_into(Path::new(&sitemap), &uri, &report, &args);
    assert_eq!(
        (&moved["counts"]["unchanged"], &moved["chunks_embedded"]),
        (&json!(1), &json!(1)),
        "{moved}"
    );
    assert_eq!(
        (site.hits("/docs/a.html"), site.hits("/docs/b.html")),
        (1, 2)
    );
    assert!(documents(&db)[1].1.contains("Routes, revised."));
}
