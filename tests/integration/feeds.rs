//! Feeds as a source, served over HTTP by a local server (`site.rs`): entries as documents
//! from the feed's content, and with `--follow-links` from the pages they link to. A first run
//! indexes every good entry; a second with nothing changed downloads (besides the feed) and
//! embeds nothing; one entry changed, one added, one gone: exactly those are fetched,
//! re-embedded, added and (with `--prune`) removed. An entry without an id or a link, and a
//! page that answers 500, fail alone with their ids.

use std::path::Path;

use serde_json::{json, Value};

use crate::index::ingest_into;
use crate::objects::documents;
use crate::site::Site;

/// An RSS 2.0 feed of `items` (guid, link path, date, description; empty strings leave the
/// element out), links made absolute on `site`.
fn rss(site: &Site, items: &[(&str, &str, &str, &str)]) -> String {
    let mut out = String::from(
        "<?xml version=\"1.0\"?><rss version=\"2.0\"><channel><title>React notes</title>\
         <link>https://example.invalid/</link><description>notes</description>",
    );
    for (guid, link, date, description) in items {
        out.push_str("<item><title>");
        out.push_str(if guid.is_empty() { "untitled" } else { guid });
        out.push_str("</title>");
        if !guid.is_empty() {
            out.push_str(&format!("<guid isPermaLink=\"false\">{guid}</guid>"));
        }
        if !link.is_empty() {
            out.push_str(&format!("<link>{}</link>", site.url(link)));
        }
        if !date.is_empty() {
            out.push_str(&format!("<pubDate>{date}</pubDate>"));
        }
        if !description.is_empty() {
            out.push_str(&format!("<description>{description}</description>"));
        }
        out.push_str("</item>");
    }
    out.push_str("</channel></rss>");
    out
}

const MON: &str = "Mon, 30 Nov 2026 09:00:00 GMT";
const TUE: &str = "Tue, 01 Dec 2026 09:00:00 GMT";

fn page(title: &str, text: &str) -> String {
    format!("<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>")
}

fn failure<'a>(r: &'a Value, id: &str) -> &'a str {
    crate::web::outcome(r, "failures", id)
}

