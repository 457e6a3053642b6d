//! Showing a run's progress: bars on a terminal, plain log lines otherwise.

use std::io::Write;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::publisher::Counts;
use crate::stats::RunStats;

/// A moment of a run.
pub struct Snapshot<'a> {
    pub counts: &'a Counts,
    /// Documents and chunks in flight.
    pub pending: u64,
    /// Documents the connectors announced (0: unknown).
    pub announced: u64,
    pub elapsed: Duration,
    pub stats: &'a RunStats,
}

impl Snapshot<'_> {
    /// Parent documents that reached a terminal state.
    pub fn documents_done(&self) -> u64 {
        self.counts.indexed + self.counts.failed + self.counts.dropped
    }
}

/// Hears about a run while it goes.
pub trait Observer {
    fn tick(&mut self, snapshot: &Snapshot<'_>);
    /// The run is over; clear whatever is on screen.
    fn finish(&mut self) {}
}

/// Shows nothing.
pub struct Silent;

impl Observer for Silent {
    fn tick(&mut self, _: &Snapshot<'_>) {}
}

/// Progress bars on a terminal (standard error).
pub struct Bars {
    documents: ProgressBar,
    chunks: ProgressBar,
    _multi: MultiProgress,
}

impl Bars {
    pub fn new() -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8));
        let documents = multi.add(ProgressBar::new(0));
        documents.set_style(
            ProgressStyle::with_template(
                "{prefix:>9} [{bar:30}] {pos}/{len} {msg} ({per_sec}, {elapsed}, ETA {eta})",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        documents.set_prefix("documents");
        let chunks = multi.add(ProgressBar::new_spinner());
        chunks
            .set_style(ProgressStyle::with_template("{prefix:>9} {msg}").expect("static template"));
        chunks.set_prefix("chunks");
        Bars {
            documents,
            chunks,
            _multi: multi,
        }
    }
}

impl Default for Bars {
    fn default() -> Self {
        Self::new()
    }
}

impl Observer for Bars {
    fn tick(&mut self, s: &Snapshot<'_>) {
        let c = s.counts;
        self.documents
            .set_length(s.announced.max(c.published).max(s.documents_done()));
        self.documents.set_position(s.documents_done());
        self.documents.set_message(format!(
            "indexed {} failed {} dropped {}",
            c.indexed, c.failed, c.dropped
        ));
        let secs = s.elapsed.as_secs_f64().max(1e-3);
        self.chunks.set_length(c.children_created);
        self.chunks
            .set_position(c.children_indexed + c.children_failed + c.children_dropped);
        self.chunks.set_message(format!(
            "embedded {} reused {} indexed {} failed {} | {:.0} tokens/s",
            s.stats.chunks(),
            s.stats.reused(),
            c.children_indexed,
            c.children_failed,
            s.stats.tokens() as f64 / secs
        ));
    }

    fn finish(&mut self) {
        self.documents.finish_and_clear();
        self.chunks.finish_and_clear();
    }
}

/// One line on standard error every `every`, for logs and pipes.
pub struct LogLines {
    every: Duration,
    last: Option<Instant>,
}

impl LogLines {
    pub fn new(every: Duration) -> Self {
        LogLines { every, last: None }
    }
}

impl Observer for LogLines {
    fn tick(&mut self, s: &Snapshot<'_>) {
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        self.last = Some(Instant::now());
        let c = s.counts;
        let secs = s.elapsed.as_secs_f64().max(1e-3);
        let total = if s.announced > 0 {
            format!("/{}", s.announced)
        } else {
            String::new()
        };
        let _ = writeln!(
            std::io::stderr(),
            "[{:>6.1}s] documents {}{total} done (indexed {}, failed {}, dropped {}), \
             chunks {} created {} embedded {} reused {} indexed, {:.0} docs/s, {:.0} tokens/s",
            secs,
            s.documents_done(),
            c.indexed,
            c.failed,
            c.dropped,
            c.children_created,
            s.stats.chunks(),
            s.stats.reused(),
            c.children_indexed,
            s.documents_done() as f64 / secs,
            s.stats.tokens() as f64 / secs,
        );
    }
}
