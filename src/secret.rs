//! Secrets: passwords, tokens and keys are held in [`Secret`], whose `Debug` and `Display`
//! never show them, and URLs are shown through [`redact_url`], which leaves out what a URL may
//! carry of them (`user:PASSWORD@`, a token as the user, `?password=`, `?token=`...). Every
//! message, report, record and log line that names a place goes through one of the two.

use std::fmt;

/// A password, token or key. Shown as `***`; [`Secret::expose`] is the one way to the text,
/// for the code that sends it.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Secret(text.into())
    }

    /// The secret itself, to send where it belongs (never to print).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Query parameters whose values are secrets (compared without case).
const SECRET_PARAMS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "pwd",
    "token",
    "access_token",
    "auth_token",
    "api_key",
    "apikey",
    "api-key",
    "key",
    "secret",
    "client_secret",
    "sig",
    "signature",
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
];

/// Schemes whose user part alone is a secret (`nats://TOKEN@host`).
const TOKEN_SCHEMES: &[&str] = &["nats", "tls", "ws", "wss"];

/// `url` (or a comma-separated list of URLs, as a NATS address is) without its secrets: the
/// password of `user:password@` becomes `***`, a token in the user's place (NATS) becomes
/// `***`, and the values of `?password=`, `?token=`, `?key=`... become `***`. Text that is not
/// a URL comes back as it was.
pub fn redact_url(url: &str) -> String {
    // A fragment is kept as it is, after the redacted query.
    let (url, fragment) = match url.split_once('#') {
        Some((u, f)) => (u, Some(f)),
        None => (url, None),
    };
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out: Vec<String> = base.split(',').map(redact_authority).collect();
    if let Some(q) = query {
        let pairs: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) if !v.is_empty() && is_secret_param(k) => format!("{k}=***"),
                _ => pair.to_string(),
            })
            .collect();
        let last = out.pop().unwrap_or_default();
        out.push(format!("{last}?{}", pairs.join("&")));
    }
    let mut out = out.join(",");
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// Whether a query parameter named `key` carries a secret: one of [`SECRET_PARAMS`], any
/// `X-Amz-*` or `X-Goog-*` signing parameter, or a name ending in `token`, `secret`,
/// `password` or `signature` (compared without case, `%`-encoding undone).
fn is_secret_param(key: &str) -> bool {
    let key: String = url::form_urlencoded::parse(format!("{key}=").as_bytes())
        .next()
        .map(|(k, _)| k.to_ascii_lowercase())
        .unwrap_or_default();
    SECRET_PARAMS.iter().any(|s| s.eq_ignore_ascii_case(&key))
        || key.starts_with("x-amz-")
        || key.starts_with("x-goog-")
        || ["token", "secret", "password", "signature", "_key", "-key"]
            .iter()
            .any(|end| key.ends_with(end))
}

fn redact_authority(part: &str) -> String {
    let Some(p) = part.find("://") else {
        return part.to_string();
    };
    let (scheme, rest) = (&part[..p], &part[p + 3..]);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let Some(at) = authority.rfind('@') else {
        return part.to_string();
    };
    let userinfo = &authority[..at];
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None if TOKEN_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)) => "***".into(),
        None => userinfo.to_string(),
    };
    format!(
        "{scheme}://{shown}@{}{}",
        &authority[at + 1..],
        &rest[end..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_secrets_and_keep_the_rest() {
        for (url, shown) in [
            ("nats://alice:s3cret@h:4222", "nats://alice:***@h:4222"),
            ("nats://t0ken@h:4222", "nats://***@h:4222"),
            (
                "nats://a:p1@h1:4222,nats://a:p2@h2:4222?prefix=x&token=abc",
                "nats://a:***@h1:4222,nats://a:***@h2:4222?prefix=x&token=***",
            ),
            (
                "postgres://me:pw@db:5432/rag?sslmode=require&password=pw2",
                "postgres://me:***@db:5432/rag?sslmode=require&password=***",
            ),
            ("postgres://me@db/rag", "postgres://me@db/rag"),
            (
                "https://u:p@api.example.com/v1?api_key=k&x=1",
                "https://u:***@api.example.com/v1?api_key=***&x=1",
            ),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("sqlite://rag.db", "sqlite://rag.db"),
            ("not a url", "not a url"),
            ("https://h/p@q", "https://h/p@q"),
            (
                "https://b.example/feed.xml?token=t0k&page=2#top",
                "https://b.example/feed.xml?token=***&page=2#top",
            ),
            (
                "https://s3.example/o?X-Amz-Credential=AK&X-Amz-Date=20261207&x-amz-signature=f0",
                "https://s3.example/o?X-Amz-Credential=***&X-Amz-Date=***&x-amz-signature=***",
            ),
            (
                "https://h/x?Access_Token=a&refresh%5Ftoken=r&sig=s&private_key=k&sort=asc",
                "https://h/x?Access_Token=***&refresh%5Ftoken=***&sig=***&private_key=***&sort=asc",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** Secret(***)");
        assert_eq!(s.expose(), "hunter2");
    }
}
