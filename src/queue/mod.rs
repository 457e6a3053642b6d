//! Queues between the stages of a run. Every queue is bounded: a full queue makes its producer
//! wait, so a slow indexer slows the connector instead of growing memory.
//!
//! The trait is honest about acknowledgement so that a broker can stand behind it: an item
//! taken with [`Queue::pop`] is not done until [`Queue::ack`] is called, and a consumer acks
//! only after the item's output is itself durably queued (or written). The in-process
//! implementation ([`memory::MemoryQueue`]) has nothing to redeliver, so its ack is free.

#[cfg(feature = "nats")]
pub mod jetstream;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod memory;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::signal::RunSignal;

/// Identifies one delivery, for [`Queue::ack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeliveryTag(pub u64);

/// An item taken from a queue, with the tag that acknowledges it.
#[derive(Debug)]
pub struct Delivery<T> {
    pub item: T,
    pub tag: DeliveryTag,
    /// Which delivery of the item this is, from 1 (more after a consumer died or timed out).
    pub attempt: u32,
}

#[derive(Debug, Error)]
pub enum PushError<T> {
    /// The queue stayed full for the whole timeout; the item is handed back.
    #[error("queue `{queue}` stayed full")]
    Full { queue: &'static str, item: T },
    /// The queue can take no more items (its broker connection is gone, or it was closed).
    #[error("queue `{queue}` is closed")]
    Closed { queue: &'static str, item: T },
}

#[derive(Debug, Error)]
pub enum QueueError {
    #[error("queue `{queue}` is closed")]
    Closed { queue: &'static str },
    #[error("queue `{queue}`: {message}")]
    Backend {
        queue: &'static str,
        message: String,
    },
}

/// A bounded queue of `T`.
pub trait Queue<T>: Send + Sync {
    /// The queue's name in messages ("work", "embed", "index", "events").
    fn name(&self) -> &'static str;
    /// Put an item, waiting up to `timeout` for room.
    fn push(&self, item: T, timeout: Duration) -> Result<(), PushError<T>>;
    /// Take the next item, waiting up to `timeout`; `Ok(None)` when none came.
    fn pop(&self, timeout: Duration) -> Result<Option<Delivery<T>>, QueueError>;
    /// Confirm that the delivery is fully handled.
    fn ack(&self, tag: DeliveryTag) -> Result<(), QueueError>;
    /// Give the delivery back to be delivered again after `delay` (a broker's delayed
    /// negative acknowledgement). The in-process queue never loses an item, so there is
    /// nothing to give back and its consumers never call this.
    fn nack(&self, tag: DeliveryTag, delay: Duration) -> Result<(), QueueError> {
        let _ = (tag, delay);
        Ok(())
    }
    /// The largest item the queue can carry, in encoded bytes (a broker's largest message),
    /// when it has such a limit.
    fn max_item_bytes(&self) -> Option<usize> {
        None
    }
    /// Items waiting (for a broker, an estimate).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long one blocking push or pop waits before looking at the run signal again.
pub const POLL: Duration = Duration::from_millis(20);

/// The error of [`push_until_stopped`]: the run stopped (aborted) while the queue was full.
#[derive(Debug, Error)]
#[error("run stopped while waiting for room in queue `{queue}`")]
pub struct Stopped {
    pub queue: &'static str,
}

/// Push, waiting as long as the queue is full, unless the run is stopped meanwhile. This is
/// where backpressure happens.
pub fn push_until_stopped<T>(
    queue: &Arc<dyn Queue<T>>,
    mut item: T,
    signal: &RunSignal,
) -> Result<(), Stopped> {
    loop {
        match queue.push(item, POLL) {
            Ok(()) => return Ok(()),
            Err(PushError::Full { item: back, .. }) => {
                if signal.is_stopped() {
                    return Err(Stopped {
                        queue: queue.name(),
                    });
                }
                item = back;
            }
            Err(PushError::Closed { queue, .. }) => return Err(Stopped { queue }),
        }
    }
}
