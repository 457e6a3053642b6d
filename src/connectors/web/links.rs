//! What a crawl needs of a page or a sitemap, read with html5ever's tokenizer (streaming, no
//! tree: nothing in a hostile page can make it recurse): the page's links (`<a href>`), its
//! canonical URL (`<link rel="canonical">`) and base (`<base href>`); a sitemap's `<loc>` and
//! `<lastmod>`.

use std::cell::RefCell;

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::{
    BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};
use url::Url;

/// A page's links, resolved against its URL (or its `<base>`), fragments removed.
#[derive(Debug, Default, PartialEq)]
pub struct PageLinks {
    pub links: Vec<Url>,
    pub canonical: Option<Url>,
}

/// A URL as a crawl compares it: no fragment.
pub fn normalize(mut url: Url) -> Url {
    url.set_fragment(None);
    url
}

#[derive(Default)]
struct Raw {
    hrefs: Vec<String>,
    canonical: Option<String>,
    base: Option<String>,
}

struct LinkSink(RefCell<Raw>);

impl TokenSink for LinkSink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        if let Token::TagToken(tag) = token {
            if tag.kind != TagKind::StartTag {
                return TokenSinkResult::Continue;
            }
            let attr = |name: &str| {
                tag.attrs
                    .iter()
                    .find(|a| &*a.name.local == name)
                    .map(|a| a.value.to_string())
            };
            let mut raw = self.0.borrow_mut();
            match &*tag.name {
                "a" | "area" => {
                    if let Some(h) = attr("href") {
                        raw.hrefs.push(h);
                    }
                }
                "link" => {
                    let canonical = attr("rel").is_some_and(|r| {
                        r.split_ascii_whitespace()
                            .any(|t| t.eq_ignore_ascii_case("canonical"))
                    });
                    if canonical && raw.canonical.is_none() {
                        raw.canonical = attr("href");
                    }
                }
                "base" if raw.base.is_none() => raw.base = attr("href"),
                _ => {}
            }
        }
        TokenSinkResult::Continue
    }
}

/// The links of the HTML page `html` read from `url`.
pub fn page_links(html: &str, url: &Url) -> PageLinks {
    let tokenizer = Tokenizer::new(LinkSink(RefCell::default()), TokenizerOpts::default());
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(html));
    let _ = tokenizer.feed(&input);
    tokenizer.end();
    let raw = tokenizer.sink.0.into_inner();
    let base = raw
        .base
        .and_then(|b| url.join(&b).ok())
        .unwrap_or_else(|| url.clone());
    let resolve = |h: &str| {
        base.join(h.trim())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .map(normalize)
    };
    PageLinks {
        links: raw.hrefs.iter().filter_map(|h| resolve(h)).collect(),
        canonical: raw.canonical.as_deref().and_then(resolve),
    }
}

/// URLs one sitemap may list (the sitemaps.org protocol's limit): more are not read.
pub const MAX_SITEMAP_URLS: usize = 50_000;
/// Bytes of one sitemap, uncompressed, at most (the protocol's limit).
pub const MAX_SITEMAP_BYTES: usize = 50 << 20;

/// A sitemap's entries: (`<loc>`, `<lastmod>`), at most [`MAX_SITEMAP_URLS`], and whether it
/// is a sitemap index (its locs are other sitemaps).
#[derive(Debug, Default, PartialEq)]
pub struct Sitemap {
    pub entries: Vec<(String, Option<String>)>,
    pub index: bool,
}

#[derive(Default)]
struct MapState {
    map: Sitemap,
    /// The element whose text is being read (`loc`, `lastmod`).
    inside: Option<String>,
    text: String,
    loc: Option<String>,
    lastmod: Option<String>,
}

struct MapSink(RefCell<MapState>);

