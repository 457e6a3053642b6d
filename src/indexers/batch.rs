//! The indexer thread: batches documents by count, bytes and time, writes them, retries the
//! items that failed for retryable causes, and reports FINISH or FAIL per item.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Backend, ItemError};
use crate::document::Document;
use crate::event::{Event, EventKind};
use crate::queue::{push_until_stopped, Delivery, Queue, POLL};
use crate::signal::RunSignal;

/// Items per bulk write, at most.
pub const DEFAULT_MAX_ITEMS: usize = 1024;
/// Bytes per bulk write, at most (text, vectors and metadata, roughly).
pub const DEFAULT_MAX_BYTES: usize = 8 << 20;
/// A batch that is not full is written this long after its first item arrived.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// Attempts after the first for items that failed for a retryable cause.
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// Wait before the first retry; doubled each time, with jitter.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(100);

/// When an indexer writes a batch.
#[derive(Clone, Debug)]
pub struct BatchConfig {
    pub max_items: usize,
    pub max_bytes: usize,
    pub timeout: Duration,
    pub max_retries: u32,
    pub retry_backoff: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_items: DEFAULT_MAX_ITEMS,
            max_bytes: DEFAULT_MAX_BYTES,
            timeout: DEFAULT_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
        }
    }
}

/// One indexer thread.
pub struct Indexer {
    pub backend: Box<dyn Backend>,
    pub config: BatchConfig,
    pub input: Arc<dyn Queue<Document>>,
    pub events: Arc<dyn Queue<Event>>,
    pub signal: Arc<RunSignal>,
}

impl Indexer {
    /// Runs until the run stops, then flushes the backend.
    pub fn run(mut self) {
        let mut batch: Vec<Delivery<Document>> = Vec::with_capacity(self.config.max_items);
        let mut bytes = 0usize;
        let mut deadline: Option<Instant> = None;
        while !self.signal.is_stopped() {
            let wait = deadline.map_or(POLL, |d| {
                d.saturating_duration_since(Instant::now()).min(POLL)
            });
            match self.input.pop(wait) {
                Ok(Some(delivery)) => {
                    bytes += delivery.item.approx_bytes();
                    batch.push(delivery);
                    deadline.get_or_insert_with(|| Instant::now() + self.config.timeout);
                }
                Ok(None) => {}
                Err(err) => {
                    self.signal.abort(format!("indexer: {err}"));
                    return;
                }
            }
            let due = deadline.is_some_and(|d| Instant::now() >= d);
            if batch.len() >= self.config.max_items || bytes >= self.config.max_bytes || due {
                if !self.write(&mut batch) {
                    return;
                }
                bytes = 0;
                deadline = None;
            }
        }
        if !batch.is_empty() {
            self.write(&mut batch);
        }
        if let Err(err) = self.backend.flush() {
            self.signal.abort(format!("indexer: {err}"));
        }
    }

    /// Write the batch, retrying what may succeed later, then report and acknowledge every
    /// item. False when the run stopped while reporting.
    fn write(&mut self, batch: &mut Vec<Delivery<Document>>) -> bool {
        let docs: Vec<Document> = batch.iter_mut().map(|d| take_doc(&mut d.item)).collect();
        // Tests slow the writes down (`FAILPOINTS=index::batch=sleep(100)`) to act while a
        // run is under way.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("index::batch");
        let results = write_with_retries(self.backend.as_mut(), &docs, &self.config);
        for ((delivery, doc), result) in batch.drain(..).zip(&docs).zip(results) {
            let event = match result {
                Ok(()) => Event::finish(doc),
                Err(err) => Event::terminal(
                    doc,
                    EventKind::Fail {
                        stage: "index".into(),
                        reason: err.message,
                    },
                ),
            };
            if push_until_stopped(&self.events, event, &self.signal).is_err() {
                return false;
            }
            if let Err(err) = self.input.ack(delivery.tag) {
                self.signal.abort(format!("indexer: {err}"));
                return false;
            }
        }
        true
    }
}

