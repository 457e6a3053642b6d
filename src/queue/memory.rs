//! In-process bounded queues over crossbeam channels: the default for a run on one machine.

use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender};

use super::{Delivery, DeliveryTag, PushError, Queue, QueueError};

/// A bounded in-process queue. Nothing is lost between push and pop inside one process, so
/// acknowledgement is a no-op.
pub struct MemoryQueue<T> {
    name: &'static str,
    tx: Sender<T>,
    rx: Receiver<T>,
}

impl<T> MemoryQueue<T> {
    /// A queue holding at most `capacity` items (at least 1).
    pub fn new(name: &'static str, capacity: usize) -> Self {
        let (tx, rx) = bounded(capacity.max(1));
        MemoryQueue { name, tx, rx }
    }

    pub fn capacity(&self) -> usize {
        self.tx.capacity().unwrap_or(usize::MAX)
    }
}

impl<T: Send> Queue<T> for MemoryQueue<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn push(&self, item: T, timeout: Duration) -> Result<(), PushError<T>> {
        // The fast path avoids reading the clock when there is room.
        match self.tx.try_send(item) {
            Ok(()) => Ok(()),
            Err(crossbeam_channel::TrySendError::Full(item)) => {
                match self.tx.send_timeout(item, timeout) {
                    Ok(()) => Ok(()),
                    Err(SendTimeoutError::Timeout(item)) => Err(PushError::Full {
                        queue: self.name,
                        item,
                    }),
                    Err(SendTimeoutError::Disconnected(item)) => Err(PushError::Closed {
                        queue: self.name,
                        item,
                    }),
                }
            }
            Err(crossbeam_channel::TrySendError::Disconnected(item)) => Err(PushError::Closed {
                queue: self.name,
                item,
            }),
        }
    }

    fn pop(&self, timeout: Duration) -> Result<Option<Delivery<T>>, QueueError> {
        let item = match self.rx.try_recv() {
            Ok(item) => item,
            Err(_) => match self.rx.recv_timeout(timeout) {
                Ok(item) => item,
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(QueueError::Closed { queue: self.name })
                }
            },
        };
        Ok(Some(Delivery {
            item,
            tag: DeliveryTag(0),
            attempt: 1,
        }))
    }

    fn ack(&self, _tag: DeliveryTag) -> Result<(), QueueError> {
        Ok(())
    }

    fn len(&self) -> usize {
        self.rx.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_queue_hands_the_item_back() {
        let q = MemoryQueue::new("t", 2);
        q.push(1, Duration::ZERO).unwrap();
        q.push(2, Duration::ZERO).unwrap();
        match q.push(3, Duration::from_millis(1)) {
            Err(PushError::Full { item, queue }) => {
                assert_eq!(item, 3);
                assert_eq!(queue, "t");
            }
            other => panic!("expected Full, got {other:?}"),
        }
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(Duration::ZERO).unwrap().unwrap().item, 1);
        q.push(3, Duration::ZERO).unwrap();
        assert_eq!(q.pop(Duration::ZERO).unwrap().unwrap().item, 2);
        assert_eq!(q.pop(Duration::ZERO).unwrap().unwrap().item, 3);
        assert!(q.pop(Duration::from_millis(1)).unwrap().is_none());
    }
}