#[test]
fn a_feed_is_indexed_from_its_entries_then_from_the_pages_they_link_to() {
    let site = Site::start();
    let feed = site.url("/feed.xml");
    let id = |guid: &str| format!("{feed}#{guid}");
    let items = [
        ("post-1", "/posts/1.html", MON, "Hooks let you use state."),
        (
            "post-2",
            "/posts/2.html",
            MON,
            "&lt;p&gt;A router maps URLs to pages.&lt;/p&gt;",
        ),
        (
            "post-3",
            "/posts/3.html",
            MON,
            "Effects synchronise with the outside.",
        ),
        ("", "", MON, "An entry with neither a guid nor a link."),
        ("post-5", "/posts/5.html", MON, ""),
    ];
    site.put("/feed.xml", "application/rss+xml", &rss(&site, &items));
    site.put(
        "/posts/1.html",
        "text/html",
        &page(
            "Hooks",
            "Hooks let function components keep state between renders.",
        ),
    );
    site.put(
        "/posts/2.html",
        "text/html",
        &page(
            "Routing",
            "A router maps each URL to the page that shows it.",
        ),
    );
    site.put(
        "/posts/3.html",
        "text/html",
        &page(
            "Effects",
            "Effects synchronise a component with an outside system.",
        ),
    );
    site.put_status("/posts/5.html", 500, "text/plain", "boom");

    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");

    // From the feed's own content: the entry without an id fails, the one without content
    // drops; one download (the feed).
    let db = dir.path().join("entries.db");
    let uri = format!("sqlite://{}", db.display());
    let (code, first) = ingest_into(Path::new(&feed), &uri, &report, &[]);
    assert_eq!(code, Some(1), "{first}");
    let c = &first["counts"];
    assert_eq!(
        (&c["published"], &c["indexed"], &c["failed"], &c["dropped"]),
        (&json!(5), &json!(3), &json!(1), &json!(1)),
        "{first}"
    );
    assert_eq!(first["fetched"]["items"], 1, "{first}");
    assert!(failure(&first, &format!("{feed}#entry-4"))
        .contains("no id (Atom id, RSS guid) and no link"));
    assert_eq!(first["dropped"][0]["id"], id("post-5"));
    let docs = documents(&db);
    assert_eq!(docs.len(), 3);
    assert!(docs[1].1.contains("A router maps URLs to pages.") && !docs[1].1.contains("<p>"));
    let (_, again) = ingest_into(Path::new(&feed), &uri, &report, &[]);
    assert_eq!(
        (&again["counts"]["unchanged"], &again["chunks_embedded"]),
        (&json!(3), &json!(0)),
        "{again}"
    );

    // With --follow-links: the pages, into another index; the page that answers 500 fails.
    let db = dir.path().join("pages.db");
    let uri = format!("sqlite://{}", db.display());
    let (code, pages) = ingest_into(Path::new(&feed), &uri, &report, &["--follow-links"]);
    assert_eq!(code, Some(1), "{pages}");
    let c = &pages["counts"];
    assert_eq!(
        (&c["indexed"], &c["failed"], &pages["chunks_embedded"]),
        (&json!(3), &json!(2), &json!(3)),
        "{pages}"
    );
    assert!(failure(&pages, &id("post-5")).contains("HTTP 500"));
    assert!(documents(&db)[0].1.contains("keep state between renders"));
    assert_eq!(site.hits("/posts/1.html"), 1);

    // Nothing changed: the feed is read, no page is (the index holds each entry's date).
    let (_, same) = ingest_into(Path::new(&feed), &uri, &report, &["--follow-links"]);
    assert_eq!(same["counts"]["unchanged"], 3, "{same}");
    assert_eq!(same["chunks_embedded"], 0);
    assert_eq!(site.hits("/posts/1.html"), 1);
    assert_eq!(site.hits("/posts/2.html"), 1);
    // Only the feed was downloaded; the page that failed was asked for again (it is not in
    // the index) and failed again.
    assert_eq!(same["fetched"]["items"], 1, "{same}");
    assert_eq!(site.hits("/posts/5.html"), 2);

    // post-1 updated, post-6 added, post-3 gone from the feed.
    let items = [
        ("post-1", "/posts/1.html", TUE, "Hooks, revised."),
        (
            "post-2",
            "/posts/2.html",
            MON,
            "&lt;p&gt;A router maps URLs to pages.&lt;/p&gt;",
        ),
        ("post-6", "/posts/6.html", TUE, "Context."),
    ];
    site.put("/feed.xml", "application/rss+xml", &rss(&site, &items));
    site.put(
        "/posts/1.html",
        "text/html",
        &page("Hooks", "Hooks let components remember values."),
    );
    site.put(
        "/posts/6.html",
        "text/html",
        &page("Context", "Context passes data deep down the tree."),
    );
    let (code, third) = ingest_into(
        Path::new(&feed),
        &uri,
        &report,
        &["--follow-links", "--prune"],
    );
    assert_eq!(code, Some(0), "{third}");
    let c = &third["counts"];
    assert_eq!(
        (
            &c["indexed"],
            &c["unchanged"],
            &third["chunks_embedded"],
            &third["pruned"]
        ),
        (&json!(3), &json!(1), &json!(2), &json!(1)),
        "{third}"
    );
    assert_eq!(
        (site.hits("/posts/1.html"), site.hits("/posts/2.html")),
        (2, 1)
    );
    let docs = documents(&db);
    let ids: Vec<&str> = docs.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(ids, [id("post-1"), id("post-2"), id("post-6")]);
    assert!(docs[0].1.contains("remember values"));
}
