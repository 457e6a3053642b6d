//! `postgres://USER[:PASS]@HOST:PORT/DB[?schema=S&...]`: parsing, the password (URL,
//! `PGPASSWORD`, `.pgpass`), connecting, and errors that say what to do.
//!
//! ragline's own options are taken out of the query string, and so are libpq's TLS settings
//! (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`: [`super::tls`], done with rustls); the
//! rest (`connect_timeout`, `application_name`, ...) goes to the client as libpq would take
//! it. The password never appears in a message: [`PgTarget`]'s `Display` and `Debug` leave it
//! out, whether it was in the userinfo or in `?password=`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, Config, NoTls};

use super::tls::{RootCert, SslMode, TlsSettings};
use crate::indexers::BackendError;

/// How vectors are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorType {
    /// `vector(dim)`: float32.
    Vector,
    /// `halfvec(dim)`: float16, half the space (and of the HNSW index).
    Halfvec,
}

impl VectorType {
    pub fn sql(self, dim: usize) -> String {
        match self {
            VectorType::Vector => format!("vector({dim})"),
            VectorType::Halfvec => format!("halfvec({dim})"),
        }
    }

    /// As `meta` records it and the URI's `vector=` names it.
    pub fn name(self) -> &'static str {
        match self {
            VectorType::Vector => "vector",
            VectorType::Halfvec => "halfvec",
        }
    }

    pub fn cosine_ops(self) -> &'static str {
        match self {
            VectorType::Vector => "vector_cosine_ops",
            VectorType::Halfvec => "halfvec_cosine_ops",
        }
    }
}

/// HNSW's `m` (links per node) unless the URI says `m=`: pgvector's default.
pub const DEFAULT_HNSW_M: u32 = 16;
/// HNSW's `ef_construction` unless the URI says otherwise: pgvector's default.
pub const DEFAULT_EF_CONSTRUCTION: u32 = 64;
/// `hnsw.ef_search` for queries unless the URI says otherwise (pgvector's default is 40;
/// 100 keeps recall@10 above 0.98 on SciFact, see BENCHMARKS.md).
pub const DEFAULT_EF_SEARCH: u32 = 100;
/// How long a writer waits for a server that went away to come back before giving up.
pub const DEFAULT_RECONNECT: Duration = Duration::from_secs(30);

/// A parsed `postgres://` URI.
#[derive(Clone, PartialEq, Eq)]
pub struct PgTarget {
    /// The connection URL without ragline's options (may hold the password).
    conn: String,
    /// The schema holding ragline's tables (`?schema=`, default `ragline`).
    pub schema: String,
    pub vector_type: VectorType,
    pub hnsw_m: u32,
    pub ef_construction: u32,
    pub ef_search: u32,
    pub reconnect: Duration,
    /// TLS, as `sslmode` and its companions say.
    pub tls: TlsSettings,
}

/// The error for a malformed index URI, saying `why`.
fn bad_uri(why: String) -> BackendError {
    BackendError::Invalid(format!("bad index URI: {why}"))
}

/// The whole number `value` of option `key`, within `lo..=hi`.
fn number(key: &str, value: &str, lo: u32, hi: u32) -> Result<u32, BackendError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| bad_uri(format!("`{key}={value}`: give a whole number {lo}..={hi}")))
}

