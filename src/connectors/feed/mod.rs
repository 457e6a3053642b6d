//! Feeds as a source: `https://site/feed.xml` (RSS 0.9-2.0, Atom, JSON Feed, parsed by
//! `feed-rs`). Each entry is a document: its text is the entry's content (else its summary),
//! or with `--follow-links` the page its link points to (on the feed's own host: a feed does
//! not send the run to other machines). Its id is the entry's id (Atom `id`, RSS `guid`, else
//! its link), made unique to the feed when it is not a URL or URN; the link, the feed, the
//! dates, authors and categories are its metadata.
//!
//! **Incremental.** Without `--follow-links` the entry's text is in the feed, and unchanged
//! entries are told by their content hash. With it, an entry whose id, link and date
//! (`updated`, else `published`) the index holds is published unchanged without fetching its
//! page. A feed is a window: entries that left it are reported missing like deleted files, and
//! `--prune` removes them (usually not what a feed index wants).

use std::sync::Arc;

use feed_rs::model::{Entry, Feed};
use futures::StreamExt;

use super::filesystem::{document_of, Unusable};
use super::{known_unchanged, version_key, ConnectorError, KnownIndex};
use crate::document::Document;
use crate::http::fetch::{FetchError, Fetcher, Get, Page};
use crate::http::robots::Robots;
use crate::publisher::Publisher;

/// Reads one feed (the web connector hands it a page that is not HTML).
pub struct FeedConnector {
    /// The feed's URL as ids and metadata show it (secrets redacted).
    url: String,
    follow_links: bool,
    concurrency: usize,
    known: Option<KnownIndex>,
}

/// What became of one entry.
enum Made {
    Doc(Box<Document>),
    Unchanged { id: String, key: String },
    Failed { id: String, reason: String },
    Dropped { id: String, reason: String },
}

impl FeedConnector {
    pub fn new(
        url: &str,
        follow_links: bool,
        concurrency: usize,
        known: Option<KnownIndex>,
    ) -> Self {
        FeedConnector {
            url: url.to_string(),
            follow_links,
            concurrency: concurrency.max(1),
            known,
        }
    }

    /// Publish the entries of the feed `page` (already downloaded and counted).
    /// With `--follow-links`, an entry's page is read only on the feed's own origin (scheme,
    /// host and port), when the site's `robots` allow it, redirects included.
    pub async fn publish_feed(
        &self,
        page: Page,
        robots: &Robots,
        fetcher: &Arc<Fetcher>,
        publisher: &Publisher,
    ) -> Result<(), ConnectorError> {
        let feed = parse(&page)?;
        let origin = url::Url::parse(&page.url).ok().map(|u| u.origin());
        let site = Site {
            origin: origin.as_ref(),
            robots,
        };
        let made = futures::stream::iter(feed.entries.iter().enumerate())
            .map(|(n, entry)| self.entry(&feed, n, entry, site, fetcher, publisher))
            .buffered(self.concurrency);
        futures::pin_mut!(made);
        while let Some(m) = made.next().await {
            match m {
                Made::Doc(doc) => publisher.publish(*doc)?,
                Made::Unchanged { id, key } => {
                    publisher.publish(known_unchanged(id.clone(), id, key))?
                }
                Made::Failed { id, reason } => {
                    publisher.publish_failed(&id, Some(&self.url), "read", &reason)
                }
                Made::Dropped { id, reason } => {
                    publisher.publish_dropped(&id, Some(&self.url), "read", &reason)
                }
            }
        }
        Ok(())
    }

