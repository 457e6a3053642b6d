//! Downloading documents from the web (a feed, the pages it links to, a crawled site): a GET
//! with a user agent, time limits and a bounded body. Redirects are followed here, one hop at
//! a time, each checked as the first URL was: on the same origin (scheme, host and port; an
//! `http` URL may go to `https` on the same host), allowed by the site's robots.txt when the
//! caller has one, and (unless the operator allows them) never to a private, loopback or
//! link-local address, whether the URL names the address or its name resolves to one. A page
//! cannot send the run to another machine, such as a cloud's metadata service.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use thiserror::Error;
use url::Url;

use super::robots::Robots;
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

impl Page {
    /// The document format of the page, from its content type (HTML when it says nothing).
    pub fn format(&self) -> &'static str {
        let media = self
            .content_type
            .as_deref()
            .unwrap_or("")
            .to_ascii_lowercase();
        if media.is_empty() || media.contains("html") {
            "html"
        } else if media.contains("markdown") {
            "markdown"
        } else if media.contains("pdf") {
            "pdf"
        } else if media.contains("wordprocessingml") {
            "docx"
        } else {
            "text"
        }
    }
}

/// What a conditional GET sends: the validators of the copy the index holds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Validators<'a> {
    pub etag: Option<&'a str>,
    pub last_modified: Option<&'a str>,
}

/// How one GET is made: conditional on the copy the index holds, under a site's robots.txt
/// (checked for the URL and every redirect), with a smaller body limit than the fetcher's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Get<'a> {
    pub known: Option<&'a Validators<'a>>,
    pub robots: Option<&'a Robots>,
    pub max_bytes: Option<usize>,
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
        "{url} redirects to another site ({to}); ragline follows redirects on the same origin \
         (scheme, host and port) only: give the address it points to"
    )]
    OtherHost { url: String, to: String },
    #[error("robots.txt disallows {url} for ragline; not read")]
    Disallowed { url: String },
    #[error(
        "{url}: {host} is a private, loopback or link-local address, which ragline reads only \
         when the source's own URL names one, or with --allow-private-addresses"
    )]
    Private { url: String, host: String },
    #[error("{url}: {reason}")]
    Transport { url: String, reason: String },
}

/// Which addresses a fetcher may connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addresses {
    /// Any: the operator named the hosts (a NATS source's `fetch_hosts`), or allowed it.
    Any,
    /// Public addresses only: no private, loopback, link-local or otherwise special one.
    PublicOnly,
}