impl TokenSink for MapSink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut s = self.0.borrow_mut();
        match token {
            Token::TagToken(tag) => {
                // `<xhtml:link>` and other prefixed names: the local part.
                let name = tag
                    .name
                    .rsplit(':')
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase();
                match (tag.kind, name.as_str()) {
                    (TagKind::StartTag, "sitemapindex") => s.map.index = true,
                    (TagKind::StartTag, "loc" | "lastmod") => {
                        s.inside = Some(name);
                        s.text.clear();
                    }
                    (TagKind::EndTag, "loc" | "lastmod") => {
                        let text = s.text.trim().to_string();
                        if name == "loc" {
                            s.loc = Some(text);
                        } else {
                            s.lastmod = Some(text);
                        }
                        s.inside = None;
                    }
                    (TagKind::EndTag, "url" | "sitemap") => {
                        if let Some(loc) = s.loc.take().filter(|l| !l.is_empty()) {
                            let lastmod = s.lastmod.take();
                            if s.map.entries.len() < MAX_SITEMAP_URLS {
                                s.map.entries.push((loc, lastmod));
                            }
                        }
                        s.lastmod = None;
                    }
                    _ => {}
                }
            }
            Token::CharacterTokens(t) if s.inside.is_some() => s.text.push_str(&t),
            _ => {}
        }
        TokenSinkResult::Continue
    }
}

/// The entries of the sitemap (or sitemap index) `xml`.
pub fn sitemap(xml: &str) -> Sitemap {
    let tokenizer = Tokenizer::new(MapSink(RefCell::default()), TokenizerOpts::default());
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(xml));
    let _ = tokenizer.feed(&input);
    tokenizer.end();
    tokenizer.sink.0.into_inner().map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_against_the_page_or_its_base_without_fragments() {
        let url = Url::parse("https://site.example/docs/guide/intro.html").unwrap();
        let html = r#"<html><head><link rel="Canonical" href="/docs/guide/intro"></head>
            <body><a href="next.html#part">next</a> <a href="../api/">api</a>
            <a href="mailto:x@y">mail</a><a href="https://other.example/">out</a>
            <A HREF="  spaced.html ">s</A></body></html>"#;
        let l = page_links(html, &url);
        let links: Vec<&str> = l.links.iter().map(Url::as_str).collect();
        assert_eq!(
            links,
            [
                "https://site.example/docs/guide/next.html",
                "https://site.example/docs/api/",
                "https://other.example/",
                "https://site.example/docs/guide/spaced.html",
            ]
        );
        assert_eq!(
            l.canonical.unwrap().as_str(),
            "https://site.example/docs/guide/intro"
        );
        let based = page_links(r#"<base href="/v2/"><a href="a.html">a</a>"#, &url);
        assert_eq!(based.links[0].as_str(), "https://site.example/v2/a.html");
    }

    #[test]
    fn sitemaps_and_sitemap_indexes_give_their_locations_and_dates() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
            <urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
              <url><loc> https://s.example/a.html </loc><lastmod>2026-12-01</lastmod></url>
              <url><loc>https://s.example/b.html</loc></url>
              <url><lastmod>2026-12-02</lastmod></url>
            </urlset>"#;
        let m = sitemap(xml);
        assert!(!m.index);
        assert_eq!(
            m.entries,
            [
                ("https://s.example/a.html".into(), Some("2026-12-01".into())),
                ("https://s.example/b.html".into(), None)
            ]
        );
        let index = sitemap(
            "<sitemapindex><sitemap><loc>https://s.example/s1.xml</loc></sitemap></sitemapindex>",
        );
        assert!(index.index);
        assert_eq!(index.entries.len(), 1);
        // Past the protocol's limit, entries are not kept.
        let big = format!(
            "<urlset>{}</urlset>",
            "<url><loc>https://s.example/x</loc></url>".repeat(MAX_SITEMAP_URLS + 10)
        );
        assert_eq!(sitemap(&big).entries.len(), MAX_SITEMAP_URLS);
    }
}
