//! Apache Kafka's client settings, shared by the `kafka://` source (connectors/kafka) and the
//! `kafka://` sink (indexers/kafka): the bootstrap brokers, SASL (PLAIN, SCRAM-SHA-256/512)
//! and TLS (a CA, a client certificate), read once from the operator's URL, and turned into
//! librdkafka's configuration.
//!
//! The password never sits in the URL: `?sasl_password_env=VAR` names the environment variable
//! that holds it, read here, kept in a [`Secret`]. SASL travels only over TLS, or to a broker on
//! this machine (loopback). librdkafka's own errors (an authentication that failed, a broker that
//! cannot be reached) are kept by [`Context`], so a run that cannot start says why.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use thiserror::Error;

use crate::secret::Secret;

/// A `kafka://` URL that cannot work, found before anything connects.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("`{url}`: {why}")]
pub struct BadKafkaUrl {
    /// The URL without its secrets.
    pub url: String,
    pub why: String,
}

/// The SASL mechanisms librdkafka speaks without Kerberos.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// Who the client is to the brokers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sasl {
    mechanism: Mechanism,
    user: String,
    password: Secret,
}

/// How a client reaches the brokers: their addresses and its credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaClient {
    /// `HOST:PORT,HOST:PORT`.
    pub brokers: String,
    sasl: Option<Sasl>,
    tls: bool,
    tls_ca: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
}

/// The URL settings [`KafkaClient`] reads; the others belong to the source or the sink.
pub const CLIENT_SETTINGS: &[&str] = &[
    "sasl_mechanism",
    "sasl_user",
    "sasl_password_env",
    "tls",
    "tls_ca",
    "tls_cert",
    "tls_key",
];

