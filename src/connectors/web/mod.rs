//! The web as a source: an `http://` or `https://` URL is a site to crawl (an HTML page), a
//! sitemap (`.../sitemap.xml`, or any `.xml` URL whose body is a `<urlset>` or
//! `<sitemapindex>`), or a feed (anything else the feed parser reads: see `feed/`).
//!
//! **Crawl.** From the start page, links are followed breadth-first within the start URL's
//! prefix (same scheme, host and port, the path under the start's folder), to `--crawl-depth`
//! links from the start and at most `--crawl-max-pages` pages. robots.txt is obeyed (Google's
//! matcher, user agent `ragline`; its `Crawl-delay` slows the crawl further; a robots.txt that
//! cannot be read for a server error stops the crawl, as RFC 9309 says). Requests to the host
//! are spaced by `--crawl-rps`. A page's id is its canonical URL (`<link rel="canonical">`
//! within the prefix), else the URL it was read from after redirects (same host only); a page
//! reached twice under two URLs is indexed once. A 404 or 410 is dropped as gone (and
//! `--prune` removes what the index held of it), other errors fail the page, a redirect out of
//! the prefix drops it, each with its URL and the reason.
//!
//! **Incremental.** A sitemap's `<lastmod>` is the page's version: a page whose date the index
//! holds is not downloaded. A crawl keeps each page's links in the crawl's scope in its
//! metadata (`links`, up to 1,000), so a re-crawl asks for a page the index holds with a
//! conditional GET (`If-None-Match` with the stored ETag, `If-Modified-Since` with the stored
//! Last-Modified): a 304 is the page unchanged, no body sent, and its stored links are followed
//! as if it had been read. The crawl therefore reaches what a full one would (a changed page's
//! new links, pages that failed last time, a page gone dropped and, with `--prune`, removed)
//! while downloading only what changed.

pub mod links;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use url::Url;

use self::links::{normalize, page_links, sitemap, MAX_SITEMAP_BYTES};
use super::feed::FeedConnector;
use super::filesystem::{document_of, Unusable};
use super::{known_unchanged, version_key, Connector, ConnectorError, KnownIndex};
use crate::document::Document;
use crate::http::fetch::{Addresses, FetchError, Fetched, Fetcher, Get, Page, Validators};
use crate::http::robots::Robots;
use crate::lifecycle::KnownPage;
use crate::publisher::Publisher;

/// A crawl keeps at most this many requests to its site in flight (fewer with a lower
/// `--fetch-concurrency`): a polite crawler's share of a server. Measured against Python's
/// http.server, whose listen backlog is 5: 16 in flight lost connections to SYN retries (146 s
/// for 2,000 pages), 4 took 3.2 s, 1 took 3.3 s.
const CRAWL_IN_FLIGHT: usize = 4;
/// A crawled page keeps at most this many links in its metadata (more: no conditional GET).
const MAX_KEPT_LINKS: usize = 1000;
/// A sitemap index names at most this many sitemaps that are read.
const MAX_SITEMAPS: usize = 1000;

/// Is `s` a URL this connector reads?
pub fn is_web_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://")
}

/// How a web source is read.
#[derive(Clone, Debug)]
pub struct WebSettings {
    /// Feeds: index the pages entries link to.
    pub follow_links: bool,
    pub max_bytes: u64,
    /// Pages fetched at once (feeds with --follow-links, crawls).
    pub concurrency: usize,
    /// Links followed from the start page (0: the start page only).
    pub crawl_depth: u32,
    pub crawl_max_pages: usize,
    /// Requests per second to the host.
    pub crawl_rps: f64,
    /// How long one GET may take.
    pub timeout: Duration,
    /// Connect to private, loopback and link-local addresses even when the source's URL does
    /// not name one (`--allow-private-addresses`).
    pub allow_private: bool,
}

