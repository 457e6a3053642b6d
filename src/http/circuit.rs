//! A circuit breaker per endpoint. While requests succeed it is closed. After `threshold`
//! failures in a row (connection refused, timeouts, 5xx: the endpoint, not one input) it
//! opens: callers stop sending and wait instead of burning their retries, and one probe is let
//! through every `cooldown`. A probe that succeeds closes it; one that fails keeps it open.
//! Callers wait while it is open, so a run outlives an outage of any length and nothing fails
//! for it; whoever watches the breaker (`ragline status`, the metrics) is told when it opens and
//! closes.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Failures in a row that open the circuit.
pub const DEFAULT_THRESHOLD: u32 = 5;
/// How often an open circuit lets a probe through.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(2);

/// Where a circuit stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    /// Open since `since`, after `reason`.
    Open {
        since: Instant,
        reason: String,
    },
}

/// What a caller may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permit {
    /// Send.
    Go,
    /// Send: this request is the probe of an open circuit.
    Probe,
    /// Do not send; ask again after this long.
    Wait(Duration),
}

/// A change of state, for whoever reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Opened(String),
    Closed,
}

#[derive(Debug)]
struct Inner {
    state: CircuitState,
    failures: u32,
    /// When an open circuit last let a probe through (and whether it is still out).
    probe_at: Option<Instant>,
    probing: bool,
}

#[derive(Debug)]
pub struct Circuit {
    threshold: u32,
    cooldown: Duration,
    inner: Mutex<Inner>,
    woken: Condvar,
}

impl Circuit {
    pub fn new(threshold: u32, cooldown: Duration) -> Circuit {
        Circuit {
            threshold: threshold.max(1),
            cooldown,
            inner: Mutex::new(Inner {
                state: CircuitState::Closed,
                failures: 0,
                probe_at: None,
                probing: false,
            }),
            woken: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> CircuitState {
        self.lock().state.clone()
    }

    /// May a request go now?
    pub fn permit(&self, now: Instant) -> Permit {
        let mut s = self.lock();
        match &s.state {
            CircuitState::Closed => Permit::Go,
            CircuitState::Open { .. } => {
                let due = s.probe_at.map_or(now, |t| t + self.cooldown);
                if !s.probing && now >= due {
                    s.probing = true;
                    s.probe_at = Some(now);
                    Permit::Probe
                } else {
                    let next = if s.probing {
                        self.cooldown
                    } else {
                        due.saturating_duration_since(now)
                    };
                    Permit::Wait(next.max(Duration::from_millis(10)))
                }
            }
        }
    }

    /// Wait (blocking) until a request may go; returns whether it is the probe.
    pub fn wait_permit(&self) -> bool {
        loop {
            match self.permit(Instant::now()) {
                Permit::Go => return false,
                Permit::Probe => return true,
                Permit::Wait(d) => {
                    let s = self.lock();
                    let _ = self.woken.wait_timeout(s, d);
                }
            }
        }
    }

    /// A request got an answer from the endpoint (whatever its verdict on the input).
    pub fn success(&self) -> Option<Change> {
        let mut s = self.lock();
        s.failures = 0;
        s.probing = false;
        let change = match s.state {
            CircuitState::Open { .. } => {
                s.state = CircuitState::Closed;
                s.probe_at = None;
                Some(Change::Closed)
            }
            CircuitState::Closed => None,
        };
        drop(s);
        if change.is_some() {
            self.woken.notify_all();
        }
        change
    }

    /// A request failed because of the endpoint (no answer, 5xx).
    pub fn failure(&self, reason: &str, now: Instant) -> Option<Change> {
        let mut s = self.lock();
        s.failures = s.failures.saturating_add(1);
        s.probing = false;
        match s.state {
            CircuitState::Closed if s.failures >= self.threshold => {
                s.state = CircuitState::Open {
                    since: now,
                    reason: reason.to_string(),
                };
                s.probe_at = Some(now);
                Some(Change::Opened(reason.to_string()))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_probes_and_closes() {
        let c = Circuit::new(3, Duration::from_secs(2));
        let t = Instant::now();
        assert_eq!(c.failure("refused", t), None);
        assert_eq!(c.failure("refused", t), None);
        // A success in between resets the count.
        assert_eq!(c.success(), None);
        assert_eq!(c.failure("refused", t), None);
        assert_eq!(c.failure("refused", t), None);
        assert_eq!(c.permit(t), Permit::Go);
        assert_eq!(
            c.failure("refused", t),
            Some(Change::Opened("refused".into()))
        );
        assert!(matches!(c.state(), CircuitState::Open { .. }));
        // Open: nothing goes until the cooldown, then exactly one probe.
        assert_eq!(
            c.permit(t + Duration::from_secs(1)),
            Permit::Wait(Duration::from_secs(1))
        );
        let later = t + Duration::from_secs(2);
        assert_eq!(c.permit(later), Permit::Probe);
        assert!(matches!(c.permit(later), Permit::Wait(_)));
        // The probe fails: still open, the next probe a cooldown later.
        assert_eq!(c.failure("refused", later), None);
        assert!(matches!(
            c.permit(later + Duration::from_secs(1)),
            Permit::Wait(_)
        ));
        assert_eq!(c.permit(later + Duration::from_secs(2)), Permit::Probe);
        // The probe succeeds: closed.
        assert_eq!(c.success(), Some(Change::Closed));
        assert_eq!(c.permit(later + Duration::from_secs(2)), Permit::Go);
        assert_eq!(c.state(), CircuitState::Closed);
    }
}
