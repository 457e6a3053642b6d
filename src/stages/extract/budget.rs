//! Extraction under a budget: a parser runs on a thread of its own, under `catch_unwind`,
//! with a deadline and a memory ceiling. A panic, a timeout, a ceiling passed or an error
//! fails that one file with the reason; the worker goes on with the next document at once.
//!
//! A parser cannot be killed from outside, so the budget works two ways: the parser checks
//! [`Budget::check`] between pages (or chunks of input) and stops early, and the worker stops
//! waiting when the time is up or the parser's thread has allocated more than the ceiling
//! (its balance in [`crate::memory`]), whatever the parser does. A parser stuck inside one
//! page is abandoned: its thread finishes (or not) in the background, holding its memory
//! until then. At most [`max_abandoned`] such threads are left running: past that, a new
//! extraction waits (up to its own time limit) for one of them to end, and fails with the
//! reason if none does, so hostile files cannot pile up threads and memory without bound.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use crate::memory::Account;

/// The name of extraction threads: their panics are reported as the file's failure, not
/// printed.
const THREAD_NAME: &str = "ragline-extract";

/// Stack for an extraction thread: parsers recurse over nested objects.
const STACK_BYTES: usize = 64 << 20;

/// How often the waiting worker looks at the parser's memory.
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// Extraction threads given up on and still running.
static ABANDONED: AtomicUsize = AtomicUsize::new(0);

/// How many abandoned extraction threads may run at once: the number of cores, at least 4.
pub fn max_abandoned() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().max(4))
}

/// Extraction threads given up on that are still running.
pub fn abandoned() -> usize {
    ABANDONED.load(Ordering::Relaxed)
}

/// What one extraction may spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time (`--max-file-seconds`).
    pub time: Duration,
    /// Bytes the parser's thread may hold (`--max-extract-mb`).
    pub memory: u64,
}

/// What the parser sees of its budget.
#[derive(Clone, Debug)]
pub struct Budget {
    deadline: Instant,
    memory: u64,
    account: Account,
    cancelled: Arc<AtomicBool>,
    /// The bytes held when a check found the ceiling passed (0: it never did).
    over_memory: Arc<AtomicU64>,
}

/// Why a parser gave no text: its message names the problem and the fix ("not a Word
/// document ...: the file is damaged or misnamed"), or where the budget ran out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The bytes are not a readable file of the format.
    #[error("{0}")]
    Invalid(String),
    /// The budget ran out while parsing, at the place named.
    #[error("out of time or memory {0}")]
    OutOfBudget(String),
}

impl From<String> for ParseError {
    fn from(reason: String) -> Self {
        ParseError::Invalid(reason)
    }
}

impl From<&str> for ParseError {
    fn from(reason: &str) -> Self {
        ParseError::Invalid(reason.to_string())
    }
}

/// The budget ran out; the parser should stop.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfTime;

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Budget {
            deadline: Instant::now() + limits.time,
            memory: limits.memory,
            account: Account::new(),
            cancelled: Arc::new(AtomicBool::new(false)),
            over_memory: Arc::new(AtomicU64::new(0)),
        }
    }

    /// No limit worth the name (a day, all the memory): for callers that parse trusted input
    /// on their own thread.
    pub fn unlimited() -> Self {
        Budget::new(Limits {
            time: Duration::from_secs(86_400),
            memory: u64::MAX,
        })
    }

    /// `Err` once the deadline has passed, the parser's thread holds more than its memory,
    /// or the worker gave up waiting.
    pub fn check(&self) -> Result<(), OutOfTime> {
        let held = self.account.bytes();
        if held > self.memory {
            self.over_memory.fetch_max(held, Ordering::Relaxed);
            return Err(OutOfTime);
        }
        if self.cancelled.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            Err(OutOfTime)
        } else {
            Ok(())
        }
    }

    /// The ceiling on what the parser may hold, for parsers that take a limit of their own.
    pub fn memory(&self) -> u64 {
        self.memory
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
    /// The parser's thread held more than the ceiling: the bytes when it was stopped.
    OverMemory(u64),
    /// Too many parsers given up on earlier are still running: how many.
    Busy(usize),
}

/// The thread's state, for the count of abandoned threads.
const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const GIVEN_UP: u8 = 2;

/// Run `parse` on a thread of its own under `catch_unwind`, waiting at most `limits.time`
/// and stopping when the thread holds more than `limits.memory` (a one-off [`Runner`]).
pub fn run<T, F>(limits: Limits, parse: F) -> Result<T, Guarded>
where
    T: Send + 'static,
    F: FnOnce(&Budget) -> Result<T, ParseError> + Send + 'static,
{
    Runner::default().run(limits, parse)
}

/// A job for a runner's thread.
type Job = Box<dyn FnOnce() + Send>;

/// A parser thread kept for the next file: a worker owns one (through its extract stage), so
/// a file costs a message to its thread, not a thread. A thread given up on (out of time or
/// memory) is left to finish in the background, and the next file gets a new one.
#[derive(Default)]
pub struct Runner {
    thread: Option<crossbeam_channel::Sender<Job>>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("thread", &self.thread.is_some())
            .finish()
    }
}

