//! Queues on NATS JetStream, for runs whose stages are separate processes on any number of
//! machines (`ragline worker`, `embedder`, `indexer` and the publishing `ingest --queue`).
//!
//! Layout, under a prefix (`ragline` unless the URL says `?prefix=`):
//! - one stream per queue, `<PREFIX>_WORK`, `_EMBED`, `_INDEX`, `_EVENTS`, with work-queue
//!   retention (a message is gone once acknowledged), file storage, and limits in messages and
//!   bytes with new messages refused when full: a full stream makes its producers wait, so a slow
//!   indexer slows the connector and no process buffers without bound;
//! - a subject per run in each (`<prefix>.work.<run>`), and one durable pull consumer per run
//!   and queue (`work-<run>`), shared by every process of that role;
//! - a key-value bucket `<PREFIX>_RUNS` with each run's settings and state, so a process
//!   needs nothing but the queue URL.
//!
//! Delivery is at least once. What a process publishes goes through one ordered output task
//! per connection: a message's acknowledgement is sent only after every publish issued before
//! it was confirmed by the stream (publish acks), so an item is never acknowledged before its
//! outputs are stored; publishes are pipelined, not awaited one by one. A publish that fails
//! (stream full, no leader during a failover, server restarting) is retried until it is
//! stored. Messages a process holds get in-progress acknowledgements (every third of the
//! consumer's `AckWait`), so a long batch keeps its lease while a killed process loses its
//! messages to the others after `AckWait`; after `MaxDeliver` deliveries the server gives up
//! and says so in an advisory, which the run's publisher turns into a FAIL.
//!
//! Publishes to one subject that wait behind each other in the output task go out as one
//! message carrying them all (up to 256 items or 256 KiB): under load a document costs a
//! fraction of a message instead of three, so the broker stops being the bottleneck. A
//! consumer hands out the items one by one and acknowledges the message when every item of it
//! is acknowledged. A batch delivered a second time (a process died holding it) is split: each
//! item is published alone (marked redelivered) and the batch acknowledged after them, so an
//! item that kills its consumer reaches MaxDeliver alone, never taking its neighbours with it.

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_nats::ServerAddr;
use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, Sender};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

pub mod lifecycle;

use super::wire::Wire;
use super::{Delivery, DeliveryTag, PushError, Queue, QueueError};
use crate::document::RunId;
use crate::event::{Event, EventKind};
use crate::secret::Secret;

/// What the broker client reports, by kind; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A `--queue` URL (or a file it names) that cannot be used.
    #[error("{0}")]
    Config(String),
    /// No server answered in time, or it refused this process (credentials, TLS).
    #[error("{0}")]
    Connect(String),
    /// A JetStream call that failed after its retries: what was being done, and why.
    #[error("NATS: {what}: {reason}")]
    Api { what: String, reason: String },
    /// Bytes from the broker that are not a message ragline sent (framing, a run record).
    #[error("{0}")]
    Message(String),
}

impl BrokerError {
    fn api(what: impl Into<String>, reason: impl std::fmt::Display) -> BrokerError {
        BrokerError::Api {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

/// The format of the messages (`queue::wire`); a process reading another refuses the run.
pub const WIRE_VERSION: u32 = 3;

/// Bytes of a message that are not the item's own (its fields' names, ids, the batch
/// envelope), kept free under the server's largest message.
const ENVELOPE_ROOM: usize = 16 << 10;
/// Publishes in flight (sent, not yet confirmed) per connection, at most, and their bytes.
const PUBLISH_WINDOW: usize = 4096;
const IN_FLIGHT_BYTES: usize = 32 << 20;
/// Outgoing messages waiting for the output task, at most.
const OUTGOING: usize = 1024;
/// Items one message carries at most when publishes are coalesced, and its bytes (well under
/// the server's largest message, 1 MiB by default: a message over it is refused every time).
const COALESCE_ITEMS: usize = 256;
const COALESCE_BYTES: usize = 256 << 10;
/// The first byte of a message that carries items in the batch envelope: 0xC1 is never the
/// first byte of MessagePack, which is what a single item is.
const BATCH_MAGIC: u8 = 0xC1;
/// Envelope flag: the items were delivered before, inside a batch that was split.
const FLAG_REDELIVERED: u8 = 1;

/// Items in the batch envelope: the magic byte, flags, the count (u32 LE), then each item's
/// length (u32 LE) and bytes.
pub(crate) fn encode_batch(items: &[Bytes], flags: u8) -> Bytes {
    let size = 6 + items.iter().map(|i| 4 + i.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(BATCH_MAGIC);
    out.push(flags);
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    Bytes::from(out)
}

/// The items of a message and its envelope's flags (a plain message is one item, flags 0).
/// The bytes come from the broker, so they are untrusted: nothing is allocated beyond what
/// they hold (a count of 4 billion items in a 6-byte message is an error, not 137 GB).
pub fn split_message(payload: &Bytes) -> Result<(Vec<Bytes>, u8), BrokerError> {
    if payload.first() != Some(&BATCH_MAGIC) {
        return Ok((vec![payload.clone()], 0));
    }
    let bad = |why: String| BrokerError::Message(format!("a batch envelope {why}"));
    let flags = *payload
        .get(1)
        .ok_or_else(|| bad("cut short in its header".into()))?;
    let count = u32::from_le_bytes(
        payload
            .get(2..6)
            .ok_or_else(|| bad("cut short in its header".into()))?
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    // Every item takes at least its 4-byte length.
    let room = (payload.len() - 6) / 4;
    if count > room {
        return Err(bad(format!(
            "says it holds {count} items but has room for at most {room}"
        )));
    }
    let mut at = 6usize;
    let mut items = Vec::with_capacity(count);
    for i in 0..count {
        let len = payload
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| bad(format!("cut short before item {i} of {count}")))?;
        at += 4;
        let end = at
            .checked_add(len)
            .filter(|&end| end <= payload.len())
            .ok_or_else(|| bad(format!("cut short in item {i} of {count}")))?;
        items.push(payload.slice(at..end));
        at = end;
    }
    if at != payload.len() {
        return Err(bad(format!(
            "has {} bytes after its {count} items",
            payload.len() - at
        )));
    }
    Ok((items, flags))
}

/// The event that dead-letters a message no process can read: the run's publisher counts it
/// and reports it with `reason`. `at` names the message (its subject and stream sequence).
fn unreadable(
    run: RunId,
    lane: Lane,
    at: String,
    reason: &dyn std::fmt::Display,
    payload: &[u8],
) -> Event {
    let head: Vec<String> = payload
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    Event {
        run_id: run,
        instance: 0,
        doc_id: at,
        parent_instance: None,
        parent_id: None,
        children: 0,
        kind: EventKind::Unreadable {
            lane: lane.name().to_string(),
            reason: format!(
                "unreadable message ({reason}; {} bytes, starting {}): dead-lettered; if no \
                 process of this run published it, find who can publish to the broker",
                payload.len(),
                head.join(" ")
            ),
        },
        redelivered: false,
        tokens: 0,
    }
}

/// The four queues of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    Work,
    Embed,
    Index,
    Events,
}

impl Lane {
    pub const ALL: [Lane; 4] = [Lane::Work, Lane::Embed, Lane::Index, Lane::Events];

    pub fn name(self) -> &'static str {
        match self {
            Lane::Work => "work",
            Lane::Embed => "embed",
            Lane::Index => "index",
            Lane::Events => "events",
        }
    }
}

/// Where the broker is and how a run's streams are set up: `nats://HOST:PORT[,nats://...]`
/// with `?prefix=NAME` (streams, subjects and bucket names), `replicas=N` (stream replicas
/// in a cluster), `ack_wait=SECONDS`, `max_deliver=N`, `max_pending=N` (messages one consumer
/// may hold unacknowledged), `limit=N` and `limit_mb=N` (messages and MiB a stream holds
/// before producers wait) and `max_hold=SECONDS` (how long a process may keep one item alive
/// with in-progress acks).
///
/// A secured broker: `nats://USER:PASS@HOST:PORT` (user and password), `nats://TOKEN@HOST`
/// (a token), `?creds=PATH` (a NATS credentials file: JWT and nkey seed); `tls://HOST:PORT` or
/// `?tls=true` (TLS required), `?tls_ca=PATH` (the CA that signed the server's certificate),
/// `?tls_cert=PATH&tls_key=PATH` (a client certificate). The credentials are held as
/// [`Secret`]s and left out of every message ([`BrokerConfig::describe`]).
#[derive(Clone, Debug, PartialEq)]
pub struct BrokerConfig {
    /// The servers' addresses, without credentials.
    pub servers: Vec<String>,
    /// How this process proves who it is.
    pub auth: NatsAuth,
    /// TLS required for every server.
    pub tls: bool,
    /// The CA certificate (PEM) the server's certificate is checked against.
    pub tls_ca: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for servers that verify clients.
    pub tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub prefix: String,
    pub replicas: usize,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    pub max_pending: i64,
    pub limit: i64,
    /// MiB a stream holds before producers wait (a message may carry many items).
    pub limit_mb: i64,
    /// How long a process keeps one item with in-progress acknowledgements, at most.
    pub max_hold: Duration,
}

/// How a process authenticates to NATS.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A credentials file (`.creds`: a user JWT and its nkey seed).
    Creds(std::path::PathBuf),
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            servers: vec!["nats://127.0.0.1:4222".into()],
            auth: NatsAuth::None,
            tls: false,
            tls_ca: None,
            tls_client: None,
            prefix: "ragline".into(),
            replicas: 1,
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            max_pending: 4096,
            limit: 20_000,
            limit_mb: 256,
            max_hold: Duration::from_secs(600),
        }
    }
}