impl Addresses {
    /// What a web source starting at `url` may reach: any address when the URL itself names a
    /// private or loopback one (`http://127.0.0.1:8080/`, `http://localhost/`, an intranet
    /// address), or when `allow_private` (`--allow-private-addresses`); public ones otherwise.
    pub fn for_source(url: &str, allow_private: bool) -> Addresses {
        let names_private = Url::parse(url).ok().is_some_and(|u| match u.host() {
            Some(url::Host::Ipv4(ip)) => !is_public(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => !is_public(IpAddr::V6(ip)),
            Some(url::Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                d == "localhost" || d.ends_with(".localhost")
            }
            None => false,
        });
        if allow_private || names_private {
            Addresses::Any
        } else {
            Addresses::PublicOnly
        }
    }
}

/// Whether `ip` is an address on the public internet: not loopback, private (RFC 1918, IPv6
/// unique local), link-local (the clouds' metadata services), shared (CGNAT), unspecified,
/// multicast, broadcast or reserved.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

/// A fetcher's resolver: the system's, and for [`Addresses::PublicOnly`] with every private,
/// loopback and link-local address taken out of its answer (a name that resolves to nothing
/// else fails, saying why). With the `test-hooks` feature, `RAGLINE_TEST_RESOLVE=name=ip,...`
/// answers for test names first (a rebinding name is then tested without a DNS server).
struct Resolver {
    addresses: Addresses,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let filter = self.addresses == Addresses::PublicOnly;
        Box::pin(async move {
            let all: Vec<SocketAddr> = match test_resolve(&host) {
                Some(ip) => vec![SocketAddr::new(ip, 0)],
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            if !filter {
                return Ok(Box::new(all.into_iter()) as reqwest::dns::Addrs);
            }
            let public: Vec<SocketAddr> =
                all.iter().copied().filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                let shown: Vec<String> = all.iter().map(|a| a.ip().to_string()).collect();
                return Err(Box::new(RefusedAddress(format!(
                    "{host} resolves to {}, a private, loopback or link-local address, which \
                     ragline reads only when the source's own URL names one, or with \
                     --allow-private-addresses",
                    if shown.is_empty() {
                        "nothing".into()
                    } else {
                        shown.join(", ")
                    }
                )))
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Why a [`Resolver`] gave no address: the message a failed GET reports.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct RefusedAddress(String);

/// The address `RAGLINE_TEST_RESOLVE` gives `host` (test builds only).
fn test_resolve(host: &str) -> Option<IpAddr> {
    if !cfg!(feature = "test-hooks") {
        return None;
    }
    let table = std::env::var("RAGLINE_TEST_RESOLVE").ok()?;
    table
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.eq_ignore_ascii_case(host))
        .and_then(|(_, ip)| ip.parse().ok())
}

/// Downloads pages.
pub struct Fetcher {
    client: reqwest::Client,
    max_bytes: usize,
    addresses: Addresses,
}

impl Fetcher {
    /// A fetcher reading no more than `max_bytes` of a body, each GET done within `timeout`,
    /// connecting to the `addresses` given.
    pub fn new(
        max_bytes: u64,
        timeout: Duration,
        addresses: Addresses,
    ) -> Result<Fetcher, reqwest::Error> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("ragline/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10).min(timeout))
            .timeout(timeout)
            // Followed here, each hop checked (origin, robots.txt, address).
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(std::sync::Arc::new(Resolver { addresses }));
        Ok(Fetcher {
            client: client.build()?,
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            addresses,
        })
    }

    /// GET `url`: the page, or why not.
    pub async fn get(&self, url: &str) -> Result<Page, FetchError> {
        self.get_with(url, Get::default()).await
    }

    /// GET `url` as `how` says (unconditionally): the page, or why not.
    pub async fn get_with(&self, url: &str, how: Get<'_>) -> Result<Page, FetchError> {
        let how = Get { known: None, ..how };
        match self.fetch(url, how).await? {
            Fetched::Page(page) => Ok(page),
            Fetched::NotModified => Err(FetchError::Status {
                status: 304,
                url: crate::secret::redact_url(url),
            }),
        }
    }

    /// GET `url` as `how` says: the page, or that it did not change since the copy the index
    /// holds (304, no body sent).
    pub async fn fetch(&self, url: &str, how: Get<'_>) -> Result<Fetched, FetchError> {
        let shown = crate::secret::redact_url(url);
        let first = Url::parse(url).map_err(|e| FetchError::Transport {
            url: shown.clone(),
            reason: format!("not a URL ({e})"),
        })?;
        let mut at = first.clone();
        for _ in 0..=MAX_REDIRECTS {
            self.admit(&at, &how)?;
            let resp = self.request(&at, &how).await?;
            let status = resp.status();
            if status == reqwest::StatusCode::NOT_MODIFIED && how.known.is_some() {
                return Ok(Fetched::NotModified);
            }
            let location = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok());
            if status.is_redirection() && status != reqwest::StatusCode::NOT_MODIFIED {
                let Some(next) = location.and_then(|l| at.join(l).ok()) else {
                    return Err(FetchError::Status {
                        status: status.as_u16(),
                        url: shown,
                    });
                };
                if !same_site(&first, &next) {
                    return Err(FetchError::OtherHost {
                        url: shown,
                        to: crate::secret::redact_url(next.as_str()),
                    });
                }
                at = next;
                continue;
            }
            if !status.is_success() {
                return Err(FetchError::Status {
                    status: status.as_u16(),
                    url: shown,
                });
            }
            return self.page(resp, &shown, &how).await.map(Fetched::Page);
        }
        Err(FetchError::Transport {
            url: shown,
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// Whether `url` may be asked for: robots.txt, and the address when the URL names one.
    fn admit(&self, url: &Url, how: &Get<'_>) -> Result<(), FetchError> {
        if let Some(robots) = how.robots {
            if !robots.allows(url) {
                return Err(FetchError::Disallowed {
                    url: crate::secret::redact_url(url.as_str()),
                });
            }
        }
        let named = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            _ => None,
        };
        if let (Addresses::PublicOnly, Some(ip)) = (self.addresses, named) {
            if !is_public(ip) {
                return Err(FetchError::Private {
                    url: crate::secret::redact_url(url.as_str()),
                    host: ip.to_string(),
                });
            }
        }
        Ok(())
    }

    async fn request(&self, url: &Url, how: &Get<'_>) -> Result<reqwest::Response, FetchError> {
        let mut request = self.client.get(url.as_str());
        // Validators the index kept from an earlier answer: sent when they are still valid
        // header values (a stored value is not trusted to be).
        let header =
            |v: Option<&str>| v.and_then(|v| reqwest::header::HeaderValue::from_str(v).ok());
        if let Some(v) = how.known {
            if let Some(etag) = header(v.etag) {
                request = request.header(reqwest::header::IF_NONE_MATCH, etag);
            }
            if let Some(date) = header(v.last_modified) {
                request = request.header(reqwest::header::IF_MODIFIED_SINCE, date);
            }
        }
        request.send().await.map_err(|e| FetchError::Transport {
            url: crate::secret::redact_url(url.as_str()),
            reason: transport_reason(&e),
        })
    }

    /// The page of a successful answer, its body read up to the limit.
    async fn page(
        &self,
        resp: reqwest::Response,
        shown: &str,
        how: &Get<'_>,
    ) -> Result<Page, FetchError> {
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
        let max = how
            .max_bytes
            .map_or(self.max_bytes, |m| m.min(self.max_bytes));
        let body = read_bounded(resp, max).await.map_err(|e| match e {
            Body::TooLarge(size) => FetchError::TooLarge {
                url: shown.to_string(),
                size,
                max,
            },
            Body::Failed(e) => FetchError::Transport {
                url: shown.to_string(),
                reason: transport_reason(&e),
            },
        })?;
        Ok(Page {
            url: final_url,
            content_type,
            etag,
            last_modified,
            body,
        })
    }
}

/// Whether a redirect from a GET of `first` to `next` stays on its site: the same origin, or
/// the same host upgraded from `http` (port 80) to `https` (port 443).
pub fn same_site(first: &Url, next: &Url) -> bool {
    if first.origin() == next.origin() {
        return true;
    }
    first.scheme() == "http"
        && next.scheme() == "https"
        && first.host() == next.host()
        && first.port_or_known_default() == Some(80)
        && next.port_or_known_default() == Some(443)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_loopback_and_link_local_addresses_are_not_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn a_source_naming_a_private_address_may_reach_private_addresses() {
        use Addresses::{Any, PublicOnly};
        for (url, want) in [
            ("http://127.0.0.1:8080/feed.xml", Any),
            ("http://localhost:8080/", Any),
            ("http://docs.localhost/", Any),
            ("http://10.0.0.7/wiki/", Any),
            ("http://[::1]:80/", Any),
            ("https://blog.example/feed.xml", PublicOnly),
            ("https://localhost.attacker.example/", PublicOnly),
            ("https://8.8.8.8/", PublicOnly),
        ] {
            assert_eq!(Addresses::for_source(url, false), want, "{url}");
        }
        assert_eq!(Addresses::for_source("https://blog.example/", true), Any);
    }

    #[test]
    fn redirects_stay_on_the_origin_or_upgrade_to_https() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert!(same_site(
            &u("http://a.example/x"),
            &u("http://a.example/y")
        ));
        assert!(same_site(
            &u("http://a.example/x"),
            &u("https://a.example/y")
        ));
        assert!(same_site(
            &u("http://a.example:80/x"),
            &u("https://a.example:443/")
        ));
        assert!(!same_site(
            &u("http://127.0.0.1:8080/"),
            &u("http://127.0.0.1:9090/")
        ));
        assert!(!same_site(
            &u("http://a.example:8080/"),
            &u("https://a.example/")
        ));
        assert!(!same_site(
            &u("https://a.example/"),
            &u("http://a.example/")
        ));
        assert!(!same_site(
            &u("https://a.example/"),
            &u("https://b.example/")
        ));
    }
}