impl PgTarget {
    pub fn parse(uri: &str) -> Result<Self, BackendError> {
        let (base, query) = match uri.split_once('?') {
            Some((b, q)) => (b, q),
            None => (uri, ""),
        };
        let mut target = PgTarget {
            conn: String::new(),
            schema: "ragline".into(),
            vector_type: VectorType::Vector,
            hnsw_m: DEFAULT_HNSW_M,
            ef_construction: DEFAULT_EF_CONSTRUCTION,
            ef_search: DEFAULT_EF_SEARCH,
            reconnect: DEFAULT_RECONNECT,
            tls: TlsSettings::default(),
        };
        let mut client = (None, None);
        let mut passed = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !target.set_option(key, value, &mut client)? {
                passed.push(pair);
            }
        }
        target.tls.client = match client {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(bad_uri(
                    "a client certificate needs both sslcert= and sslkey=".into(),
                ))
            }
        };
        target.conn = if passed.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", passed.join("&"))
        };
        // Parse now, so a malformed URL (or TLS files that are not there) is refused before
        // anything runs.
        target.config()?;
        target.tls.client_config().map_err(|e| bad_uri(e.0))?;
        Ok(target)
    }

    /// Apply the URI's option `key=value` when it is ragline's (false when it is not: it
    /// goes to the server); `client` collects `sslcert=` and `sslkey=`.
    fn set_option(
        &mut self,
        key: &str,
        value: &str,
        client: &mut (Option<PathBuf>, Option<PathBuf>),
    ) -> Result<bool, BackendError> {
        match key {
            "schema" => {
                let ok = !value.is_empty()
                    && value.len() <= 63
                    && value.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                    && value
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if !ok {
                    return Err(bad_uri(format!(
                        "`schema={value}`: use lower-case letters, digits and _"
                    )));
                }
                self.schema = value.to_string();
            }
            "vector" => {
                self.vector_type = match value {
                    "vector" => VectorType::Vector,
                    "halfvec" => VectorType::Halfvec,
                    _ => return Err(bad_uri(format!("`vector={value}`: use vector or halfvec"))),
                }
            }
            "m" => self.hnsw_m = number(key, value, 2, 100)?,
            "ef_construction" => self.ef_construction = number(key, value, 4, 1000)?,
            "ef_search" => self.ef_search = number(key, value, 1, 1000)?,
            "reconnect_seconds" => {
                self.reconnect = Duration::from_secs(number(key, value, 0, 3600)?.into())
            }
            "sslmode" => {
                self.tls.mode = SslMode::parse(value).ok_or_else(|| {
                    bad_uri(format!(
                        "`sslmode={value}`: use disable, allow, prefer, require, verify-ca \
                         or verify-full"
                    ))
                })?
            }
            "sslrootcert" if !value.is_empty() => {
                self.tls.root_cert = Some(if value == "system" {
                    RootCert::System
                } else {
                    RootCert::File(value.into())
                })
            }
            "sslcert" if !value.is_empty() => client.0 = Some(value.into()),
            "sslkey" if !value.is_empty() => client.1 = Some(value.into()),
            "sslrootcert" | "sslcert" | "sslkey" => {
                return Err(bad_uri(format!("`{key}=` needs a file's path")))
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The client's configuration, with the password from the URL, else `PGPASSWORD`, else
    /// the password file.
    pub fn config(&self) -> Result<Config, BackendError> {
        let mut config: Config = self.conn.parse().map_err(|e| {
            BackendError::Invalid(format!(
                "bad index URI `{self}`: {e}; use postgres://USER[:PASS]@HOST:PORT/DB"
            ))
        })?;
        if config.get_password().is_none() {
            if let Some(p) = std::env::var_os("PGPASSWORD") {
                config.password(p.to_string_lossy().as_bytes());
            } else if let Some(p) = pgpass(&config) {
                config.password(p.as_bytes());
            }
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        config.ssl_mode(self.tls.mode.client_mode());
        if config.get_user().is_none() {
            if let Ok(user) = std::env::var("USER") {
                config.user(&user);
            }
        }
        Ok(config)
    }

    /// A new connection; every failure is a message that says what to do.
    pub fn connect(&self) -> Result<Client, BackendError> {
        let config = self.config()?;
        self.connect_with(&config)?
            .map_err(|e| connect_error(self, &config, &e))
    }

    /// Connect with TLS as `sslmode` says. The outer error: the TLS settings cannot work (a
    /// certificate file that went away since the URI was parsed).
    fn connect_with(
        &self,
        config: &Config,
    ) -> Result<Result<Client, postgres::Error>, BackendError> {
        if self.tls.mode == SslMode::Disable {
            return Ok(config.connect(NoTls));
        }
        let tls = self
            .tls
            .client_config()
            .map_err(|e| BackendError::Invalid(format!("index {self}: {e}")))?;
        Ok(config.connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
    }

    /// Connect, retrying for up to `self.reconnect` while the server is unreachable or
    /// starting (a restart): for writers that must ride out a server restart.
    pub fn connect_patiently(&self) -> Result<Client, BackendError> {
        let deadline = std::time::Instant::now() + self.reconnect;
        loop {
            let config = self.config()?;
            match self.connect_with(&config)? {
                Ok(c) => return Ok(c),
                Err(e) if is_transient(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(connect_error(self, &config, &e)),
            }
        }
    }

    /// The schema name, quoted for SQL.
    pub fn schema_sql(&self) -> String {
        format!("\"{}\"", self.schema)
    }
}

/// Connection parameters whose values an error message may show: none of them carries a
/// secret (libpq's names).
const SHOWN_PARAMS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "application_name",
    "connect_timeout",
    "sslmode",
    "target_session_attrs",
    "load_balance_hosts",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "channel_binding",
    "sslnegotiation",
];

impl fmt::Display for PgTarget {
    /// The URI without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = match (self.conn.find("://"), self.conn.rfind('@')) {
            (Some(s), Some(at)) if at > s => {
                let userinfo = &self.conn[s + 3..at];
                let user = userinfo.split(':').next().unwrap_or("");
                format!("{}{user}{}", &self.conn[..s + 3], &self.conn[at..])
            }
            _ => self.conn.clone(),
        };
        // `?password=` (libpq takes it there too) goes the same way; every other parameter's
        // value is shown only when it is known to be harmless (`sslpassword=`, a typo'd
        // `pasword=`, whatever libpq learns next: `***`).
        let redacted = match redacted.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<String> = query
                    .split('&')
                    .filter(|p| !p.to_ascii_lowercase().starts_with("password="))
                    .map(|p| match p.split_once('=') {
                        Some((k, _))
                            if !SHOWN_PARAMS.contains(&k.to_ascii_lowercase().as_str()) =>
                        {
                            format!("{k}=***")
                        }
                        _ => p.to_string(),
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => redacted,
        };
        write!(f, "{redacted}")?;
        if self.schema != "ragline" {
            let sep = if redacted.contains('?') { '&' } else { '?' };
            write!(f, "{sep}schema={}", self.schema)?;
        }
        Ok(())
    }
}

impl fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgTarget({self})")
    }
}

/// The password for this host, port, database and user in `PGPASSFILE` or `~/.pgpass`
/// (`host:port:db:user:password`, `*` matches anything, `\` escapes).
fn pgpass(config: &Config) -> Option<String> {
    let path = std::env::var_os("PGPASSFILE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".pgpass")))?;
    let text = std::fs::read_to_string(path).ok()?;
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "localhost".to_string(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or("");
    let db = config.get_dbname().unwrap_or(user);
    let want = [host.as_str(), port.as_str(), db, user];
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let fields = split_pgpass(line);
            if fields.len() != 5 {
                return None;
            }
            let matches = fields[..4]
                .iter()
                .zip(want)
                .all(|(f, w)| f == "*" || f == w || (w == "127.0.0.1" && f == "localhost"));
            matches.then(|| fields[4].clone())
        })
}

fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    fields.last_mut().expect("one field at least").push(n);
                }
            }
            ':' => fields.push(String::new()),
            c => fields.last_mut().expect("one field at least").push(c),
        }
    }
    fields
}