impl Runner {
    /// Run `parse` on this runner's thread under `catch_unwind`, waiting at most
    /// `limits.time` and stopping when the thread holds more than `limits.memory`.
    pub fn run<T, F>(&mut self, limits: Limits, parse: F) -> Result<T, Guarded>
    where
        T: Send + 'static,
        F: FnOnce(&Budget) -> Result<T, ParseError> + Send + 'static,
    {
        let budget = Budget::new(limits);
        // Wait for room among the threads given up on, within this file's own time.
        while ABANDONED.load(Ordering::Relaxed) >= max_abandoned() {
            if budget.check().is_err() {
                return Err(Guarded::Busy(ABANDONED.load(Ordering::Relaxed)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let (cancelled, account) = (Arc::clone(&budget.cancelled), budget.account.clone());
        let state = Arc::new(AtomicU8::new(RUNNING));
        let state2 = Arc::clone(&state);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let job: Job = Box::new(move || {
            let entered = budget.account.enter();
            let result = match catch_unwind(AssertUnwindSafe(|| parse(&budget))) {
                Ok(Ok(value)) => Ok(value),
                // Stopped by its budget: the error is the budget's.
                Ok(Err(_)) if budget.over_memory.load(Ordering::Relaxed) > 0 => Err(
                    Guarded::OverMemory(budget.over_memory.load(Ordering::Relaxed)),
                ),
                Ok(Err(_)) if budget.check().is_err() => Err(Guarded::TimedOut),
                Ok(Err(e)) => Err(Guarded::Failed(e.to_string())),
                Err(panic) => Err(Guarded::Panicked(crate::panics::message(&*panic))),
            };
            drop(entered);
            // The worker may have stopped waiting: then nobody reads this.
            let _ = tx.send(result);
            if state2.swap(FINISHED, Ordering::AcqRel) == GIVEN_UP {
                ABANDONED.fetch_sub(1, Ordering::AcqRel);
            }
        });
        self.send(job)?;
        // A little grace past the deadline, for a parser that checks its budget between
        // pages.
        let deadline = Instant::now() + limits.time + Duration::from_millis(250);
        let mut give_up = |why: Guarded| {
            cancelled.store(true, Ordering::Relaxed);
            ABANDONED.fetch_add(1, Ordering::AcqRel);
            if state
                .compare_exchange(RUNNING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // It finished meanwhile: not abandoned after all.
                ABANDONED.fetch_sub(1, Ordering::AcqRel);
            }
            // Its thread ends after this job (its channel is closed); the next file gets
            // another.
            self.thread = None;
            Err(why)
        };
        loop {
            let now = Instant::now();
            if now >= deadline {
                return give_up(Guarded::TimedOut);
            }
            match rx.recv_timeout(WATCH_EVERY.min(deadline - now)) {
                Ok(result) => return result,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    self.thread = None;
                    return Err(Guarded::Failed(
                        "the extraction thread ended without a result".into(),
                    ));
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let held = account.bytes();
                    if held > limits.memory {
                        return give_up(Guarded::OverMemory(held));
                    }
                }
            }
        }
    }

    /// Hand `job` to this runner's thread, starting one if there is none.
    fn send(&mut self, job: Job) -> Result<(), Guarded> {
        let job = match &self.thread {
            Some(thread) => match thread.send(job) {
                Ok(()) => return Ok(()),
                // The thread is gone (it cannot be, but then start another).
                Err(crossbeam_channel::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = crossbeam_channel::bounded::<Job>(1);
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .map_err(|e| {
                Guarded::Failed(format!(
                    "cannot start an extraction thread ({e}); lower --workers"
                ))
            })?;
        tx.send(job)
            .map_err(|_| Guarded::Failed("the extraction thread ended at once".into()))?;
        self.thread = Some(tx);
        Ok(())
    }
}

/// Panics on extraction threads become the file's failure message; printing them as well
/// would only break the progress display. A program that shows progress calls this once (the
/// `ragline` binary does at start; the library installs no process-wide hook by itself): the
/// panic hook then stays silent on extraction threads, and every other thread's panics print
/// as before.
pub fn quiet_extraction_panics() {
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

    fn limits(time: Duration) -> Limits {
        Limits {
            time,
            memory: 1 << 30,
        }
    }

    #[test]
    fn a_result_an_error_a_panic_and_a_timeout_each_come_back() {
        let second = limits(Duration::from_secs(5));
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
        let stuck = run::<(), _>(limits(Duration::from_millis(100)), |_| {
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
        let result = run::<(), _>(limits(Duration::from_millis(50)), move |budget| {
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

    #[test]
    fn a_parser_over_its_memory_is_stopped_and_abandoned_threads_are_counted() {
        // The unit tests run with the counting allocator (lib.rs), as the binary does.
        assert!(crate::memory::installed());
        // A parser that keeps allocating and never checks its budget.
        let got = run::<(), _>(
            Limits {
                time: Duration::from_secs(30),
                memory: 64 << 20,
            },
            |_| {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                for _ in 0..40 {
                    hoard.push(vec![1u8; 8 << 20]);
                    std::thread::sleep(Duration::from_millis(10));
                }
                std::thread::sleep(Duration::from_millis(500));
                Ok(())
            },
        );
        match got {
            Err(Guarded::OverMemory(bytes)) => assert!(bytes > 64 << 20, "{bytes}"),
            other => panic!("{other:?}"),
        }
        // It was given up on while still running (it sleeps on): it is counted. (Other tests
        // running at once can only add to the count.)
        assert!(abandoned() >= 1, "the thread given up on is counted");
        // A parser that checks its budget stops itself at the ceiling.
        let got = run::<(), _>(
            Limits {
                time: Duration::from_secs(30),
                memory: 32 << 20,
            },
            |b| {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    b.check().map_err(|_| "stopped".to_string())?;
                    hoard.push(vec![1u8; 1 << 20]);
                }
            },
        );
        assert!(matches!(got, Err(Guarded::OverMemory(_))), "{got:?}");
    }
}