/// A URL split: `kafka://BROKERS/TOPICS?QUERY` with the client's settings read and the
/// others (`key`, `value`) left for the caller, in order.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaUrl {
    pub client: KafkaClient,
    /// The path: the topic names, comma-separated.
    pub topics: Vec<String>,
    /// The URL without secrets or query, for messages and documents' `source`.
    pub shown: String,
    pub others: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl KafkaUrl {
    /// Read `kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC][?settings]`; `env` reads an
    /// environment variable (the password's).
    pub fn parse(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<KafkaUrl, BadKafkaUrl> {
        let redacted = crate::secret::redact_url(url);
        let bad = |why: String| BadKafkaUrl {
            url: redacted.clone(),
            why,
        };
        let (main, query) = url.trim().split_once('?').unwrap_or((url.trim(), ""));
        let rest = main
            .strip_prefix("kafka://")
            .ok_or_else(|| bad("a Kafka topic is kafka://HOST:9092/TOPIC".into()))?;
        let (brokers, path) = rest.split_once('/').unwrap_or((rest, ""));
        if brokers.contains('@') {
            return Err(bad(
                "credentials do not go in the URL: give ?sasl_user=NAME&sasl_password_env=VAR \
                 (the environment variable that holds the password)"
                    .into(),
            ));
        }
        let brokers: Vec<&str> = brokers.split(',').filter(|b| !b.is_empty()).collect();
        if brokers.is_empty() || brokers.iter().any(|b| !valid_broker(b)) {
            return Err(bad(
                "give the brokers as HOST:PORT[,HOST:PORT] after kafka://".into(),
            ));
        }
        let topics: Vec<String> = path
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect();
        if let Some(t) = topics.iter().find(|t| !valid_topic(t)) {
            return Err(bad(format!(
                "`{t}` is not a topic name (letters, digits, `.`, `_`, `-`, at most 249)"
            )));
        }
        let (client, others) = Settings::default().read(query, &brokers, env, &bad)?;
        let shown = format!("kafka://{}/{}", client.brokers, topics.join(","));
        Ok(KafkaUrl {
            client,
            topics,
            shown,
            others,
        })
    }
}

/// The client's settings of a URL's query, as read.
#[derive(Default)]
struct Settings {
    mechanism: Option<Mechanism>,
    user: Option<String>,
    password_env: Option<String>,
    tls: bool,
    tls_ca: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
}

impl Settings {
    /// Read the client's settings of `query` (the others are returned, in order) and make the
    /// client of `brokers`.
    fn read(
        mut self,
        query: &str,
        brokers: &[&str],
        env: &dyn Fn(&str) -> Option<String>,
        bad: &dyn Fn(String) -> BadKafkaUrl,
    ) -> Result<(KafkaClient, Vec<(String, String)>), BadKafkaUrl> {
        let mut others = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value);
            if !self.setting(key, &value, bad)? {
                others.push((key.to_string(), value));
            }
        }
        let client = self.client(brokers, env, bad)?;
        Ok((client, others))
    }

    /// One `key=value`: false when it is not the client's.
    fn setting(
        &mut self,
        key: &str,
        value: &str,
        bad: &dyn Fn(String) -> BadKafkaUrl,
    ) -> Result<bool, BadKafkaUrl> {
        match key {
            "sasl_mechanism" => {
                self.mechanism = Some(match value.to_ascii_uppercase().as_str() {
                    "PLAIN" => Mechanism::Plain,
                    "SCRAM-SHA-256" => Mechanism::ScramSha256,
                    "SCRAM-SHA-512" => Mechanism::ScramSha512,
                    _ => {
                        return Err(bad(format!(
                            "sasl_mechanism `{value}`: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
                        )))
                    }
                })
            }
            "sasl_user" => self.user = Some(value.to_string()),
            "sasl_password_env" => self.password_env = Some(value.to_string()),
            "tls" => {
                self.tls = match value {
                    "" | "true" | "1" | "on" => true,
                    "false" | "0" | "off" => false,
                    _ => return Err(bad(format!("tls=`{value}`: use tls=true or tls=false"))),
                }
            }
            "tls_ca" => self.tls_ca = Some(value.to_string()),
            "tls_cert" => self.tls_cert = Some(value.to_string()),
            "tls_key" => self.tls_key = Some(value.to_string()),
            "sasl_password" | "password" => {
                return Err(bad(
                    "the password does not go in the URL: put it in an environment variable and \
                     name it with sasl_password_env=VAR"
                        .into(),
                ))
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The client, its settings checked together: SASL's password read from the environment,
    /// and kept off the network unless it is encrypted or stays on this machine.
    fn client(
        self,
        brokers: &[&str],
        env: &dyn Fn(&str) -> Option<String>,
        bad: &dyn Fn(String) -> BadKafkaUrl,
    ) -> Result<KafkaClient, BadKafkaUrl> {
        let tls = self.tls || self.tls_ca.is_some() || self.tls_cert.is_some();
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(bad(
                "a client certificate needs both tls_cert=PATH and tls_key=PATH".into(),
            ));
        }
        let sasl = match (self.user, self.password_env) {
            (None, None) => None,
            (Some(user), Some(var)) => {
                let password = env(&var).filter(|p| !p.is_empty()).ok_or_else(|| {
                    bad(format!(
                        "sasl_password_env={var}: the environment variable `{var}` is not set; \
                         export it with the password of `{user}`"
                    ))
                })?;
                Some(Sasl {
                    mechanism: self.mechanism.unwrap_or(Mechanism::ScramSha512),
                    user,
                    password: Secret::new(password),
                })
            }
            _ => {
                return Err(bad(
                    "SASL needs both sasl_user=NAME and sasl_password_env=VAR".into(),
                ))
            }
        };
        if sasl.is_some() && !tls && !brokers.iter().all(|b| is_loopback(b)) {
            return Err(bad(
                "SASL credentials travel only over TLS to a broker on another machine: add \
                 tls=true (and tls_ca=PATH for a private CA)"
                    .into(),
            ));
        }
        Ok(KafkaClient {
            brokers: brokers.join(","),
            sasl,
            tls,
            tls_ca: self.tls_ca,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
        })
    }
}

impl KafkaClient {
    /// librdkafka's configuration for this client (the caller adds its role's settings).
    pub fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "ragline")
            .set("socket.keepalive.enable", "true")
            .set_log_level(RDKafkaLogLevel::Warning);
        let protocol = match (self.sasl.is_some(), self.tls) {
            (false, false) => "plaintext",
            (false, true) => "ssl",
            (true, false) => "sasl_plaintext",
            (true, true) => "sasl_ssl",
        };
        c.set("security.protocol", protocol);
        if let Some(s) = &self.sasl {
            c.set("sasl.mechanism", s.mechanism.name())
                .set("sasl.username", &s.user)
                .set("sasl.password", s.password.expose());
        }
        if let Some(ca) = &self.tls_ca {
            c.set("ssl.ca.location", ca);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            c.set("ssl.certificate.location", cert)
                .set("ssl.key.location", key);
        }
        c
    }
}

/// The client's context: librdkafka's logs through `tracing`, and the last error it reported
/// (an authentication that failed...), kept for the message of a run that cannot start.
#[derive(Clone, Default)]
pub struct Context {
    last_error: Arc<Mutex<Option<String>>>,
}