/// A connection failure a restart would cure: the server is not there (yet), or is starting
/// or shutting down.
pub fn is_transient(e: &postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            code == &SqlState::CANNOT_CONNECT_NOW
                || code == &SqlState::ADMIN_SHUTDOWN
                || code == &SqlState::CRASH_SHUTDOWN
                || code.code().starts_with("08")
        }
        None => true,
    }
}

fn connect_error(target: &PgTarget, config: &Config, e: &postgres::Error) -> BackendError {
    let user = config.get_user().unwrap_or("?");
    let db = config.get_dbname().unwrap_or(user);
    let msg = match e.code() {
        Some(c)
            if c == &SqlState::INVALID_PASSWORD
                || c == &SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            format!(
                "cannot log in to {target} as `{user}`: {}; give the right password in the URI \
             (postgres://{user}:PASSWORD@...), in PGPASSWORD, or in ~/.pgpass",
                e.as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_string())
            )
        }
        Some(c) if c == &SqlState::INVALID_CATALOG_NAME => format!(
            "database `{db}` does not exist on {target}: create it (`createdb {db}`) or name \
             another in the URI"
        ),
        Some(c) if c == &SqlState::CANNOT_CONNECT_NOW => {
            format!("{target} is starting up or shutting down; try again in a moment")
        }
        None if is_tls_failure(e) => format!(
            "TLS with {target} failed ({}); check sslrootcert= (the CA that signed the \
             server's certificate), that the host in the URI is the name in the certificate \
             (verify-full), and sslmode= (now {})",
            root_cause(e),
            target.tls.mode.name()
        ),
        _ => format!(
            "cannot connect to {target}: {}; is the server running and reachable? (start it, \
             e.g. `scripts/postgres.sh start` for the test server, or fix host and port in \
             --index)",
            root_cause(e)
        ),
    };
    BackendError::Invalid(msg)
}

