//! Rate limits as a service states them (OpenAI's RPM/TPM model): at most N requests and T
//! tokens per minute, shared by every worker of the process that calls the same endpoint. A
//! caller takes what a request costs before sending it; when the minute's budget is spent,
//! the caller waits (nothing fails) until enough of it frees up.
//!
//! Each limit is a sliding window: what was sent in the last 60 seconds, by time. A send is
//! allowed when it fits beside what the window holds, so *no* span of 60 seconds ever sees
//! more than the limit (a token bucket, by contrast, lets a full bucket plus a minute's refill
//! through in the first minute: twice the limit). A request costing more than the whole limit
//! waits for an empty window and goes alone.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The span a limit counts over.
pub const MINUTE: Duration = Duration::from_secs(60);

/// One limit: at most `limit` units in any span of `span`.
#[derive(Debug, Clone)]
pub struct Window {
    limit: u64,
    span: Duration,
    sent: VecDeque<(Instant, u64)>,
    total: u64,
}

impl Window {
    pub fn new(limit: u64, span: Duration) -> Window {
        Window {
            limit,
            span,
            sent: VecDeque::new(),
            total: 0,
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(at, cost)) = self.sent.front() {
            if now.saturating_duration_since(at) >= self.span {
                self.sent.pop_front();
                self.total -= cost;
            } else {
                break;
            }
        }
    }

    /// How long until `cost` more fits (zero: now). A cost over the limit needs an empty
    /// window.
    pub fn wait_for(&mut self, cost: u64, now: Instant) -> Duration {
        self.expire(now);
        let need = cost.min(self.limit);
        let mut free = self.limit - self.total.min(self.limit);
        if free >= need {
            return Duration::ZERO;
        }
        // The oldest sends leave the window first.
        for &(at, c) in &self.sent {
            free += c;
            if free >= need {
                return (at + self.span).saturating_duration_since(now);
            }
        }
        Duration::ZERO
    }

    /// Record `cost` sent at `now`.
    pub fn take(&mut self, cost: u64, now: Instant) {
        self.expire(now);
        self.sent.push_back((now, cost));
        self.total += cost;
    }

    /// What the window holds now.
    pub fn used(&mut self, now: Instant) -> u64 {
        self.expire(now);
        self.total
    }
}

/// Requests and tokens per minute for one endpoint; `None` is no limit.
#[derive(Debug)]
pub struct RateLimiter {
    state: Mutex<Windows>,
    woken: Condvar,
}

#[derive(Debug)]
struct Windows {
    requests: Option<Window>,
    tokens: Option<Window>,
    /// Nobody sends before this (a 429's Retry-After applies to every worker).
    paused_until: Option<Instant>,
}

impl RateLimiter {
    pub fn new(rpm: Option<u64>, tpm: Option<u64>) -> RateLimiter {
        RateLimiter {
            state: Mutex::new(Windows {
                requests: rpm.filter(|n| *n > 0).map(|n| Window::new(n, MINUTE)),
                tokens: tpm.filter(|n| *n > 0).map(|n| Window::new(n, MINUTE)),
                paused_until: None,
            }),
            woken: Condvar::new(),
        }
    }

    /// Count one request of `tokens` tokens sent at `now` if it may go now; else how long
    /// to wait before asking again (for async callers, which sleep instead of blocking).
    pub fn try_acquire(&self, tokens: u64, now: Instant) -> Result<(), Duration> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut wait = s
            .paused_until
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        if let Some(w) = s.requests.as_mut() {
            wait = wait.max(w.wait_for(1, now));
        }
        if let Some(w) = s.tokens.as_mut() {
            wait = wait.max(w.wait_for(tokens, now));
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        if let Some(w) = s.requests.as_mut() {
            w.take(1, now);
        }
        if let Some(w) = s.tokens.as_mut() {
            w.take(tokens, now);
        }
        Ok(())
    }

    /// Wait (blocking this thread) until one request of `tokens` tokens may go, and count
    /// it. Returns how long it waited.
    pub fn acquire(&self, tokens: u64) -> Duration {
        let started = Instant::now();
        loop {
            match self.try_acquire(tokens, Instant::now()) {
                Ok(()) => return started.elapsed(),
                Err(wait) => {
                    let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = self.woken.wait_timeout(s, wait);
                }
            }
        }
    }

    /// The service said to wait (429/503 with Retry-After): nobody sends before `until`.
    pub fn pause_until(&self, until: Instant) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.paused_until.is_none_or(|t| t < until) {
            s.paused_until = Some(until);
        }
        drop(s);
        self.woken.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_window_frees_what_was_sent_a_minute_ago() {
        let t0 = Instant::now();
        let mut w = Window::new(600, MINUTE);
        assert_eq!(w.wait_for(600, t0), Duration::ZERO);
        w.take(400, t0);
        w.take(200, t0 + Duration::from_secs(10));
        // Full: 100 more fit when the first send leaves, at t0 + 60 s.
        assert_eq!(
            w.wait_for(100, t0 + Duration::from_secs(30)),
            Duration::from_secs(30)
        );
        // 500 need both sends gone: the second leaves at t0 + 70 s.
        assert_eq!(
            w.wait_for(500, t0 + Duration::from_secs(65)),
            Duration::from_secs(5)
        );
        assert_eq!(w.used(t0 + Duration::from_secs(65)), 200);
        // A cost over the limit waits for an empty window.
        assert_eq!(
            w.wait_for(5_000, t0 + Duration::from_secs(65)),
            Duration::from_secs(5)
        );
        assert_eq!(
            w.wait_for(5_000, t0 + Duration::from_secs(70)),
            Duration::ZERO
        );
    }

    proptest! {
        /// Whatever the request sizes and timing, a sender that waits as told never has more
        /// than the limit in any span of a minute (a request over the limit alone excepted).
        #[test]
        fn no_minute_ever_holds_more_than_the_limit(
            costs in proptest::collection::vec(1u64..2_000, 1..300),
            gaps in proptest::collection::vec(0u64..5_000, 1..300),
        ) {
            let limit = 6_000u64;
            let t0 = Instant::now();
            let mut w = Window::new(limit, MINUTE);
            let mut now = t0;
            let mut log: Vec<(Instant, u64)> = Vec::new();
            for (i, cost) in costs.iter().enumerate() {
                now += Duration::from_millis(gaps[i % gaps.len()]);
                now += w.wait_for(*cost, now);
                w.take(*cost, now);
                log.push((now, *cost));
                // Every minute ending now.
                let in_minute: u64 = log
                    .iter()
                    .filter(|(at, _)| now.duration_since(*at) < MINUTE)
                    .map(|(_, c)| c)
                    .sum();
                prop_assert!(in_minute <= limit, "{in_minute} > {limit}");
            }
        }
    }

    #[test]
    fn retry_after_pauses_every_sender() {
        let l = RateLimiter::new(None, None);
        l.pause_until(Instant::now() + Duration::from_millis(200));
        // A lower bound only: the pause cannot end early, however loaded the machine.
        let waited = l.acquire(1);
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
    }
}