impl BrokerConfig {
    pub fn parse(url: &str) -> Result<Self, BrokerError> {
        Self::parse_config(url)
    }

    fn parse_config(url: &str) -> Result<Self, BrokerError> {
        let mut config = BrokerConfig::default();
        // Messages show the URL without its secrets.
        let shown = crate::secret::redact_url(url);
        let url = url.trim();
        let (servers, query) = url.split_once('?').unwrap_or((url, ""));
        config.parse_servers(servers, &shown)?;
        let mut client = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            config.set(key, value, &shown, &mut client)?;
        }
        match client {
            (Some(c), Some(k)) => {
                config.tls_client = Some((c, k));
                config.tls = true;
            }
            (None, None) => {}
            _ => {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: a client certificate needs both tls_cert= and tls_key="
                )))
            }
        }
        Ok(config)
    }

    /// The servers of a URL (`nats://` or `tls://`, comma-separated) and the one identity
    /// the cluster is given (every server names the same, or only some do).
    fn parse_servers(&mut self, servers: &str, shown: &str) -> Result<(), BrokerError> {
        let mut auths = Vec::new();
        let mut addresses = Vec::new();
        for s in servers.split(',').filter(|s| !s.is_empty()) {
            let safe = crate::secret::redact_url(s);
            let Some((scheme, rest)) = s
                .split_once("://")
                .filter(|(scheme, _)| *scheme == "nats" || *scheme == "tls")
            else {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: `{safe}` is not a nats:// address (nats://HOST:PORT, \
                     or tls://HOST:PORT for TLS)"
                )));
            };
            self.tls |= scheme == "tls";
            let (auth, host) = match rest.rsplit_once('@') {
                Some((userinfo, host)) => (userinfo_auth(userinfo), host),
                None => (NatsAuth::None, rest),
            };
            let address = format!("{scheme}://{host}");
            ServerAddr::from_str(&address)
                .map_err(|e| BrokerError::Config(format!("queue URL `{shown}`: `{safe}`: {e}")))?;
            auths.push(auth);
            addresses.push(address);
        }
        self.servers = addresses;
        if self.servers.is_empty() {
            return Err(BrokerError::Config(format!(
                "queue URL `{shown}` names no server (nats://HOST:PORT)"
            )));
        }
        let named: Vec<&NatsAuth> = auths.iter().filter(|a| **a != NatsAuth::None).collect();
        if named.windows(2).any(|w| w[0] != w[1]) {
            return Err(BrokerError::Config(format!(
                "queue URL `{shown}`: the servers name different credentials; give one user \
                 (or token) for the cluster"
            )));
        }
        self.auth = named.first().map_or(NatsAuth::None, |a| (*a).clone());
        Ok(())
    }

    /// One `key=value` setting of the URL's query (`client`: the client certificate and key
    /// files, which come as two settings).
    fn set(
        &mut self,
        key: &str,
        value: &str,
        shown: &str,
        client: &mut (Option<std::path::PathBuf>, Option<std::path::PathBuf>),
    ) -> Result<(), BrokerError> {
        let number = |what: &str| -> Result<i64, BrokerError> {
            value.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                BrokerError::Config(format!(
                    "queue URL `{shown}`: `{key}={value}` must be a positive {what}"
                ))
            })
        };
        let path = || -> Result<std::path::PathBuf, BrokerError> {
            if value.is_empty() {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: `{key}=` needs a file's path"
                )));
            }
            Ok(std::path::PathBuf::from(value))
        };
        let seconds = || number("number of seconds").map(|n| Duration::from_secs(n as u64));
        match key {
            "creds" => {
                if self.auth != NatsAuth::None {
                    return Err(BrokerError::Config(format!(
                        "queue URL `{shown}`: give either credentials in the address or \
                         ?creds=, not both"
                    )));
                }
                self.auth = NatsAuth::Creds(path()?);
            }
            "tls" => match value {
                "true" | "1" | "yes" => self.tls = true,
                "false" | "0" | "no" => {}
                _ => {
                    return Err(BrokerError::Config(format!(
                        "queue URL `{shown}`: `tls={value}` must be true or false"
                    )))
                }
            },
            "tls_ca" => {
                self.tls_ca = Some(path()?);
                self.tls = true;
            }
            "tls_cert" => client.0 = Some(path()?),
            "tls_key" => client.1 = Some(path()?),
            "prefix" => {
                if value.is_empty()
                    || !value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    return Err(BrokerError::Config(format!(
                        "queue URL `{shown}`: prefix `{value}` must be letters, digits, - or _"
                    )));
                }
                self.prefix = value.to_string();
            }
            "replicas" => self.replicas = number("number")? as usize,
            "ack_wait" => self.ack_wait = seconds()?,
            "max_deliver" => self.max_deliver = number("number")?,
            "max_pending" => self.max_pending = number("number")?,
            "limit" => self.limit = number("number")?,
            "limit_mb" => self.limit_mb = number("number of MiB")?,
            "max_hold" => self.max_hold = seconds()?,
            _ => {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: unknown setting `{key}` (prefix, replicas, ack_wait, \
                     max_deliver, max_pending, limit, limit_mb, max_hold, creds, tls, tls_ca, \
                     tls_cert, tls_key)"
                )))
            }
        }
        Ok(())
    }

    pub fn stream(&self, lane: Lane) -> String {
        format!(
            "{}_{}",
            self.prefix.to_uppercase(),
            lane.name().to_uppercase()
        )
    }

    pub fn subject(&self, lane: Lane, run: RunId) -> String {
        format!("{}.{}.{run}", self.prefix, lane.name())
    }

    pub fn consumer(&self, lane: Lane, run: RunId) -> String {
        format!("{}-{run}", lane.name())
    }

    fn bucket(&self) -> String {
        format!("{}_RUNS", self.prefix.to_uppercase())
    }

    /// The bucket where role processes say what they make of each run ([`RoleNote`]).
    fn roles_bucket(&self) -> String {
        format!("{}_ROLES", self.prefix.to_uppercase())
    }

    /// The URL without settings or credentials, for messages.
    pub fn describe(&self) -> String {
        self.servers.join(",")
    }
}

