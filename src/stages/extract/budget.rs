//! Extraction under a budget: a parser for a binary format (PDF, DOCX) runs on a thread of its
//! own, under `catch_unwind`, with a deadline. A panic, a timeout or an error fails that one
//! file with the reason; the worker goes on with the next document at once.
//!
//! A parser cannot be killed from outside, so the deadline works two ways: the parser checks
//! [`Budget::check`] between pages and stops early, and the worker stops waiting when the time
//! is up whatever the parser does. A parser stuck inside one page is abandoned: its thread
//! finishes (or not) in the background, holding its memory until then; the run reports it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

/// The name of extraction threads: their panics are reported as the file's failure, not
/// printed.
const THREAD_NAME: &str = "ragline-extract";

/// Stack for an extraction thread: parsers recurse over nested objects.
const STACK_BYTES: usize = 64 << 20;

/// What the parser sees of its budget.
#[derive(Clone, Debug)]
pub struct Budget {
    deadline: Instant,
    cancelled: Arc<AtomicBool>,
}

/// The budget ran out; the parser should stop.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfTime;

impl Budget {
    pub fn new(limit: Duration) -> Self {
        Budget {
            deadline: Instant::now() + limit,
            cancelled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// `Err` once the deadline has passed or the worker gave up waiting.
    pub fn check(&self) -> Result<(), OutOfTime> {
        if self.cancelled.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            Err(OutOfTime)
        } else {
            Ok(())
        }
    }
}

/// Why a guarded extraction gave no result.
#[derive(Debug, PartialEq, Eq)]
pub enum Guarded {
    /// The parser said why (its message names the problem and the fix).
    Failed(String),
    /// The parser panicked, with the panic's message.
    Panicked(String),
    /// The time was up.
    TimedOut,
}

/// Run `parse` on a thread of its own under `catch_unwind`, waiting at most `limit`.
pub fn run<T, F>(limit: Duration, parse: F) -> Result<T, Guarded>
where
    T: Send + 'static,
    F: FnOnce(&Budget) -> Result<T, String> + Send + 'static,
{
    quiet_extraction_panics();
    let budget = Budget::new(limit);
    let cancelled = Arc::clone(&budget.cancelled);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let result = match catch_unwind(AssertUnwindSafe(|| parse(&budget))) {
                Ok(Ok(value)) => Ok(value),
                // Stopped by its budget: the error is the budget's.
                Ok(Err(_)) if budget.check().is_err() => Err(Guarded::TimedOut),
                Ok(Err(message)) => Err(Guarded::Failed(message)),
                Err(panic) => Err(Guarded::Panicked(panic_text(&*panic))),
            };
            // The worker may have stopped waiting: then nobody reads this.
            let _ = tx.send(result);
        });
    if let Err(e) = spawned {
        return Err(Guarded::Failed(format!(
            "cannot start an extraction thread ({e}); lower --workers"
        )));
    }
    // A little grace past the deadline, for a parser that checks its budget between pages.
    match rx.recv_timeout(limit + Duration::from_millis(250)) {
        Ok(result) => result,
        Err(_) => {
            cancelled.store(true, Ordering::Relaxed);
            Err(Guarded::TimedOut)
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Panics on extraction threads become the file's failure message; printing them as well
/// would only break the progress display. Every other thread's panics print as before.
fn quiet_extraction_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(THREAD_NAME) {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_an_error_a_panic_and_a_timeout_each_come_back() {
        let second = Duration::from_secs(5);
        assert_eq!(run(second, |_| Ok(7)), Ok(7));
        assert_eq!(
            run::<(), _>(second, |_| Err("broken xref".into())),
            Err(Guarded::Failed("broken xref".into()))
        );
        assert_eq!(
            run::<(), _>(second, |_| panic!("index out of bounds")),
            Err(Guarded::Panicked("index out of bounds".into()))
        );
        // A parser stuck where it never checks its budget is abandoned at the deadline.
        let started = Instant::now();
        let stuck = run::<(), _>(Duration::from_millis(100), |_| {
            std::thread::sleep(Duration::from_secs(20));
            Ok(())
        });
        assert_eq!(stuck, Err(Guarded::TimedOut));
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "it did not wait for the parser"
        );
    }

    #[test]
    fn a_parser_that_checks_its_budget_stops_early() {
        let pages_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let done = Arc::clone(&pages_done);
        let result = run::<(), _>(Duration::from_millis(50), move |budget| {
            for _ in 0..1000 {
                budget.check().map_err(|_| "out of time".to_string())?;
                std::thread::sleep(Duration::from_millis(5));
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        assert_eq!(result, Err(Guarded::TimedOut));
        // Give the parser thread time to notice, then check it stopped well short of the end.
        std::thread::sleep(Duration::from_millis(400));
        let n = pages_done.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(pages_done.load(Ordering::Relaxed), n, "the parser stopped");
        assert!(n < 1000);
    }
}