fn take_doc(slot: &mut Document) -> Document {
    std::mem::replace(slot, Document::new(String::new(), String::new()))
}

/// Write `docs`; items that fail for a retryable cause are written again (only they), up to
/// `max_retries` times with exponential backoff and jitter.
pub fn write_with_retries(
    backend: &mut dyn Backend,
    docs: &[Document],
    config: &BatchConfig,
) -> Vec<Result<(), ItemError>> {
    let mut results = backend.write(docs);
    if results.len() != docs.len() {
        let msg = format!(
            "backend returned {} results for {} items; this is a bug in the backend",
            results.len(),
            docs.len()
        );
        return vec![Err(ItemError::permanent(msg)); docs.len()];
    }
    let mut backoff = config.retry_backoff;
    for attempt in 1..=config.max_retries {
        let retry: Vec<usize> = (0..docs.len())
            .filter(|&i| matches!(&results[i], Err(e) if e.retryable))
            .collect();
        if retry.is_empty() {
            break;
        }
        std::thread::sleep(jitter(backoff));
        backoff *= 2;
        let again: Vec<Document> = retry.iter().map(|&i| docs[i].clone()).collect();
        let second = backend.write(&again);
        for (&i, result) in retry.iter().zip(second) {
            results[i] = result.map_err(|e| ItemError {
                retryable: e.retryable,
                message: if attempt == config.max_retries && e.retryable {
                    format!("{} (gave up after {} attempts)", e.message, attempt + 1)
                } else {
                    e.message
                },
            });
        }
    }
    results
}

/// Between half and the whole of `d`, so that retries of many writers spread out.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    d / 2 + d.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails item "x" permanently, and "flaky" until its third attempt.
    struct Picky {
        flaky_attempts: u32,
        writes: Vec<usize>,
    }

    impl Backend for Picky {
        fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>> {
            self.writes.push(batch.len());
            batch
                .iter()
                .map(|d| match d.id.as_str() {
                    "x" => Err(ItemError::permanent("rejected: field too long")),
                    "flaky" => {
                        self.flaky_attempts += 1;
                        if self.flaky_attempts < 3 {
                            Err(ItemError::retryable("busy"))
                        } else {
                            Ok(())
                        }
                    }
                    _ => Ok(()),
                })
                .collect()
        }

        fn flush(&mut self) -> Result<(), super::super::BackendError> {
            Ok(())
        }
    }

    #[test]
    fn retries_only_retryable_items() {
        let docs: Vec<Document> = ["a", "x", "flaky", "b"]
            .iter()
            .map(|id| Document::new(*id, "t"))
            .collect();
        let mut backend = Picky {
            flaky_attempts: 0,
            writes: vec![],
        };
        let config = BatchConfig {
            retry_backoff: Duration::from_millis(1),
            ..BatchConfig::default()
        };
        let results = write_with_retries(&mut backend, &docs, &config);
        assert_eq!(
            backend.writes,
            vec![4, 1, 1],
            "only the flaky item is written again"
        );
        assert!(results[0].is_ok() && results[2].is_ok() && results[3].is_ok());
        assert_eq!(
            results[1],
            Err(ItemError::permanent("rejected: field too long"))
        );
    }

    #[test]
    fn gives_up_after_max_retries() {
        let docs = vec![Document::new("flaky", "t")];
        let mut backend = Picky {
            flaky_attempts: 0,
            writes: vec![],
        };
        let config = BatchConfig {
            retry_backoff: Duration::from_millis(1),
            max_retries: 1,
            ..BatchConfig::default()
        };
        let results = write_with_retries(&mut backend, &docs, &config);
        let err = results[0].clone().unwrap_err();
        assert!(err.message.contains("gave up after 2 attempts"), "{err}");
    }
}