    /// The document of entry `n` (from 0) of `feed`.
    async fn entry(
        &self,
        feed: &Feed,
        n: usize,
        entry: &Entry,
        site: Site<'_>,
        fetcher: &Arc<Fetcher>,
        publisher: &Publisher,
    ) -> Made {
        let link = entry
            .links
            .iter()
            .find(|l| l.rel.as_deref().is_none_or(|r| r == "alternate"))
            .map(|l| l.href.clone());
        let Some(id) = self.entry_id(&entry.id) else {
            return Made::Failed {
                id: format!("{}#entry-{}", self.url, n + 1),
                reason: format!(
                    "entry {} has no id (Atom id, RSS guid) and no link: it cannot be told apart \
                     from the others across runs; give it a guid",
                    n + 1
                ),
            };
        };
        let (mut doc, content_hash) = if self.follow_links {
            let followed = self
                .followed(&id, link.as_deref(), entry, site, fetcher, publisher)
                .await;
            match followed {
                Ok(found) => found,
                Err(made) => return made,
            }
        } else {
            match feed_document(&id, entry) {
                Some(doc) => (doc, None),
                None => {
                    return Made::Dropped {
                        id,
                        reason: "the entry has no content or summary; --follow-links reads the \
                                 page it links to"
                            .into(),
                    }
                }
            }
        };
        doc.content_hash = content_hash;
        doc.fields.source = Some(self.url.clone());
        if let Some(t) = &entry.title {
            doc.fields.title = Some(t.content.trim().to_string());
        }
        let m = &mut doc.fields.metadata;
        if let Some(link) = link {
            m.insert("url".into(), crate::secret::redact_url(&link).into());
        }
        m.insert("feed".into(), self.url.clone().into());
        if let Some(t) = &feed.title {
            m.insert("feed_title".into(), t.content.trim().into());
        }
        if let Some(d) = entry.published {
            m.insert("published".into(), d.to_rfc3339().into());
        }
        if let Some(d) = entry.updated {
            m.insert("updated".into(), d.to_rfc3339().into());
        }
        let authors: Vec<&str> = entry
            .authors
            .iter()
            .filter_map(|a| a.name.as_deref())
            .collect();
        if !authors.is_empty() {
            m.insert("authors".into(), authors.join(", ").into());
        }
        let categories: Vec<&str> = entry.categories.iter().map(|c| c.term.as_str()).collect();
        if !categories.is_empty() {
            m.insert("categories".into(), categories.join(", ").into());
        }
        Made::Doc(Box::new(doc))
    }

    /// With `--follow-links`: the document of the page entry `id` links to, with its version
    /// key; or the entry's own content when the link leaves the feed's origin; or what became
    /// of the entry instead (unchanged, dropped, failed).
    async fn followed(
        &self,
        id: &str,
        link: Option<&str>,
        entry: &Entry,
        site: Site<'_>,
        fetcher: &Arc<Fetcher>,
        publisher: &Publisher,
    ) -> Result<(Document, Option<String>), Made> {
        let Some(link) = link else {
            return Err(Made::Failed {
                id: id.to_string(),
                reason: "the entry has no link to follow (--follow-links)".into(),
            });
        };
        let parsed = url::Url::parse(link).ok();
        let same_origin = parsed.as_ref().map(|u| u.origin());
        if site.origin.is_none() || same_origin.as_ref() != site.origin {
            match feed_document(id, entry) {
                Some(doc) => Ok((doc, None)),
                None => Err(Made::Dropped {
                    id: id.to_string(),
                    reason: format!(
                        "its link {} is on another site (scheme, host or port) than the \
                         feed's, which --follow-links does not follow, and the entry has no \
                         content or summary",
                        crate::secret::redact_url(link)
                    ),
                }),
            }
        } else if parsed.as_ref().is_some_and(|u| !site.robots.allows(u)) {
            Err(Made::Dropped {
                id: id.to_string(),
                reason: format!(
                    "robots.txt disallows its link {} for ragline; not read",
                    crate::secret::redact_url(link)
                ),
            })
        } else {
            let date = entry.updated.or(entry.published);
            let key = date.map(|d| version_key(&["feed-entry", id, link, &d.to_rfc3339()]));
            if let (Some(key), Some(known)) = (&key, &self.known) {
                if known.holds(id, key) {
                    return Err(Made::Unchanged {
                        id: id.to_string(),
                        key: key.clone(),
                    });
                }
            }
            let (page, doc) = fetch_page(fetcher, link, id, site.robots).await?;
            publisher.fetched(page.body.len() as u64);
            Ok((doc, key))
        }
    }

    /// The document id of an entry whose id (or link) is `raw`: itself when it is a URL or URN
    /// (`tag:`, `urn:`, `https:`), else made unique to this feed (`FEED#GUID`); none when empty.
    fn entry_id(&self, raw: &str) -> Option<String> {
        let raw = raw.trim();
        if raw.is_empty() {
            None
        } else if url::Url::parse(raw).is_ok() {
            Some(crate::secret::redact_url(raw))
        } else {
            Some(format!("{}#{raw}", self.url))
        }
    }
}

/// The feed in `page`, entries without an id of their own identified by their link (never a
/// random id, which would change every run).
fn parse(page: &Page) -> Result<Feed, ConnectorError> {
    feed_rs::parser::Builder::new()
        .base_uri(Some(&page.url))
        .id_generator(|links, _title, _base| {
            links
                .iter()
                .find(|l| l.rel.as_deref().is_none_or(|r| r == "alternate"))
                .map(|l| l.href.clone())
                .unwrap_or_default()
        })
        .build()
        .parse(&page.body[..])
        .map_err(|e| {
            ConnectorError::Source(format!(
                "{} is not a feed (RSS, Atom or JSON Feed): {e}. Web sites are not crawled \
                 yet: give a feed's URL",
                crate::secret::redact_url(&page.url)
            ))
        })
}

