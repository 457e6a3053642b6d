//! robots.txt (RFC 9309) for ragline: Google's matcher (the `robotstxt` crate, a port of the
//! reference the RFC was written from) with user agent `ragline`, and the `Crawl-delay` of the
//! groups that apply. Every URL the web sources read is checked against its site's rules: the
//! start, each page, each sitemap, each feed entry's page, and every redirect on the way.

use std::time::Duration;

use url::Url;

/// robots.txt is read no further than this (Google's limit is 500 KiB).
pub const MAX_ROBOTS_BYTES: usize = 500 << 10;

/// The rules of a site's robots.txt for ragline.
#[derive(Clone, Debug, Default)]
pub struct Robots {
    body: String,
    /// The site's `Crawl-delay` for ragline.
    pub delay: Option<Duration>,
}

impl Robots {
    /// Rules from a robots.txt body (read no further than [`MAX_ROBOTS_BYTES`]).
    pub fn parse(body: &[u8]) -> Robots {
        let body = String::from_utf8_lossy(&body[..body.len().min(MAX_ROBOTS_BYTES)]).into_owned();
        Robots {
            delay: crawl_delay(&body),
            body,
        }
    }

    /// Whether ragline may read `url`.
    pub fn allows(&self, url: &Url) -> bool {
        self.body.is_empty()
            || robotstxt::DefaultMatcher::default().one_agent_allowed_by_robots(
                &self.body,
                "ragline",
                url.as_str(),
            )
    }
}

/// The largest `Crawl-delay` of the groups for `*` or `ragline` (Google's matcher ignores it).
fn crawl_delay(body: &str) -> Option<Duration> {
    let mut agents_apply = false;
    let mut in_agents = false;
    let mut delay: Option<f64> = None;
    for line in body.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim());
        if key == "user-agent" {
            let applies = value == "*" || value.eq_ignore_ascii_case("ragline");
            agents_apply = if in_agents {
                agents_apply || applies
            } else {
                applies
            };
            in_agents = true;
            continue;
        }
        in_agents = false;
        if key == "crawl-delay" && agents_apply {
            if let Ok(d) = value.parse::<f64>() {
                if d.is_finite() && d > 0.0 {
                    delay = Some(delay.map_or(d, |x: f64| x.max(d)).min(60.0));
                }
            }
        }
    }
    delay.map(Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crawl_delay_is_read_from_the_groups_that_apply() {
        let body = "User-agent: googlebot\nCrawl-delay: 30\n\nUser-agent: *\nUser-agent: other\n\
                    Disallow: /private/\nCrawl-delay: 2 # seconds\n";
        assert_eq!(crawl_delay(body), Some(Duration::from_secs(2)));
        assert_eq!(crawl_delay("User-agent: bingbot\nCrawl-delay: 5\n"), None);
        assert_eq!(
            crawl_delay("User-agent: ragline\nCrawl-delay: 9999\n"),
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn robots_rules_apply_to_ragline() {
        let r = Robots::parse(b"User-agent: *\nDisallow: /docs/private/\n");
        assert!(r.allows(&Url::parse("https://s.example/docs/a.html").unwrap()));
        assert!(!r.allows(&Url::parse("https://s.example/docs/private/b.html").unwrap()));
    }
}
