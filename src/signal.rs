//! The run's stop signal, shared by every thread of a run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Tells the threads of a run to stop: because the run is complete, or because something it
/// cannot go on without broke (then `abort_reason` says what).
#[derive(Debug, Default)]
pub struct RunSignal {
    stopped: AtomicBool,
    abort: Mutex<Option<String>>,
}

impl RunSignal {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// The run is complete (or the caller gave up): threads finish what they hold and exit.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// The run cannot go on. The first reason given wins.
    pub fn abort(&self, reason: impl Into<String>) {
        let mut slot = self.abort.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(reason.into());
        }
        drop(slot);
        self.stop();
    }

    pub fn abort_reason(&self) -> Option<String> {
        self.abort.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