/// The document of an entry from what the feed holds: its content, else its summary (HTML or
/// text as the feed says); none when it has neither.
fn feed_document(id: &str, entry: &Entry) -> Option<Document> {
    let (body, media) = match (&entry.content, &entry.summary) {
        (Some(c), _) if c.body.as_deref().is_some_and(|b| !b.trim().is_empty()) => (
            c.body.clone().unwrap_or_default(),
            c.content_type.to_string(),
        ),
        (_, Some(s)) if !s.content.trim().is_empty() => {
            (s.content.clone(), s.content_type.to_string())
        }
        _ => return None,
    };
    let format = if media.contains("html") {
        "html"
    } else {
        "text"
    };
    document_of(id.to_string(), body.into_bytes(), format).ok()
}

/// The site a feed is read from: its origin, its robots.txt.
#[derive(Clone, Copy)]
struct Site<'a> {
    origin: Option<&'a url::Origin>,
    robots: &'a Robots,
}

/// GET an entry's page under the site's `robots` and make its document (HTML unless the page
/// says otherwise).
async fn fetch_page(
    fetcher: &Fetcher,
    link: &str,
    id: &str,
    robots: &Robots,
) -> Result<(Page, Document), Made> {
    let how = Get {
        known: None,
        robots: Some(robots),
        max_bytes: None,
    };
    let page = fetcher.get_with(link, how).await.map_err(|e| match e {
        FetchError::Disallowed { .. } | FetchError::OtherHost { .. } => Made::Dropped {
            id: id.to_string(),
            reason: e.to_string(),
        },
        FetchError::Status { .. } => Made::Failed {
            id: id.to_string(),
            reason: format!("its page answered {e}"),
        },
        e => Made::Failed {
            id: id.to_string(),
            reason: e.to_string(),
        },
    })?;
    let format = page.format();
    match document_of(id.to_string(), page.body.clone(), format) {
        Ok(doc) => Ok((page, doc)),
        Err(Unusable::Failed(reason)) => Err(Made::Failed {
            id: id.to_string(),
            reason,
        }),
        Err(Unusable::Dropped(reason)) => Err(Made::Dropped {
            id: id.to_string(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(body: &str) -> Page {
        Page {
            url: "https://blog.example/feed.xml".into(),
            content_type: None,
            etag: None,
            last_modified: None,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn rss_and_atom_entries_keep_their_ids_and_get_their_links_as_ids_otherwise() {
        let rss = page(
            r#"<rss version="2.0"><channel><title>Blog</title>
               <item><guid>42</guid><title>A</title><description>&lt;p&gt;Hi&lt;/p&gt;</description></item>
               <item><link>https://blog.example/b.html</link><title>B</title></item>
               <item><title>C without id or link</title><description>c</description></item>
               </channel></rss>"#,
        );
        let feed = parse(&rss).unwrap();
        let c = FeedConnector::new("https://blog.example/feed.xml", false, 4, None);
        let ids: Vec<Option<String>> = feed.entries.iter().map(|e| c.entry_id(&e.id)).collect();
        assert_eq!(
            ids,
            [
                Some("https://blog.example/feed.xml#42".to_string()),
                Some("https://blog.example/b.html".to_string()),
                None
            ]
        );
        let doc = feed_document("x", &feed.entries[0]).unwrap();
        assert_eq!(doc.fields.metadata["format"], "html");
        let atom = page(
            r#"<feed xmlns="http://www.w3.org/2005/Atom"><title>T</title>
               <entry><id>tag:blog.example,2026:1</id><title>One</title>
               <updated>2026-12-01T10:00:00Z</updated><content type="text">Plain.</content></entry></feed>"#,
        );
        let feed = parse(&atom).unwrap();
        assert_eq!(
            c.entry_id(&feed.entries[0].id).as_deref(),
            Some("tag:blog.example,2026:1")
        );
        assert_eq!(
            feed_document("x", &feed.entries[0]).unwrap().fields.text,
            "Plain."
        );
    }

    #[test]
    fn what_is_not_a_feed_says_so() {
        match parse(&page("<html><body>a page</body></html>")) {
            Err(ConnectorError::Source(m)) => assert!(m.contains("is not a feed"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