pub struct WebConnector {
    url: String,
    /// The URL as ids, metadata and reports show it: its secret-looking query parameters
    /// (`token=`, `key=`, `sig=`, `X-Amz-*`...) as `***`.
    shown: String,
    settings: WebSettings,
    known: Option<KnownIndex>,
}

/// Spaces the requests to a host: each request has a start slot `interval` after the last.
struct Pace {
    interval: Duration,
    next: tokio::time::Instant,
}

impl Pace {
    /// The next request's start time.
    fn slot(&mut self) -> tokio::time::Instant {
        let slot = self.next.max(tokio::time::Instant::now());
        self.next = slot + self.interval;
        slot
    }

    /// Wait for the next slot.
    async fn wait(&mut self) {
        let slot = self.slot();
        Self::sleep_until(slot).await;
    }

    /// Sleep until `slot`, unless it is under a millisecond away (the timer's resolution: a
    /// fast pace would otherwise wait a millisecond per request).
    async fn sleep_until(slot: tokio::time::Instant) {
        if slot.saturating_duration_since(tokio::time::Instant::now()) >= Duration::from_millis(1) {
            tokio::time::sleep_until(slot).await;
        }
    }
}

/// Where a crawl stands.
struct CrawlState {
    scope: Scope,
    /// URLs queued or read.
    seen: HashSet<Url>,
    /// Document ids published.
    ids: HashSet<String>,
    /// URLs to read, with their depth.
    queue: VecDeque<(Url, u32)>,
    /// The pages the index holds from this crawl, by the URL they were read from.
    known: HashMap<Url, KnownPage>,
}

fn looks_like_html(page: &Page) -> bool {
    let media = page
        .content_type
        .as_deref()
        .unwrap_or("")
        .to_ascii_lowercase();
    if media.contains("html") {
        return true;
    }
    if !media.is_empty() {
        return false;
    }
    let head = String::from_utf8_lossy(&page.body[..page.body.len().min(512)]).to_ascii_lowercase();
    head.trim_start().starts_with("<!doctype html") || head.contains("<html")
}

fn looks_like_sitemap(page: &Page) -> bool {
    let head = String::from_utf8_lossy(&page.body[..page.body.len().min(2048)]);
    head.contains("<urlset") || head.contains("<sitemapindex")
}

