//! Downloading documents from the web (a feed, the pages it links to): a GET with a user agent,
//! time limits, a bounded body, and redirects followed on the same host only (a page cannot
//! send the run to another machine, such as a cloud's metadata service).

use std::time::Duration;

use thiserror::Error;

use super::{read_bounded, transport_reason, Body};

/// How many redirects one GET follows.
const MAX_REDIRECTS: usize = 5;

/// A downloaded page.
#[derive(Debug)]
pub struct Page {
    /// The URL it was read from, after redirects.
    pub url: String,
    pub content_type: Option<String>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub body: Vec<u8>,
}

/// What a conditional GET sends: the validators of the copy the index holds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Validators<'a> {
    pub etag: Option<&'a str>,
    pub last_modified: Option<&'a str>,
}

/// What a conditional GET got.
#[derive(Debug)]
pub enum Fetched {
    Page(Page),
    /// 304: the copy the index holds is current.
    NotModified,
}

/// Why a page was not downloaded, with what to do about it.
#[derive(Debug, Error)]
pub enum FetchError {
    #[error("HTTP {status} from {url}")]
    Status { status: u16, url: String },
    #[error("{url} is {size} bytes or more, over --max-file-bytes={max}; raise it to read it")]
    TooLarge {
        url: String,
        size: usize,
        max: usize,
    },
    #[error(
        "{url} redirects to another host ({to}); ragline follows redirects on the same host \
         only: give the address it points to"
    )]
    OtherHost { url: String, to: String },
    #[error("{url}: {reason}")]
    Transport { url: String, reason: String },
}

/// Downloads pages.
pub struct Fetcher {
    client: reqwest::Client,
    max_bytes: usize,
}

impl Fetcher {
    /// A fetcher reading no more than `max_bytes` of a body, each GET done within `timeout`.
    pub fn new(max_bytes: u64, timeout: Duration) -> Result<Fetcher, reqwest::Error> {
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            let same_host = attempt
                .previous()
                .first()
                .is_some_and(|first| first.host_str() == attempt.url().host_str());
            if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error("too many redirects")
            } else if same_host && matches!(attempt.url().scheme(), "http" | "https") {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let client = reqwest::Client::builder()
            .user_agent(concat!("ragline/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10).min(timeout))
            .timeout(timeout)
            .redirect(policy)
            .build()?;
        Ok(Fetcher {
            client,
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
        })
    }

    /// GET `url`: the page, or why not.
    pub async fn get(&self, url: &str) -> Result<Page, FetchError> {
        match self.get_if_changed(url, None).await? {
            Fetched::Page(page) => Ok(page),
            Fetched::NotModified => Err(FetchError::Status {
                status: 304,
                url: crate::secret::redact_url(url),
            }),
        }
    }

    /// GET `url`, conditional on `known` (the validators of the copy the index holds): the
    /// page, or that it did not change since (304, no body sent).
    pub async fn get_if_changed(
        &self,
        url: &str,
        known: Option<&Validators<'_>>,
    ) -> Result<Fetched, FetchError> {
        let shown = crate::secret::redact_url(url);
        let mut request = self.client.get(url);
        // Validators the index kept from an earlier answer: sent when they are still valid
        // header values (a stored value is not trusted to be).
        let header =
            |v: Option<&str>| v.and_then(|v| reqwest::header::HeaderValue::from_str(v).ok());
        if let Some(v) = known {
            if let Some(etag) = header(v.etag) {
                request = request.header(reqwest::header::IF_NONE_MATCH, etag);
            }
            if let Some(date) = header(v.last_modified) {
                request = request.header(reqwest::header::IF_MODIFIED_SINCE, date);
            }
        }
        let resp = request.send().await.map_err(|e| FetchError::Transport {
            url: shown.clone(),
            reason: transport_reason(&e),
        })?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_MODIFIED && known.is_some() {
            return Ok(Fetched::NotModified);
        }
        if status.is_redirection() {
            // Stopped by the policy: a redirect to another host.
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?");
            return Err(FetchError::OtherHost {
                url: shown,
                to: crate::secret::redact_url(to),
            });
        }
        if !status.is_success() {
            return Err(FetchError::Status {
                status: status.as_u16(),
                url: shown,
            });
        }
        let header = |name: reqwest::header::HeaderName| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_type = header(reqwest::header::CONTENT_TYPE);
        let etag = header(reqwest::header::ETAG);
        let last_modified = header(reqwest::header::LAST_MODIFIED);
        let final_url = resp.url().to_string();
        let body = read_bounded(resp, self.max_bytes)
            .await
            .map_err(|e| match e {
                Body::TooLarge(size) => FetchError::TooLarge {
                    url: shown.clone(),
                    size,
                    max: self.max_bytes,
                },
                Body::Failed(e) => FetchError::Transport {
                    url: shown.clone(),
                    reason: transport_reason(&e),
                },
            })?;
        Ok(Fetched::Page(Page {
            url: final_url,
            content_type,
            etag,
            last_modified,
            body,
        }))
    }
}