impl Context {
    /// What librdkafka last said went wrong, if anything.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `error` with what librdkafka said went wrong, when it said something: the reason of a
    /// failed authentication rather than a timeout.
    pub fn explain(&self, error: &dyn std::fmt::Display) -> String {
        match self.last_error() {
            Some(said) => format!("{error} ({said})"),
            None => error.to_string(),
        }
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", "{fac}: {message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", "{fac}: {message}"),
            _ => tracing::debug!(target: "librdkafka", "{fac}: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(target: "librdkafka", "{error}: {reason}");
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
    }
}

impl ConsumerContext for Context {}

/// How long a client waits for the brokers' first answer (metadata) before a run gives up.
pub const CONNECT_WAIT: Duration = Duration::from_secs(15);

/// `ask` again while the brokers answer that they are not ready yet (a group coordinator still
/// loading, a leader being elected), for up to [`CONNECT_WAIT`].
pub fn when_ready<T>(
    mut ask: impl FnMut() -> rdkafka::error::KafkaResult<T>,
) -> rdkafka::error::KafkaResult<T> {
    use rdkafka::types::RDKafkaErrorCode as Code;
    let deadline = std::time::Instant::now() + CONNECT_WAIT;
    loop {
        match ask() {
            Err(e)
                if std::time::Instant::now() < deadline
                    && matches!(
                        e.rdkafka_error_code(),
                        Some(
                            Code::NotCoordinator
                                | Code::CoordinatorLoadInProgress
                                | Code::CoordinatorNotAvailable
                                | Code::LeaderNotAvailable
                                | Code::NotLeaderForPartition
                                | Code::RequestTimedOut
                        )
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

fn valid_broker(b: &str) -> bool {
    match b.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && port.parse::<u16>().is_ok_and(|p| p > 0)
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
        }
        None => false,
    }
}

/// Kafka's own rule for topic names.
pub fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn is_loopback(broker: &str) -> bool {
    let host = broker.rsplit_once(':').map_or(broker, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `%XX` escapes of a query value decoded (a path with spaces, `%2C` for a comma).
fn percent_decode(value: &str) -> String {
    url::form_urlencoded::parse(format!("v={value}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(var: &str) -> Option<String> {
        (var == "KPW").then(|| "s3cret".to_string())
    }

    #[test]
    fn reads_brokers_topics_and_credentials() {
        let u = KafkaUrl::parse(
            "kafka://127.0.0.1:9092,127.0.0.1:9093/docs,news?group=g&sasl_user=alice&sasl_password_env=KPW&sasl_mechanism=scram-sha-256",
            &env,
        )
        .unwrap();
        assert_eq!(u.client.brokers, "127.0.0.1:9092,127.0.0.1:9093");
        assert_eq!(u.topics, ["docs", "news"]);
        assert_eq!(u.others, [("group".to_string(), "g".to_string())]);
        let c = u.client.config();
        assert_eq!(c.get("security.protocol"), Some("sasl_plaintext"));
        assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
        assert_eq!(c.get("sasl.password"), Some("s3cret"));
        assert!(!format!("{:?}", u.client).contains("s3cret"));
        assert!(!u.shown.contains("s3cret"));
    }

    #[test]
    fn refuses_what_cannot_work_or_leaks() {
        for (url, says) in [
            (
                "kafka://h:1/t?sasl_user=a&sasl_password_env=NOPE&tls=true",
                "not set",
            ),
            ("kafka://u:p@h:1/t", "credentials do not go in the URL"),
            ("kafka://h:1/t?sasl_password=x", "environment variable"),
            (
                "kafka://example.com:9092/t?sasl_user=a&sasl_password_env=KPW",
                "only over TLS",
            ),
            ("kafka://h/t", "HOST:PORT"),
            ("kafka://h:1/a b", "not a topic name"),
            ("kafka://h:1/t?tls_cert=/c", "both tls_cert"),
            ("kafka://h:1/t?sasl_user=a", "both sasl_user"),
        ] {
            let e = KafkaUrl::parse(url, &env)
                .err()
                .unwrap_or_else(|| panic!("{url}"));
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        // TLS with a CA: SASL may go to another machine.
        let u = KafkaUrl::parse(
            "kafka://example.com:9093/t?sasl_user=a&sasl_password_env=KPW&tls_ca=/ca.crt",
            &env,
        )
        .unwrap();
        assert_eq!(u.client.config().get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(u.client.config().get("ssl.ca.location"), Some("/ca.crt"));
    }
}