impl WebConnector {
    pub fn new(url: &str, settings: WebSettings) -> Result<Self, ConnectorError> {
        let parsed = Url::parse(url).map_err(|e| {
            ConnectorError::Config(format!(
                "{}: not a URL ({e})",
                crate::secret::redact_url(url)
            ))
        })?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(ConnectorError::Config(format!(
                "{}: a web source does not take credentials in its URL",
                crate::secret::redact_url(url)
            )));
        }
        if !(settings.crawl_rps >= 0.001 && settings.crawl_rps.is_finite()) {
            return Err(ConnectorError::Config(
                "--crawl-rps must be a number of requests per second, at least 0.001".into(),
            ));
        }
        Ok(WebConnector {
            url: url.to_string(),
            shown: shown_url(url),
            settings,
            known: None,
        })
    }

    /// Read the source; `known`: the pages earlier crawls from here read, as the index holds
    /// them. The site's robots.txt is read first: the start URL too must be allowed.
    async fn publish_all(
        &self,
        publisher: &Publisher,
        known: HashMap<Url, KnownPage>,
    ) -> Result<(), ConnectorError> {
        let s = &self.settings;
        let addresses = Addresses::for_source(&self.url, s.allow_private);
        let fetcher = Arc::new(
            Fetcher::new(s.max_bytes, s.timeout, addresses)
                .map_err(|e| ConnectorError::Source(format!("cannot start HTTP: {e}")))?,
        );
        let start_url = Url::parse(&self.url)
            .map_err(|e| ConnectorError::Config(format!("{}: {e}", self.shown)))?;
        let robots = self.robots(&start_url, &fetcher).await?;
        if !robots.allows(&start_url) {
            return Err(ConnectorError::Source(format!(
                "robots.txt of {} disallows {}: nothing to read",
                start_url.origin().ascii_serialization(),
                self.shown
            )));
        }
        // The start, when a crawl from here read it before, is asked for conditionally (a
        // 304: the start page of a crawl, unchanged).
        let start_known = known_page(&known, &normalize(start_url.clone()))
            .filter(|p| p.links.is_some())
            .map(validators);
        let how = Get {
            known: start_known.as_ref(),
            robots: Some(&robots),
            max_bytes: None,
        };
        let start = fetcher
            .fetch(&self.url, how)
            .await
            .map_err(|e| ConnectorError::Source(format!("the start of the source: {e}")))?;
        let start = match start {
            Fetched::NotModified => {
                return self.crawl(None, known, &robots, &fetcher, publisher).await
            }
            Fetched::Page(page) => page,
        };
        publisher.fetched(start.body.len() as u64);
        if looks_like_html(&start) {
            return self
                .crawl(Some(start), known, &robots, &fetcher, publisher)
                .await;
        }
        if looks_like_sitemap(&start) {
            return self.sitemap(start, &robots, &fetcher, publisher).await;
        }
        FeedConnector::new(
            &self.shown,
            s.follow_links,
            s.concurrency,
            self.known.clone(),
        )
        .publish_feed(start, &robots, &fetcher, publisher)
        .await
    }

    /// The robots.txt of `url`'s site (empty: everything allowed). A robots.txt that cannot
    /// be read for a server error stops the source, as RFC 9309 says.
    async fn robots(&self, url: &Url, fetcher: &Fetcher) -> Result<Robots, ConnectorError> {
        let Ok(at) = url.join("/robots.txt") else {
            return Ok(Robots::default());
        };
        match fetcher.get(at.as_str()).await {
            Ok(page) => Ok(Robots::parse(&page.body)),
            // No robots.txt (4xx): no rules.
            Err(FetchError::Status { status, .. }) if (400..500).contains(&status) => {
                Ok(Robots::default())
            }
            Err(e) => Err(ConnectorError::Source(format!(
                "robots.txt cannot be read ({e}); RFC 9309 has a crawler take that as \"crawl \
                 nothing\": try again when the site answers"
            ))),
        }
    }

    fn pace(&self, robots: &Robots) -> Pace {
        let interval = Duration::from_secs_f64(1.0 / self.settings.crawl_rps)
            .max(robots.delay.unwrap_or_default());
        Pace {
            interval,
            next: tokio::time::Instant::now() + interval,
        }
    }

    /// Crawl from the start page (`None`: unchanged since the index read it), with the pages
    /// the index holds from earlier crawls.
    async fn crawl(
        &self,
        start: Option<Page>,
        known: HashMap<Url, KnownPage>,
        robots: &Robots,
        fetcher: &Fetcher,
        publisher: &Publisher,
    ) -> Result<(), ConnectorError> {
        let s = &self.settings;
        let start_url = Url::parse(&self.url)
            .map_err(|e| ConnectorError::Config(format!("{}: {e}", self.shown)))?;
        let mut pace = self.pace(robots);
        let start_url = normalize(start_url);
        let mut crawl = CrawlState {
            scope: Scope::of(&start_url),
            seen: HashSet::from([start_url.clone()]),
            ids: HashSet::new(),
            queue: VecDeque::new(),
            known,
        };
        match start {
            Some(page) => self.take_page(&mut crawl, start_url.clone(), 0, page, publisher)?,
            None => self.unchanged(&mut crawl, &start_url, 0, publisher)?,
        }
        let mut pages = 1usize;
        let in_flight = s.concurrency.clamp(1, CRAWL_IN_FLIGHT);
        while pages < s.crawl_max_pages && !crawl.queue.is_empty() {
            // A wave of up to `in_flight` requests, each started at its paced slot;
            // what robots.txt disallows is reported without a request.
            let mut wave = Vec::new();
            while wave.len() < in_flight && pages + wave.len() < s.crawl_max_pages {
                let Some((url, depth)) = crawl.queue.pop_front() else {
                    break;
                };
                if robots.allows(&url) {
                    wave.push((url, depth, pace.slot()));
                } else {
                    publisher.publish_dropped(
                        &shown_url(url.as_str()),
                        Some(&self.shown),
                        "read",
                        "robots.txt disallows it for ragline; not read",
                    );
                }
            }
            pages += wave.len();
            let known = &crawl.known;
            let got: Vec<_> = futures::stream::iter(wave.iter().map(|(url, _, slot)| async move {
                Pace::sleep_until(*slot).await;
                let held = known_page(known, url)
                    .filter(|p| p.links.is_some())
                    .map(validators);
                let how = Get {
                    known: held.as_ref(),
                    robots: Some(robots),
                    max_bytes: None,
                };
                fetcher.fetch(url.as_str(), how).await
            }))
            .buffered(in_flight)
            .collect()
            .await;
            for ((url, depth, _), page) in wave.into_iter().zip(got) {
                match page {
                    Ok(Fetched::Page(page)) => {
                        publisher.fetched(page.body.len() as u64);
                        self.take_page(&mut crawl, url, depth, page, publisher)?;
                    }
                    Ok(Fetched::NotModified) => {
                        self.unchanged(&mut crawl, &url, depth, publisher)?
                    }
                    Err(e) => self.unusable(publisher, url.as_str(), e),
                }
            }
        }
        Ok(())
    }

    /// A page the server says is unchanged (304) since the index read it, asked for by `url`
    /// `depth` links from the start: its stored links followed, and published as unchanged
    /// under the id the index holds it by.
    fn unchanged(
        &self,
        crawl: &mut CrawlState,
        url: &Url,
        depth: u32,
        publisher: &Publisher,
    ) -> Result<(), ConnectorError> {
        let Some(page) = known_page(&crawl.known, url) else {
            return Ok(());
        };
        let (id, links) = (page.id.clone(), page.links.clone().unwrap_or_default());
        let links: Vec<Url> = links.iter().filter_map(|l| Url::parse(l).ok()).collect();
        self.follow(crawl, &links, depth);
        let version = self.known.as_ref().and_then(|k| k.version_of(&id));
        if let Some(version) = version {
            if crawl.ids.insert(id.clone()) {
                publisher.publish(known_unchanged(id, self.shown.clone(), version.to_string()))?;
            }
        }
        Ok(())
    }

    /// Queue the links of a page `depth` links from the start (those in the crawl's scope not
    /// queued before), unless it is as deep as the crawl goes.
    fn follow(&self, crawl: &mut CrawlState, links: &[Url], depth: u32) {
        if depth >= self.settings.crawl_depth {
            return;
        }
        for link in links {
            // What a crawl remembers is bounded by what it may read, not by what pages link
            // to (a page of a million links).
            if crawl.seen.len() >= self.settings.crawl_max_pages.saturating_mul(4) {
                break;
            }
            if crawl.scope.holds(link) && crawl.seen.insert(link.clone()) {
                crawl.queue.push_back((link.clone(), depth + 1));
            }
        }
    }

    /// A page the crawl read from `url`, `depth` links from the start: its links queued, its
    /// document published (once per canonical URL).
    fn take_page(
        &self,
        crawl: &mut CrawlState,
        url: Url,
        depth: u32,
        page: Page,
        publisher: &Publisher,
    ) -> Result<(), ConnectorError> {
        let read_from = Url::parse(&page.url).map(normalize).unwrap_or(url.clone());
        if !crawl.scope.holds(&read_from) {
            publisher.publish_dropped(
                &shown_url(url.as_str()),
                Some(&self.shown),
                "read",
                &format!(
                    "redirected to {}, outside the crawl's prefix {}; not read",
                    shown_url(read_from.as_str()),
                    shown_url(&crawl.scope.prefix)
                ),
            );
            return Ok(());
        }
        let found = looks_like_html(&page)
            .then(|| page_links(&String::from_utf8_lossy(&page.body), &read_from));
        let id = found
            .as_ref()
            .and_then(|f| f.canonical.clone())
            .filter(|c| crawl.scope.holds(c))
            .unwrap_or_else(|| read_from.clone());
        let id = shown_url(id.as_str());
        if let Some(f) = &found {
            self.follow(crawl, &f.links, depth);
        }
        if !crawl.ids.insert(id.clone()) {
            // The same page under another URL (its canonical one was indexed).
            return Ok(());
        }
        match page_document(&id, &page) {
            Ok(mut doc) => {
                let m = &mut doc.fields.metadata;
                m.insert("depth".into(), depth.into());
                // The links a re-crawl follows when the page answers 304 (a page with more
                // is always read whole).
                let mut kept: Vec<&str> = found
                    .iter()
                    .flat_map(|f| f.links.iter())
                    .filter(|l| crawl.scope.holds(l))
                    .map(Url::as_str)
                    .collect();
                kept.sort_unstable();
                kept.dedup();
                // A link that carries a secret is not stored: such a page is read whole
                // every time instead of asked for conditionally.
                let secret = kept.iter().any(|l| shown_url(l) != *l);
                if kept.len() <= MAX_KEPT_LINKS && !secret {
                    m.insert("links".into(), kept.into());
                }
                if read_from != url {
                    m.insert("redirected_from".into(), shown_url(url.as_str()).into());
                }
                doc.fields.source = Some(self.shown.clone());
                publisher.publish(doc)?;
            }
            Err(why) => why.publish(publisher, &id, Some(&self.shown), "read"),
        }
        Ok(())
    }

    /// The pages a sitemap (or a sitemap index's sitemaps) lists, on the sitemap's origin, at
    /// most `--crawl-max-pages`, each read unless robots.txt disallows it or the index holds
    /// its `<lastmod>`.
    async fn sitemap(
        &self,
        first: Page,
        robots: &Robots,
        fetcher: &Fetcher,
        publisher: &Publisher,
    ) -> Result<(), ConnectorError> {
        let mut pace = self.pace(robots);
        let entries = self
            .sitemap_pages(first, robots, fetcher, publisher, &mut pace)
            .await?;
        for entry in entries {
            let (url, lastmod) = match entry {
                Listed::Page(url, lastmod) => (url, lastmod),
                Listed::NotUrl(loc) => {
                    publisher.publish_failed(
                        &shown_url(&loc),
                        Some(&self.shown),
                        "read",
                        "not a URL",
                    );
                    continue;
                }
            };
            let id = shown_url(url.as_str());
            if !robots.allows(&url) {
                publisher.publish_dropped(
                    &id,
                    Some(&self.shown),
                    "read",
                    "robots.txt disallows it for ragline; not read",
                );
                continue;
            }
            let key = lastmod.map(|m| version_key(&["sitemap-page", &id, &m]));
            if let (Some(key), Some(known)) = (&key, &self.known) {
                if known.holds(&id, key) {
                    publisher.publish(known_unchanged(id, self.shown.clone(), key.clone()))?;
                    continue;
                }
            }
            pace.wait().await;
            let how = Get {
                known: None,
                robots: Some(robots),
                max_bytes: None,
            };
            let page = match fetcher.get_with(url.as_str(), how).await {
                Ok(page) => page,
                Err(e) => {
                    self.unusable(publisher, &id, e);
                    continue;
                }
            };
            publisher.fetched(page.body.len() as u64);
            match page_document(&id, &page) {
                Ok(mut doc) => {
                    doc.content_hash = key;
                    doc.fields.source = Some(self.shown.clone());
                    publisher.publish(doc)?;
                }
                Err(why) => why.publish(publisher, &id, Some(&self.shown), "read"),
            }
        }
        Ok(())
    }

    /// The pages to read from the sitemap `first`: a sitemap index's sitemaps are read (each
    /// within the protocol's 50 MB and 50,000 URLs, each allowed by robots.txt) only until
    /// `--crawl-max-pages` pages are known.
    async fn sitemap_pages(
        &self,
        first: Page,
        robots: &Robots,
        fetcher: &Fetcher,
        publisher: &Publisher,
        pace: &mut Pace,
    ) -> Result<Vec<Listed>, ConnectorError> {
        let map_url = Url::parse(&first.url)
            .map_err(|e| ConnectorError::Config(format!("{}: {e}", self.shown)))?;
        let map = sitemap(&String::from_utf8_lossy(
            &first.body[..first.body.len().min(MAX_SITEMAP_BYTES)],
        ));
        drop(first);
        let mut listing = Listing::new(map_url.origin(), self.settings.crawl_max_pages);
        if !map.index {
            listing.take(map.entries);
            return Ok(listing.entries);
        }
        for (loc, _) in map.entries.into_iter().take(MAX_SITEMAPS) {
            if listing.is_full() {
                break;
            }
            let Some(child) = Url::parse(&loc)
                .ok()
                .filter(|u| u.origin() == listing.origin)
            else {
                continue;
            };
            if !robots.allows(&child) {
                tracing::info!(
                    "{}: robots.txt disallows the sitemap {}; not read",
                    self.shown,
                    shown_url(child.as_str())
                );
                continue;
            }
            pace.wait().await;
            let how = Get {
                known: None,
                robots: Some(robots),
                max_bytes: Some(MAX_SITEMAP_BYTES),
            };
            let page = fetcher
                .get_with(child.as_str(), how)
                .await
                .map_err(|e| ConnectorError::Source(format!("a sitemap of the index: {e}")))?;
            publisher.fetched(page.body.len() as u64);
            listing.take(sitemap(&String::from_utf8_lossy(&page.body)).entries);
        }
        Ok(listing.entries)
    }

    /// A page that could not be read: gone (404, 410), or failed.
    fn unusable(&self, publisher: &Publisher, id: &str, e: FetchError) {
        let id = &shown_url(id);
        match e {
            FetchError::Status {
                status: 404 | 410, ..
            } => publisher.publish_gone(
                id,
                Some(&self.shown),
                "read",
                &format!("gone: {e} (a broken link, or a page removed)"),
            ),
            FetchError::OtherHost { .. } | FetchError::Disallowed { .. } => {
                publisher.publish_dropped(id, Some(&self.shown), "read", &e.to_string())
            }
            e => publisher.publish_failed(id, Some(&self.shown), "read", &e.to_string()),
        }
    }
}

