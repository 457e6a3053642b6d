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

mod broker;
mod config;
mod envelope;
mod inbox;
pub mod lifecycle;
mod output;

use super::wire::Wire;
use super::{Delivery, DeliveryTag, PushError, Queue, QueueError};
use crate::document::RunId;
use crate::event::{Event, EventKind};
use crate::secret::Secret;
pub use broker::Broker;
use broker::{backend, Ordered, Outgoing};
pub(crate) use config::connect_client;
pub use config::{BrokerConfig, NatsAuth};
pub(crate) use envelope::encode_batch;
pub use envelope::split_message;
use envelope::unreadable;
pub use inbox::JetStreamQueue;
use inbox::{clone_message, Inbox};
use output::output;

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