/// The client's options for `config`: identity, TLS, and reconnecting for as long as the
/// process runs.
async fn connect_options(config: &BrokerConfig) -> Result<async_nats::ConnectOptions, BrokerError> {
    let mut options = match &config.auth {
        NatsAuth::None => async_nats::ConnectOptions::new(),
        NatsAuth::UserPassword { user, password } => async_nats::ConnectOptions::new()
            .user_and_password(user.clone(), password.expose().to_string()),
        NatsAuth::Token(token) => {
            async_nats::ConnectOptions::new().token(token.expose().to_string())
        }
        NatsAuth::Creds(path) => async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| {
                BrokerError::Config(format!(
                    "cannot read the NATS credentials file {} (?creds=): {e}",
                    path.display()
                ))
            })?,
    };
    options = options
        .name("ragline")
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2));
    if config.tls {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.tls_ca {
        if !ca.is_file() {
            return Err(BrokerError::Config(format!(
                "the CA certificate {} (?tls_ca=) is not a readable file",
                ca.display()
            )));
        }
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &config.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// A client connected to one of `config`'s servers, trying until one answers or `wait` passes
/// (it may be starting); a server that answers and refuses the credentials or the TLS
/// handshake is an error at once, said plainly. The connection reconnects by itself for as
/// long as the process runs.
pub(crate) async fn connect_client(
    config: &BrokerConfig,
    wait: Duration,
) -> Result<async_nats::Client, BrokerError> {
    let addrs: Vec<ServerAddr> = config
        .servers
        .iter()
        .map(|s| ServerAddr::from_str(s).expect("checked by BrokerConfig::parse"))
        .collect();
    let described = config.describe();
    // Try until the server answers or `wait` passes (it may be starting); a server
    // that answers and refuses the credentials or the TLS handshake is an error at
    // once, said plainly.
    let deadline = Instant::now() + wait;
    let mut last = String::from("no answer");
    loop {
        let options = connect_options(config).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, options.connect(addrs.clone())).await {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(e)) => {
                use async_nats::ConnectErrorKind as K;
                match e.kind() {
                    K::AuthorizationViolation | K::Authentication => {
                        return Err(BrokerError::Connect(format!(
                            "the NATS server at {described} refused this process's \
                                 credentials ({e}): check the user and password or token \
                                 in --queue (nats://USER:PASS@HOST:PORT, nats://TOKEN@HOST) \
                                 or the ?creds= file"
                        )))
                    }
                    _ if tls_failure(&e) => {
                        return Err(BrokerError::Connect(format!(
                            "TLS with the NATS server at {described} failed ({}): \
                                 check ?tls_ca= (the CA that signed the server's \
                                 certificate) and that the address is the name in it",
                            root_cause(&e)
                        )))
                    }
                    _ => last = root_cause(&e),
                }
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(BrokerError::Connect(format!(
                "cannot reach the NATS server at {described} within {}s ({last}): is \
                     it running (`scripts/nats.sh start`), and is the address right?",
                wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A TLS handshake that failed (a certificate not trusted, a name that does not match):
/// the server answered, so waiting longer cannot help.
fn tls_failure(e: &async_nats::ConnectError) -> bool {
    if e.kind() == async_nats::ConnectErrorKind::Tls {
        return true;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return true;
            }
        }
        let text = err.to_string();
        if text.contains("certificate") || text.contains("handshake") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The innermost error's message.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// What the userinfo of a server address says: `USER:PASS` or a token.
fn userinfo_auth(userinfo: &str) -> NatsAuth {
    match userinfo.split_once(':') {
        Some((user, password)) => NatsAuth::UserPassword {
            user: percent_decode(user),
            password: Secret::new(percent_decode(password)),
        },
        None => NatsAuth::Token(Secret::new(percent_decode(userinfo))),
    }
}

/// `%XX` escapes decoded (a password with `@` or `:` is written `%40`, `%3A`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).expect("hex") * 16 + hex(l).expect("hex")) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the runs bucket holds for a run: everything a worker, embedder or indexer needs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    pub run: String,
    /// The message format ([`WIRE_VERSION`]): processes of another format refuse the run.
    pub wire: u32,
    /// The ragline version that published the run.
    pub version: String,
    pub state: RunState,
    /// The run's pipeline settings (`ragline.toml` form, flags applied).
    pub config: String,
    /// The model the run embeds with, when it chunks: its fingerprint and dimension.
    pub model_fingerprint: Option<String>,
    pub dimension: Option<usize>,
    /// Whether chunks go through the embedders (false: deferred, or no model).
    pub embeds: bool,
    /// Unix seconds.
    pub started: u64,
}

/// What a role process made of a run: it joined it, refused it (its setup failed: the
/// reason), or left it (its loops stopped on an error: the reason). The publishing process
/// reads them to say why a run is not moving.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RoleNote {
    pub run: String,
    /// `worker`, `embedder`, `indexer`.
    pub role: String,
    /// `HOST:PID`.
    pub process: String,
    pub state: RoleState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RoleState {
    Joined,
    Refused,
    Left,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Complete,
    Aborted,
}

/// What the output task waits on, in order: a reply to send when its turn comes, and the bytes
/// of a publish that it held.
type Ordered = Pin<Box<dyn Future<Output = (Option<(jetstream::Message, AckKind)>, usize)> + Send>>;

enum Outgoing {
    /// Coalesced with the publishes to the same subject that wait behind it.
    Publish {
        subject: String,
        payload: Bytes,
    },
    /// Published as it is (an item split out of a redelivered batch).
    PublishAlone {
        subject: String,
        payload: Bytes,
    },
    Ack(Box<jetstream::Message>, AckKind),
    /// Answered when everything before it is done.
    Flush(Sender<()>),
}

/// A connection to the broker, shared by the queues of a process (cheap to clone).
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    config: BrokerConfig,
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    js: jetstream::Context,
    outgoing: tokio::sync::mpsc::Sender<Outgoing>,
    closed: AtomicBool,
    tags_arc: Arc<AtomicU64>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

fn backend(queue: &'static str, e: impl std::fmt::Display) -> QueueError {
    QueueError::Backend {
        queue,
        message: e.to_string(),
    }
}

impl Broker {
    /// Connect, waiting up to `wait` for a server to answer, and make sure the streams and the
    /// runs bucket exist. The connection reconnects by itself for as long as the process runs.
    pub fn connect(config: BrokerConfig, wait: Duration) -> Result<Broker, BrokerError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nats")
            .enable_all()
            .build()
            .map_err(|e| BrokerError::Connect(format!("cannot start the broker client: {e}")))?;
        let client = rt.block_on(connect_client(&config, wait))?;
        let _in_runtime = rt.enter();
        let js = jetstream::new(client.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(OUTGOING);
        rt.spawn(output(js.clone(), rx));
        let broker = Broker {
            inner: Arc::new(Inner {
                config,
                rt,
                client,
                js,
                outgoing: tx,
                closed: AtomicBool::new(false),
                tags_arc: Arc::new(AtomicU64::new(1)),
            }),
        };
        broker.ensure_streams()?;
        Ok(broker)
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.inner.rt.block_on(f)
    }

    /// Retry a JetStream API call while the cluster has no leader or the server restarts.
    fn retrying<T, E: std::fmt::Display, Fut: Future<Output = Result<T, E>>>(
        &self,
        what: &str,
        mut call: impl FnMut() -> Fut,
    ) -> Result<T, BrokerError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        self.block_on(async {
            loop {
                match call().await {
                    Ok(v) => return Ok(v),
                    Err(e) if Instant::now() < deadline => {
                        let _ = &e;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(BrokerError::api(what, e)),
                }
            }
        })
    }

    fn ensure_streams(&self) -> Result<(), BrokerError> {
        let c = &self.inner.config;
        for lane in Lane::ALL {
            let config = stream::Config {
                name: c.stream(lane),
                subjects: vec![format!("{}.{}.*", c.prefix, lane.name())],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::New,
                max_messages: match lane {
                    Lane::Events => c.limit * 8,
                    _ => c.limit,
                },
                max_bytes: c.limit_mb.saturating_mul(1 << 20),
                num_replicas: c.replicas,
                ..Default::default()
            };
            let js = self.inner.js.clone();
            self.retrying(&format!("creating stream {}", config.name), || {
                let (js, config) = (js.clone(), config.clone());
                async move { js.get_or_create_stream(config).await }
            })?;
        }
        let replicas = c.replicas;
        for (bucket, what, max_age) in [
            (c.bucket(), "creating the runs bucket", Duration::ZERO),
            // Notes of roles are read while their run lasts: a day is plenty.
            (
                c.roles_bucket(),
                "creating the roles bucket",
                Duration::from_secs(86_400),
            ),
        ] {
            let js = self.inner.js.clone();
            self.retrying(what, || {
                let (js, bucket) = (js.clone(), bucket.clone());
                async move {
                    match js.get_key_value(&bucket).await {
                        Ok(kv) => Ok(kv),
                        Err(_) => {
                            js.create_key_value(jetstream::kv::Config {
                                bucket,
                                history: 1,
                                storage: stream::StorageType::File,
                                num_replicas: replicas,
                                max_age,
                                ..Default::default()
                            })
                            .await
                        }
                    }
                }
            })?;
        }
        Ok(())
    }

    fn roles(&self) -> Result<jetstream::kv::Store, BrokerError> {
        let js = self.inner.js.clone();
        let bucket = self.inner.config.roles_bucket();
        self.retrying("opening the roles bucket", || {
            let (js, bucket) = (js.clone(), bucket.clone());
            async move { js.get_key_value(bucket).await }
        })
    }

    /// Say what this role process made of a run (the publisher reads it).
    pub fn put_role_note(&self, note: &RoleNote) -> Result<(), BrokerError> {
        let kv = self.roles()?;
        let bytes = Bytes::from(serde_json::to_vec(note).expect("a note encodes"));
        // Keys are tokens of letters, digits, `-` and `_` joined by dots.
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        let key = format!(
            "{}.{}.{}",
            clean(&note.run),
            clean(&note.role),
            clean(&note.process)
        );
        self.retrying("recording the role's note", || {
            let (kv, key, bytes) = (kv.clone(), key.clone(), bytes.clone());
            async move { kv.put(key, bytes).await }
        })?;
        Ok(())
    }

    /// What the role processes made of `run` so far, one note a process (its latest).
    pub fn role_notes(&self, run: &str) -> Result<Vec<RoleNote>, BrokerError> {
        let kv = self.roles()?;
        let prefix = format!("{run}.");
        let keys = self.keys(&kv, "listing the roles' notes")?;
        let mut notes = Vec::new();
        for key in keys.into_iter().filter(|k| k.starts_with(&prefix)) {
            let got = self.retrying("reading a role's note", || {
                let (kv, key) = (kv.clone(), key.clone());
                async move { kv.get(key).await }
            })?;
            // A note this version cannot read is another version's: left out.
            if let Some(note) = got.and_then(|b| serde_json::from_slice::<RoleNote>(&b).ok()) {
                notes.push(note);
            }
        }
        Ok(notes)
    }

    fn runs(&self) -> Result<jetstream::kv::Store, BrokerError> {
        let js = self.inner.js.clone();
        let bucket = self.inner.config.bucket();
        self.retrying("opening the runs bucket", || {
            let (js, bucket) = (js.clone(), bucket.clone());
            async move { js.get_key_value(bucket).await }
        })
    }

    /// Record a run (its settings and state) for the other processes.
    pub fn put_run(&self, record: &RunRecord) -> Result<(), BrokerError> {
        let kv = self.runs()?;
        let bytes = Bytes::from(serde_json::to_vec(record).expect("a record encodes"));
        let key = record.run.clone();
        self.retrying("recording the run", || {
            let (kv, key, bytes) = (kv.clone(), key.clone(), bytes.clone());
            async move { kv.put(key, bytes).await }
        })?;
        Ok(())
    }

    pub fn get_run(&self, run: &str) -> Result<Option<RunRecord>, BrokerError> {
        let kv = self.runs()?;
        let bytes = self.retrying("reading the run", || {
            let (kv, key) = (kv.clone(), run.to_string());
            async move { kv.get(key).await }
        })?;
        bytes
            .map(|b| {
                serde_json::from_slice(&b)
                    .map_err(|e| BrokerError::Message(format!("run {run}: unreadable record: {e}")))
            })
            .transpose()
    }

    /// Every key of the bucket `kv` (`what`: for the error).
    fn keys(&self, kv: &jetstream::kv::Store, what: &str) -> Result<Vec<String>, BrokerError> {
        self.retrying(what, || {
            let kv = kv.clone();
            async move {
                match kv.keys().await {
                    Ok(keys) => Ok(keys.filter_map(|k| async { k.ok() }).collect().await),
                    Err(e) => Err(e),
                }
            }
        })
    }

    /// The runs recorded, oldest first.
    pub fn list_runs(&self) -> Result<Vec<RunRecord>, BrokerError> {
        let keys = self.keys(&self.runs()?, "listing runs")?;
        let mut runs = Vec::new();
        for key in keys {
            if let Some(r) = self.get_run(&key)? {
                runs.push(r);
            }
        }
        runs.sort_by_key(|r| (r.started, r.run.clone()));
        Ok(runs)
    }

    /// Create the run's consumers (durable pull, explicit ack, the URL's AckWait, MaxDeliver
    /// and max_ack_pending).
    pub fn create_consumers(&self, run: RunId) -> Result<(), BrokerError> {
        let c = self.inner.config.clone();
        for lane in Lane::ALL {
            let name = c.consumer(lane, run);
            let config = consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: c.subject(lane, run),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: c.ack_wait,
                max_deliver: c.max_deliver,
                max_ack_pending: c.max_pending,
                num_replicas: c.replicas,
                ..Default::default()
            };
            let js = self.inner.js.clone();
            let stream = c.stream(lane);
            self.retrying(&format!("creating consumer {name}"), || {
                let (js, stream, config, name) =
                    (js.clone(), stream.clone(), config.clone(), name.clone());
                async move {
                    let stream = js.get_stream(stream).await.map_err(|e| e.to_string())?;
                    stream
                        .get_or_create_consumer(&name, config)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            })?;
        }
        Ok(())
    }

    /// Remove what is left of a finished run on the broker: its consumers and any message
    /// still on its subjects (duplicates of work already done).
    pub fn remove_run(&self, run: RunId) -> Result<(), BrokerError> {
        let c = self.inner.config.clone();
        for lane in Lane::ALL {
            let js = self.inner.js.clone();
            let (stream, name, subject) =
                (c.stream(lane), c.consumer(lane, run), c.subject(lane, run));
            self.retrying("removing the run's consumers", || {
                let (js, stream, name, subject) =
                    (js.clone(), stream.clone(), name.clone(), subject.clone());
                async move {
                    let stream = js.get_stream(stream).await.map_err(|e| e.to_string())?;
                    let _ = stream.delete_consumer(&name).await;
                    stream
                        .purge()
                        .filter(subject)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            })?;
        }
        Ok(())
    }

    /// A queue of the run on `lane`, for pushing and (with `consume`) popping.
    pub fn queue<T: Wire + 'static>(
        &self,
        lane: Lane,
        run: RunId,
        consume: Option<usize>,
    ) -> JetStreamQueue<T> {
        self.make_queue(lane, run, consume, false)
    }

    fn make_queue<T: Wire + 'static>(
        &self,
        lane: Lane,
        run: RunId,
        consume: Option<usize>,
        direct_acks: bool,
    ) -> JetStreamQueue<T> {
        let inbox = consume.map(|prefetch| Inbox::start(self, lane, run, prefetch));
        JetStreamQueue {
            broker: self.clone(),
            lane,
            run,
            prefix: self.inner.config.prefix.clone(),
            inbox,
            direct_acks,
            _item: PhantomData,
        }
    }

    /// A queue of the run on `lane` whose deliveries cause no publishes (the publisher
    /// following the events): its acknowledgements go out at once instead of behind this
    /// process's publishes. Those may be waiting for room in a full stream that only these
    /// acknowledgements make (the connector's work waits on the workers, which wait on the
    /// indexer, which waits on the events), so ordering them would close the circle.
    pub fn follower<T: Wire + 'static>(
        &self,
        lane: Lane,
        run: RunId,
        prefetch: usize,
    ) -> JetStreamQueue<T> {
        self.make_queue(lane, run, Some(prefetch), true)
    }

    /// Messages a consumer of the run still has to deliver or see acknowledged (an estimate).
    pub fn backlog(&self, lane: Lane, run: RunId) -> Option<u64> {
        let c = &self.inner.config;
        let (stream, name) = (c.stream(lane), c.consumer(lane, run));
        let js = self.inner.js.clone();
        self.block_on(async move {
            let stream = js.get_stream(stream).await.ok()?;
            let mut consumer: consumer::PullConsumer = stream.get_consumer(&name).await.ok()?;
            let info = consumer.info().await.ok()?;
            Some(info.num_pending + info.num_ack_pending as u64)
        })
    }

    /// The messages that reached MaxDeliver on the run's consumers, as they happen:
    /// (lane, the message's payload). The server stops delivering such a message; the caller
    /// decides what becomes of its document. The message is removed from its stream.
    pub fn dead_letters(&self, run: RunId) -> Result<Receiver<(Lane, Bytes)>, BrokerError> {
        let c = self.inner.config.clone();
        let (tx, rx) = bounded(1024);
        let client = self.inner.client.clone();
        let js = self.inner.js.clone();
        let subject = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>".to_string();
        let mut sub = self
            .block_on(client.subscribe(subject))
            .map_err(|e| BrokerError::api("watching for dead letters", e))?;
        let names: HashMap<(String, String), Lane> = Lane::ALL
            .iter()
            .map(|&l| ((c.stream(l), c.consumer(l, run)), l))
            .collect();
        self.inner.rt.spawn(async move {
            #[derive(Deserialize)]
            struct Advisory {
                stream: String,
                consumer: String,
                stream_seq: u64,
            }
            while let Some(msg) = sub.next().await {
                let Ok(a) = serde_json::from_slice::<Advisory>(&msg.payload) else {
                    continue;
                };
                let Some(&lane) = names.get(&(a.stream.clone(), a.consumer.clone())) else {
                    continue;
                };
                let Ok(stream) = js.get_stream(&a.stream).await else {
                    continue;
                };
                if let Ok(m) = stream.get_raw_message(a.stream_seq).await {
                    let _ = stream.delete_message(a.stream_seq).await;
                    // Every item of the message (a batch is split on its second delivery,
                    // so this is one item unless MaxDeliver is 1).
                    let Ok((items, _)) = split_message(&m.payload) else {
                        continue;
                    };
                    for item in items {
                        if tx.send((lane, item)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Wait until everything pushed so far is stored (or `wait` passes).
    pub fn flush(&self, wait: Duration) -> bool {
        let (tx, rx) = bounded::<()>(1);
        let out = self.inner.outgoing.clone();
        let sent = self.block_on(async move { out.send(Outgoing::Flush(tx)).await.is_ok() });
        let done = sent && rx.recv_timeout(wait).is_ok();
        let client = self.inner.client.clone();
        let _ = self.block_on(async move { tokio::time::timeout(wait, client.flush()).await });
        done
    }

    /// Set `flag` on SIGTERM or SIGINT (the process finishes what it holds and exits).
    pub fn stop_on_signals(&self, flag: Arc<AtomicBool>) {
        use tokio::signal::unix::{signal, SignalKind};
        self.inner.rt.spawn(async move {
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!(target: crate::NOTE, "stopping: finishing what this process holds");
            flag.store(true, Ordering::Relaxed);
        });
    }

    fn send(&self, out: Outgoing, timeout: Duration) -> Result<(), Outgoing> {
        let tx = self.inner.outgoing.clone();
        self.block_on(async move {
            match tokio::time::timeout(timeout, tx.reserve()).await {
                Ok(Ok(permit)) => {
                    permit.send(out);
                    Ok(())
                }
                _ => Err(out),
            }
        })
    }
}

/// The output task: publishes in order, pipelined, each retried until stored; an
/// acknowledgement goes out only after every publish queued before it is confirmed.
async fn output(js: jetstream::Context, mut rx: tokio::sync::mpsc::Receiver<Outgoing>) {
    let mut ordered: FuturesOrdered<Ordered> = FuturesOrdered::new();
    let mut open = true;
    // What coalescing took from the channel that belongs to the next turn.
    let mut carry: Option<Outgoing> = None;
    // Bytes of the publishes in flight: with coalesced messages the window's count alone
    // would not bound memory.
    let mut in_flight = 0usize;
    loop {
        tokio::select! {
            next = next_outgoing(&mut rx, &mut carry), if open && ordered.len() < PUBLISH_WINDOW && in_flight < IN_FLIGHT_BYTES => match next {
                Some(Outgoing::Publish { subject, payload }) => {
                    // The publishes to this subject already waiting go in the same message.
                                        let mut bytes = 6 + 4 + payload.len();
                    let mut items = vec![payload];
                    while items.len() < COALESCE_ITEMS {
                        match rx.try_recv() {
                            Ok(Outgoing::Publish { subject: s, payload: p })
                                if s == subject && bytes + 4 + p.len() <= COALESCE_BYTES =>
                            {
                                bytes += 4 + p.len();
                                items.push(p);
                            }
                            Ok(other) => {
                                carry = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let payload = if items.len() == 1 {
                        items.pop().expect("one item")
                    } else {
                        encode_batch(&items, 0)
                    };
                    in_flight += payload.len();
                    ordered.push_back(publish(js.clone(), subject, payload));
                }
                Some(Outgoing::PublishAlone { subject, payload }) => {
                    in_flight += payload.len();
                    ordered.push_back(publish(js.clone(), subject, payload));
                }
                Some(Outgoing::Ack(msg, kind)) => {
                    ordered.push_back(Box::pin(async move { (Some((*msg, kind)), 0) }));
                }
                Some(Outgoing::Flush(done)) => {
                    ordered.push_back(Box::pin(async move {
                        let _ = done.send(());
                        (None, 0)
                    }));
                }
                None => open = false,
            },
            Some((reply, bytes)) = ordered.next(), if !ordered.is_empty() => {
                in_flight -= bytes;
                if let Some((msg, kind)) = reply {
                    let _ = msg.ack_with(kind).await;
                }
            }
            else => break,
        }
    }
}

/// The next outgoing message: the one coalescing carried over, else the channel's next.
async fn next_outgoing(
    rx: &mut tokio::sync::mpsc::Receiver<Outgoing>,
    carry: &mut Option<Outgoing>,
) -> Option<Outgoing> {
    match carry.take() {
        Some(o) => Some(o),
        None => rx.recv().await,
    }
}

/// Publish until the stream has stored the message.
fn publish(js: jetstream::Context, subject: String, payload: Bytes) -> Ordered {
    Box::pin(async move {
        let bytes = payload.len();
        let mut pause = Duration::from_millis(5);
        loop {
            if let Ok(ack) = js.publish(subject.clone(), payload.clone()).await {
                if ack.await.is_ok() {
                    return (None, bytes);
                }
            }
            // Full stream (backpressure), no leader, or no server: wait and send it again. A
            // duplicate (stored, but the ack was lost) is harmless: every stage is idempotent.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    })
}

/// Messages of one consumer delivered to this process: their items pulled ahead of `pop`
/// (their tags wait in `rx`) or popped and not yet acknowledged. All of them get in-progress
/// acks, so what a live process holds stays its own; a dead process's come back after
/// AckWait. A message is acknowledged when every item of it is.
struct Inbox {
    rx: Receiver<u64>,
    held: Arc<Mutex<HashMap<u64, Held>>>,
    stop: Arc<AtomicBool>,
}

/// One item of a delivered message.
struct Held {
    message: Arc<HeldMessage>,
    payload: Bytes,
    /// Delivered before (the message, or the batch it was split from).
    redelivered: bool,
}

/// A delivered message and what its items came to so far.
struct HeldMessage {
    msg: jetstream::Message,
    since: Instant,
    /// Items not acknowledged (or given back) yet.
    left: AtomicU64,
    /// An item was given back: the whole message goes back (after the longest delay asked).
    nak: Mutex<Option<Option<Duration>>>,
}

impl HeldMessage {
    /// One item is done with (`nak`: given back after a delay); when it is the last, what
    /// to reply to the message.
    fn settle(&self, nak: Option<Option<Duration>>) -> Option<AckKind> {
        if let Some(delay) = nak {
            let mut n = self.nak.lock().unwrap_or_else(|e| e.into_inner());
            *n = Some(match (*n, delay) {
                (Some(Some(a)), Some(b)) => Some(a.max(b)),
                (Some(a), None) => a,
                (_, b) => b,
            });
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        Some(match *self.nak.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(delay) => AckKind::Nak(delay),
            None => AckKind::Ack,
        })
    }
}

impl Inbox {
    fn start(broker: &Broker, lane: Lane, run: RunId, prefetch: usize) -> Inbox {
        let prefetch = prefetch.max(1);
        // Unbounded: what waits here is bounded by `held` (the pull asks only for the room
        // left), and the pull must never block on it. A batch read slowly is ended by the
        // client (its expiry plus a margin) with messages still in its buffer, which then
        // come back only after AckWait.
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        let held: Arc<Mutex<HashMap<u64, Held>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let c = broker.inner.config.clone();
        let js = broker.inner.js.clone();
        let out = broker.inner.outgoing.clone();
        let (stream_name, name) = (c.stream(lane), c.consumer(lane, run));
        let (stop2, held1) = (Arc::clone(&stop), Arc::clone(&held));
        let mut pull = Pull {
            run,
            lane,
            events_subject: c.subject(Lane::Events, run),
            held: Arc::clone(&held),
            tags: Arc::clone(&broker.inner.tags_arc),
            tx,
            out: out.clone(),
            per_message: 32.0,
        };
        broker.inner.rt.spawn(async move {
            // Pull; after any error (server restart, consumer not there yet), start again.
            'outer: while !stop2.load(Ordering::Relaxed) {
                let consumer: Option<consumer::PullConsumer> = async {
                    let stream = js.get_stream(&stream_name).await.ok()?;
                    stream.get_consumer(&name).await.ok()
                }
                .await;
                let Some(consumer) = consumer else {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                };
                while !stop2.load(Ordering::Relaxed) {
                    let holding = held1.lock().unwrap_or_else(|e| e.into_inner()).len();
                    let room = prefetch.saturating_sub(holding);
                    if room == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let want =
                        ((room as f64 / pull.per_message).floor() as usize).clamp(1, prefetch);
                    let Ok(mut messages) = consumer
                        .batch()
                        .max_messages(want)
                        .expires(Duration::from_secs(1))
                        .messages()
                        .await
                    else {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue 'outer;
                    };
                    // Replies and republishes wait until the batch is read: reading it must
                    // never wait on the output task (see `tx`).
                    let mut later: Vec<Outgoing> = Vec::new();
                    let mut broken = false;
                    while let Some(next) = messages.next().await {
                        let Ok(msg) = next else {
                            broken = true;
                            break;
                        };
                        if !pull.take(msg, &mut later) {
                            return;
                        }
                    }
                    for o in later {
                        let _ = out.send(o).await;
                    }
                    if broken {
                        continue 'outer;
                    }
                }
            }
        });
        keep_alive(broker, &c, Arc::clone(&held), Arc::clone(&stop));
        Inbox { rx, held, stop }
    }
}

/// In-progress acknowledgements for what this process holds, every third of AckWait. A
/// process stuck on one message for longer than `max_hold` stops keeping it: it goes to
/// another process after AckWait, and after MaxDeliver to the dead letters.
fn keep_alive(
    broker: &Broker,
    c: &BrokerConfig,
    held: Arc<Mutex<HashMap<u64, Held>>>,
    stop: Arc<AtomicBool>,
) {
    let every = (c.ack_wait / 3).max(Duration::from_millis(100));
    let max_hold = c.max_hold;
    broker.inner.rt.spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(every).await;
            let replies: Vec<jetstream::Message> = {
                let held = held.lock().unwrap_or_else(|e| e.into_inner());
                let mut seen = std::collections::HashSet::new();
                held.values()
                    .filter(|h| h.message.since.elapsed() < max_hold)
                    .filter(|h| seen.insert(Arc::as_ptr(&h.message)))
                    .map(|h| clone_message(&h.message.msg))
                    .collect()
            };
            for m in replies {
                let _ = m.ack_with(AckKind::Progress).await;
            }
        }
    });
}

/// What an inbox's pull does with the messages it gets.
struct Pull {
    run: RunId,
    lane: Lane,
    events_subject: String,
    held: Arc<Mutex<HashMap<u64, Held>>>,
    tags: Arc<AtomicU64>,
    tx: crossbeam_channel::Sender<u64>,
    /// The output task's queue.
    out: tokio::sync::mpsc::Sender<Outgoing>,
    /// Items per message seen so far (a running average): how many messages to ask for so
    /// that about the prefetch's items are held, never far more (the others' share). It
    /// starts as if messages were well filled, so that a process's first pull does not take
    /// far more than its share.
    per_message: f64,
}

impl Pull {
    /// Hand `o` to the output task now when it has room and nothing queued after the batch
    /// would then go out of order; else after the batch.
    fn send_now(&self, o: Outgoing, later: &mut Vec<Outgoing>) {
        if !later.is_empty() {
            later.push(o);
            return;
        }
        if let Err(e) = self.out.try_send(o) {
            later.push(e.into_inner());
        }
    }

    /// One pulled message: dead-lettered when unreadable (the run's publisher hears why,
    /// and it is never delivered again), split into single items when a batch comes again,
    /// else its items held and handed to the receiver by tag. Replies and republishes go to
    /// `later` (reading a batch must never wait on the output task). False when the
    /// receiver is gone.
    fn take(&mut self, msg: jetstream::Message, later: &mut Vec<Outgoing>) -> bool {
        let delivered = msg.info().map_or(1, |i| i.delivered.max(1));
        let (items, flags) = match split_message(&msg.payload) {
            Ok(x) => x,
            Err(e) => {
                let seq = msg.info().map_or(0, |i| i.stream_sequence);
                let at = format!("message {}#{seq}", msg.subject);
                tracing::warn!("{at}: unreadable ({e}); dead-lettered");
                let event = unreadable(self.run, self.lane, at, &e, &msg.payload);
                // Reported at once (the run must hear of it before it can end), unless the
                // output queue is full.
                self.send_now(
                    Outgoing::PublishAlone {
                        subject: self.events_subject.clone(),
                        payload: Bytes::from(event.encode()),
                    },
                    later,
                );
                self.send_now(Outgoing::Ack(Box::new(msg), AckKind::Term), later);
                return true;
            }
        };
        self.per_message = 0.7 * self.per_message + 0.3 * items.len().max(1) as f64;
        if items.len() > 1 && delivered > 1 {
            // A batch delivered again: one of its items may be what its consumers die on.
            // Each item goes on alone, then the batch is acknowledged (after them: the
            // output task keeps the order).
            let subject = msg.subject.to_string();
            for item in items {
                later.push(Outgoing::PublishAlone {
                    subject: subject.clone(),
                    payload: encode_batch(&[item], FLAG_REDELIVERED),
                });
            }
            later.push(Outgoing::Ack(Box::new(msg), AckKind::Ack));
            return true;
        }
        let redelivered = delivered > 1 || flags & FLAG_REDELIVERED != 0;
        let message = Arc::new(HeldMessage {
            msg,
            since: Instant::now(),
            left: AtomicU64::new(items.len() as u64),
            nak: Mutex::new(None),
        });
        if items.is_empty() {
            let m = clone_message(&message.msg);
            later.push(Outgoing::Ack(Box::new(m), AckKind::Ack));
            return true;
        }
        for payload in items {
            let tag = self.tags.fetch_add(1, Ordering::Relaxed);
            self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(
                tag,
                Held {
                    message: Arc::clone(&message),
                    payload,
                    redelivered,
                },
            );
            if self.tx.send(tag).is_err() {
                return false;
            }
        }
        true
    }
}

/// A handle to reply to a message with (acks go to its reply subject).
fn clone_message(m: &jetstream::Message) -> jetstream::Message {
    jetstream::Message {
        message: m.message.clone(),
        context: m.context.clone(),
    }
}

/// A queue of one lane of one run on JetStream.
pub struct JetStreamQueue<T> {
    broker: Broker,
    lane: Lane,
    run: RunId,
    prefix: String,
    inbox: Option<Inbox>,
    /// Acknowledgements bypass the output task (see [`Broker::follower`]).
    direct_acks: bool,
    _item: PhantomData<fn() -> T>,
}

impl<T> Drop for JetStreamQueue<T> {
    fn drop(&mut self) {
        // What this process pulled but never finished goes back at once, not after AckWait.
        if let Some(inbox) = &self.inbox {
            inbox.stop.store(true, Ordering::Relaxed);
            let held = std::mem::take(&mut *inbox.held.lock().unwrap_or_else(|e| e.into_inner()));
            let mut seen = std::collections::HashSet::new();
            for h in held.into_values() {
                if seen.insert(Arc::as_ptr(&h.message)) {
                    let _ = self.broker.send(
                        Outgoing::Ack(Box::new(clone_message(&h.message.msg)), AckKind::Nak(None)),
                        Duration::from_secs(1),
                    );
                }
            }
        }
    }
}

impl<T> JetStreamQueue<T> {
    fn name_static(&self) -> &'static str {
        self.lane.name()
    }

    /// Send the delivery back for another try after `delay`.
    pub fn nack(&self, tag: DeliveryTag, delay: Option<Duration>) -> Result<(), QueueError> {
        self.reply(tag, AckKind::Nak(delay))
    }

    fn reply(&self, tag: DeliveryTag, kind: AckKind) -> Result<(), QueueError> {
        let Some(inbox) = &self.inbox else {
            return Err(backend(self.name_static(), "this queue does not consume"));
        };
        let held = inbox
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&tag.0);
        let Some(h) = held else {
            return Err(backend(
                self.name_static(),
                format!("no delivery {}", tag.0),
            ));
        };
        // The message is answered when its last item is.
        let nak = match kind {
            AckKind::Nak(delay) => Some(delay),
            _ => None,
        };
        let Some(reply) = h.message.settle(nak) else {
            return Ok(());
        };
        let msg = clone_message(&h.message.msg);
        if self.direct_acks {
            self.broker.inner.rt.spawn(async move {
                let _ = msg.ack_with(reply).await;
            });
            return Ok(());
        }
        self.broker
            .send(Outgoing::Ack(Box::new(msg), reply), Duration::from_secs(60))
            .map_err(|_| QueueError::Closed {
                queue: self.name_static(),
            })
    }
}

impl<T: Wire + 'static> Queue<T> for JetStreamQueue<T> {
    fn name(&self) -> &'static str {
        self.lane.name()
    }

    fn push(&self, item: T, timeout: Duration) -> Result<(), PushError<T>> {
        let subject = format!("{}.{}.{}", self.prefix, self.lane.name(), item.run_id());
        let payload = Bytes::from(item.encode());
        match self
            .broker
            .send(Outgoing::Publish { subject, payload }, timeout)
        {
            Ok(()) => Ok(()),
            Err(_) if self.broker.inner.closed.load(Ordering::Relaxed) => Err(PushError::Closed {
                queue: self.lane.name(),
                item,
            }),
            Err(_) => Err(PushError::Full {
                queue: self.lane.name(),
                item,
            }),
        }
    }

    fn max_item_bytes(&self) -> Option<usize> {
        // The server refuses a larger message every time; leave room for the envelope.
        let max = self.broker.inner.client.server_info().max_payload;
        (max > 0).then(|| max.saturating_sub(ENVELOPE_ROOM))
    }

    fn pop(&self, timeout: Duration) -> Result<Option<Delivery<T>>, QueueError> {
        let Some(inbox) = &self.inbox else {
            return Err(backend(self.lane.name(), "this queue does not consume"));
        };
        loop {
            let tag = match inbox.rx.try_recv() {
                Ok(t) => t,
                Err(_) => match inbox.rx.recv_timeout(timeout) {
                    Ok(t) => t,
                    Err(_) => return Ok(None),
                },
            };
            let held = inbox.held.lock().unwrap_or_else(|e| e.into_inner());
            let Some(h) = held.get(&tag) else { continue };
            let delivered = h
                .message
                .msg
                .info()
                .map_or(1, |i| i.delivered.max(1) as u32);
            let attempt = delivered + u32::from(h.redelivered && delivered == 1);
            let decoded = T::decode(&h.payload);
            let subject = h.message.msg.subject.to_string();
            let seq = h.message.msg.info().map_or(0, |i| i.stream_sequence);
            let payload = h.payload.clone();
            drop(held);
            match decoded {
                Ok(mut item) => {
                    if attempt > 1 {
                        item.mark_redelivered();
                    }
                    return Ok(Some(Delivery {
                        item,
                        tag: DeliveryTag(tag),
                        attempt,
                    }));
                }
                Err(e) => {
                    // Not ours, or corrupt: it belongs to no document this process could
                    // name. Dead-lettered: the run's publisher hears why (after this publish,
                    // the item is let go as done).
                    let at = format!("message {subject}#{seq}");
                    tracing::warn!("{at}: unreadable item ({e}); dead-lettered");
                    let event = unreadable(self.run, self.lane, at, &e, &payload);
                    let _ = self.broker.send(
                        Outgoing::PublishAlone {
                            subject: self.broker.inner.config.subject(Lane::Events, self.run),
                            payload: Bytes::from(event.encode()),
                        },
                        Duration::from_secs(60),
                    );
                    let _ = self.reply(DeliveryTag(tag), AckKind::Ack);
                }
            }
        }
    }

    fn ack(&self, tag: DeliveryTag) -> Result<(), QueueError> {
        self.reply(tag, AckKind::Ack)
    }

    fn nack(&self, tag: DeliveryTag, delay: Duration) -> Result<(), QueueError> {
        JetStreamQueue::nack(self, tag, Some(delay))
    }

    fn len(&self) -> usize {
        self.inbox.as_ref().map_or(0, |i| i.rx.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_tls_come_from_the_url_and_never_show() {
        let c = BrokerConfig::parse("nats://alice:p%40ss@h1:4222,nats://h2:4223").unwrap();
        assert_eq!(c.servers, ["nats://h1:4222", "nats://h2:4223"]);
        assert_eq!(
            c.auth,
            NatsAuth::UserPassword {
                user: "alice".into(),
                password: Secret::new("p@ss"),
            }
        );
        assert!(!format!("{c:?} {}", c.describe()).contains("p@ss"));
        let c = BrokerConfig::parse("nats://s3cr3t@h:4222").unwrap();
        assert_eq!(c.auth, NatsAuth::Token(Secret::new("s3cr3t")));
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let c = BrokerConfig::parse("tls://h:4222?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem")
            .unwrap();
        assert!(c.tls);
        assert_eq!(c.tls_ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert!(c.tls_client.is_some());
        let c = BrokerConfig::parse("nats://h:4222?tls=true&creds=/u.creds").unwrap();
        assert!(c.tls);
        assert_eq!(c.auth, NatsAuth::Creds("/u.creds".into()));
        for (bad, says) in [
            ("nats://a:1@h1:1,nats://b:2@h2:2", "different credentials"),
            ("nats://a:1@h:1?creds=/x", "not both"),
            ("nats://h:1?tls_cert=/c.pem", "both tls_cert= and tls_key="),
            ("nats://h:1?tls=maybe", "true or false"),
            ("http://u:hunter2@h:1", "not a nats://"),
        ] {
            let e = BrokerConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn a_batch_envelope_never_allocates_more_than_its_bytes_hold() {
        // The 6-byte message of the finding: 4 billion items announced.
        let hostile = Bytes::from_static(&[0xC1, 0x00, 0xFF, 0xFF, 0xFF, 0xFF]);
        let e = split_message(&hostile).unwrap_err().to_string();
        assert!(e.contains("room for at most 0"), "{e}");
        // Items that claim more bytes than there are.
        let mut v = vec![0xC1, 0, 2, 0, 0, 0];
        v.extend_from_slice(&u32::MAX.to_le_bytes());
        v.extend_from_slice(&[1, 2, 3, 4]);
        assert!(split_message(&Bytes::from(v)).is_err());
        // Trailing bytes after the items.
        let mut ok = encode_batch(&[Bytes::from_static(b"a")], 0).to_vec();
        ok.push(9);
        assert!(split_message(&Bytes::from(ok)).is_err());
    }

    #[test]
    fn a_queue_url_names_servers_and_settings() {
        let c = BrokerConfig::parse(
            "nats://a:4222,nats://b:4223?prefix=docs_1&replicas=3&ack_wait=7&max_deliver=2&limit=50&limit_mb=8",
        )
        .unwrap();
        assert_eq!(c.servers, ["nats://a:4222", "nats://b:4223"]);
        assert_eq!(c.prefix, "docs_1");
        assert_eq!(c.replicas, 3);
        assert_eq!(c.ack_wait, Duration::from_secs(7));
        assert_eq!(c.max_deliver, 2);
        assert_eq!(c.limit, 50);
        assert_eq!(c.limit_mb, 8);
        assert_eq!(c.max_pending, BrokerConfig::default().max_pending);
        let run = RunId(0xab);
        assert_eq!(c.stream(Lane::Embed), "DOCS_1_EMBED");
        assert_eq!(c.subject(Lane::Work, run), "docs_1.work.00000000000000ab");
        assert_eq!(c.consumer(Lane::Index, run), "index-00000000000000ab");
    }

    #[test]
    fn batches_carry_their_items_and_plain_messages_are_one() {
        let items: Vec<Bytes> = vec![
            Bytes::from_static(b"\x92\x01\x02"),
            Bytes::new(),
            Bytes::from(vec![7u8; 300]),
        ];
        let batch = encode_batch(&items, FLAG_REDELIVERED);
        assert_eq!(
            split_message(&batch).unwrap(),
            (items.clone(), FLAG_REDELIVERED)
        );
        let plain = Bytes::from_static(b"\x92\x01\x02");
        assert_eq!(split_message(&plain).unwrap(), (vec![plain.clone()], 0));
        // A cut envelope is an error, never a panic.
        for cut in [2, 6, 9, batch.len() - 1] {
            assert!(split_message(&batch.slice(..cut)).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_bad_queue_url_says_what_is_wrong() {
        for (url, says) in [
            ("http://a:4222", "not a nats:// address"),
            ("", "names no server"),
            ("nats://a:4222?replicas=0", "must be a positive"),
            ("nats://a:4222?ack_wait=soon", "must be a positive"),
            ("nats://a:4222?prefix=a.b", "letters, digits"),
            ("nats://a:4222?colour=red", "unknown setting `colour`"),
        ] {
            let err = BrokerConfig::parse(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
    }
}