/// The pages the index holds, by each URL a crawl may ask for them by: the one they were read
/// from, their id (the canonical URL), and the URL a redirect to them came from.
fn known_by_url(pages: Vec<KnownPage>) -> HashMap<Url, KnownPage> {
    let mut out = HashMap::new();
    for page in pages {
        let urls = [
            Some(&page.url),
            Some(&page.id),
            page.redirected_from.as_ref(),
        ];
        let urls: Vec<Url> = urls
            .into_iter()
            .flatten()
            .filter_map(|u| Url::parse(u).ok().map(normalize))
            .collect();
        for url in urls {
            out.entry(url).or_insert_with(|| page.clone());
        }
    }
    out
}

/// The page the index holds under `url` (the map's keys are URLs as the index shows them,
/// secrets redacted).
fn known_page<'a>(known: &'a HashMap<Url, KnownPage>, url: &Url) -> Option<&'a KnownPage> {
    known.get(url).or_else(|| {
        let shown = shown_url(url.as_str());
        (shown != url.as_str())
            .then(|| Url::parse(&shown).ok())
            .flatten()
            .and_then(|u| known.get(&normalize(u)))
    })
}

/// `url` as an id, metadata or a report may show it: the values of its secret-looking query
/// parameters (`token`, `key`, `sig`, `signature`, `password`, `access_token`, `X-Amz-*`...)
/// replaced by `***`, and any password in it.
pub fn shown_url(url: &str) -> String {
    crate::secret::redact_url(url)
}