/// A handshake or certificate failure, or a server that refuses TLS when it is required.
fn is_tls_failure(e: &postgres::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        let text = err.to_string().to_ascii_lowercase();
        if text.contains("certificate") || text.contains("tls") || text.contains("ssl") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The innermost error's message (the client's own says only "error connecting to server").
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_taken_out_and_the_password_hidden() {
        let t = PgTarget::parse(
            "postgres://me:s3cret@db.example:5433/rag?schema=docs&vector=halfvec&ef_search=64&application_name=x",
        )
        .unwrap();
        assert_eq!(t.schema, "docs");
        assert_eq!(t.vector_type, VectorType::Halfvec);
        assert_eq!(t.ef_search, 64);
        assert_eq!(t.hnsw_m, DEFAULT_HNSW_M);
        let shown = t.to_string();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(
            shown.starts_with("postgres://me@db.example:5433/rag"),
            "{shown}"
        );
        let c = t.config().unwrap();
        assert_eq!(c.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(c.get_dbname(), Some("rag"));
        assert_eq!(c.get_application_name(), Some("x"));
    }

    #[test]
    fn tls_settings_come_out_of_the_uri_and_a_password_parameter_never_shows() {
        let t = PgTarget::parse(
            "postgres://me@db:5432/rag?sslmode=verify-full&sslrootcert=system&password=s3cret",
        );
        // `system` needs the machine's CA store; where it has none the error says so.
        match t {
            Ok(t) => {
                assert_eq!(t.tls.mode, SslMode::VerifyFull);
                assert_eq!(t.tls.root_cert, Some(RootCert::System));
                assert!(!t.to_string().contains("s3cret"), "{t}");
                assert_eq!(t.config().unwrap().get_password(), Some(&b"s3cret"[..]));
            }
            Err(e) => assert!(e.to_string().contains("sslrootcert=system"), "{e}"),
        }
        let t = PgTarget::parse("postgres://me@db/rag?sslmode=require").unwrap();
        assert_eq!(t.tls.mode, SslMode::Require);
        assert_eq!(
            t.config().unwrap().get_ssl_mode(),
            postgres::config::SslMode::Require
        );
        let t = PgTarget::parse("postgres://me@db/rag").unwrap();
        assert_eq!(t.tls.mode, SslMode::Prefer, "libpq's default");
        for (bad, says) in [
            ("postgres://h/db?sslmode=on", "sslmode=on"),
            (
                "postgres://h/db?sslmode=verify-ca&sslrootcert=/no/ca.pem",
                "/no/ca.pem",
            ),
            (
                "postgres://h/db?sslcert=/c.pem",
                "both sslcert= and sslkey=",
            ),
        ] {
            let e = PgTarget::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_options_are_refused_with_the_fix() {
        for bad in [
            "postgres://h/db?schema=Bad-Name",
            "postgres://h/db?vector=float8",
            "postgres://h/db?m=1",
            "postgres://h/db?ef_search=lots",
        ] {
            let e = PgTarget::parse(bad).unwrap_err().to_string();
            assert!(e.contains("bad index URI"), "{bad}: {e}");
        }
    }

    #[test]
    fn pgpass_lines_split_on_unescaped_colons() {
        assert_eq!(
            split_pgpass(r"localhost:5432:*:me:pa\:ss"),
            vec!["localhost", "5432", "*", "me", "pa:ss"]
        );
    }
}