/// What a conditional GET of a page the index holds sends.
fn validators(page: &KnownPage) -> Validators<'_> {
    Validators {
        etag: page.etag.as_deref(),
        last_modified: page.last_modified.as_deref(),
    }
}

/// The document of a downloaded page, with its URL, validators and content type as metadata.
pub(crate) fn page_document(id: &str, page: &Page) -> Result<Document, Unusable> {
    let mut doc = document_of(id.to_string(), page.body.clone(), page.format())?;
    let m = &mut doc.fields.metadata;
    m.insert("url".into(), shown_url(&page.url).into());
    for (key, value) in [
        ("etag", &page.etag),
        ("last_modified", &page.last_modified),
        ("content_type", &page.content_type),
    ] {
        if let Some(v) = value {
            m.insert(key.into(), v.clone().into());
        }
    }
    Ok(doc)
}

/// A sitemap entry to read: its URL and `<lastmod>`, or a `<loc>` that is not a URL.
enum Listed {
    Page(Url, Option<String>),
    NotUrl(String),
}

/// The pages sitemaps list, in the order listed: distinct URLs on one origin, at most `max`.
struct Listing {
    origin: url::Origin,
    max: usize,
    seen: HashSet<Url>,
    entries: Vec<Listed>,
}

impl Listing {
    fn new(origin: url::Origin, max: usize) -> Listing {
        Listing {
            origin,
            max,
            seen: HashSet::new(),
            entries: Vec::new(),
        }
    }

    fn is_full(&self) -> bool {
        self.entries.len() >= self.max
    }

    /// Take a sitemap's `(loc, lastmod)` entries until full.
    fn take(&mut self, list: Vec<(String, Option<String>)>) {
        for (loc, lastmod) in list {
            if self.is_full() {
                break;
            }
            match Url::parse(&loc).ok().map(normalize) {
                Some(url) if url.origin() != self.origin => {}
                Some(url) => {
                    if self.seen.insert(url.clone()) {
                        self.entries.push(Listed::Page(url, lastmod));
                    }
                }
                None => self.entries.push(Listed::NotUrl(loc)),
            }
        }
    }
}

/// What a crawl may read: the start URL's scheme, host and port, under its folder.
struct Scope {
    origin: url::Origin,
    prefix: String,
}

impl Scope {
    fn of(start: &Url) -> Scope {
        let path = start.path();
        let folder = &path[..path.rfind('/').map_or(0, |i| i + 1)];
        Scope {
            origin: start.origin(),
            prefix: format!("{}{folder}", start.origin().ascii_serialization()),
        }
    }

    fn holds(&self, url: &Url) -> bool {
        url.origin() == self.origin && url.as_str().starts_with(&self.prefix)
    }
}

impl Connector for WebConnector {
    fn name(&self) -> &'static str {
        "web"
    }

    fn know(&mut self, index: &KnownIndex) {
        self.known = Some(index.clone());
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        publisher.count_fetches();
        // Asked of the index before any I/O runtime starts (its client may block on its own).
        let known = known_by_url(
            self.known
                .as_ref()
                .map(|k| k.pages(&self.shown))
                .unwrap_or_default(),
        );
        super::block_on_io("ragline-web", self.publish_all(publisher, known))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crawl_stays_under_the_start_folder_of_its_origin() {
        let s = Scope::of(&Url::parse("https://site.example/docs/intro.html").unwrap());
        let holds = |u: &str| s.holds(&Url::parse(u).unwrap());
        assert!(holds("https://site.example/docs/a/b.html"));
        assert!(holds("https://site.example/docs/"));
        assert!(!holds("https://site.example/blog/x.html"));
        assert!(!holds("http://site.example/docs/a.html"));
        assert!(!holds("https://site.example:8443/docs/a.html"));
        assert!(!holds("https://evil.example/docs/a.html"));
    }
}
