//! Dynamic batching across requests (the TEI approach): requests' inputs, already tokenized,
//! wait in one bounded queue; each model thread (one per device) takes whole requests until
//! its window holds `window_tokens` tokens or the first of them has waited `max_wait`, embeds
//! the window as length-sorted batches of at most `batch_tokens` padded tokens
//! ([`crate::embed::window::embed_window`]: identical inputs computed once), and answers each
//! request with its vectors.
//!
//! The queue is bounded in tokens: a request that does not fit is refused at once
//! ([`Admission::Full`]; the server answers 503 with Retry-After) instead of memory growing
//! with the load.
//!
//! A panic while a window is embedded fails that window's requests (500 with the reason) and
//! the model thread goes on. A model thread that ends anyway is counted out; when none is
//! left, what is queued fails at once and new requests are refused ([`Admission::NoModel`]),
//! so nothing waits for ever and `/health` can say so.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::embed::encoder::Encoder;
use crate::embed::window::{embed_window, Outcome, Recent, WindowItem};
use crate::stats::RunStats;

/// One request's inputs, waiting for the model.
pub struct Job {
    /// Content ids of each input (prompt excluded; the encoder's prompt is not used here:
    /// `prompt` is).
    pub inputs: Vec<Vec<u32>>,
    /// Ids put before each input.
    pub prompt: Vec<u32>,
    pub enqueued: Instant,
    /// A person waits for it (a search query): its window goes at once with whatever is
    /// queued, without waiting `max_wait` for company.
    pub interactive: bool,
    pub reply: tokio::sync::oneshot::Sender<JobResult>,
}

/// A request's vectors, or why it has none.
pub type JobResult = Result<Vec<Vec<f32>>, ModelFailed>;

/// Why a model thread gave a job no answer (the model failed on it, or panicked): the message
/// is the request's answer (HTTP 500).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ModelFailed(pub String);

/// What waits in a [`Batcher`]: a request's work for one model (embedding, reranking,
/// sparse embedding).
pub trait Queued: Send {
    /// Tokens it will compute (what the queue is bounded by).
    fn tokens(&self) -> usize;
    fn enqueued(&self) -> Instant;
    /// A person waits for it: its window goes at once.
    fn interactive(&self) -> bool {
        false
    }
    /// Answer it with an error.
    fn fail(self, why: String);
}

impl Queued for Job {
    fn tokens(&self) -> usize {
        self.inputs
            .iter()
            .map(|i| i.len() + self.prompt.len() + 2)
            .sum()
    }
    fn enqueued(&self) -> Instant {
        self.enqueued
    }
    fn interactive(&self) -> bool {
        self.interactive
    }
    fn fail(self, why: String) {
        let _ = self.reply.send(Err(ModelFailed(why)));
    }
}

/// What the queue said to a job.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Queued,
    /// The queue holds `tokens` tokens already, its limit: come back later.
    Full {
        tokens: usize,
    },
    /// The server is stopping.
    Closed,
    /// No model thread is running any more.
    NoModel,
}

/// What a model thread did with one window, for the metrics.
#[derive(Clone, Debug, Default)]
pub struct WindowReport {
    pub requests: usize,
    pub inputs: usize,
    pub tokens: usize,
    pub batches: u64,
    pub queue_waits: Vec<Duration>,
    pub compute: Duration,
}

struct State<J> {
    jobs: VecDeque<(J, usize)>,
    closed: bool,
    /// Model threads running, and whether any ever ran.
    models: usize,
    started: bool,
}

/// The shared queue of jobs (embedding requests unless said otherwise).
pub struct Batcher<J: Queued = Job> {
    state: Mutex<State<J>>,
    ready: Condvar,
    /// Tokens waiting, and the most that may wait.
    queued_tokens: AtomicUsize,
    max_queued_tokens: usize,
    queued_jobs: AtomicUsize,
    /// Served so far (for the metrics).
    pub served_inputs: AtomicU64,
}

impl<J: Queued> Batcher<J> {
    pub fn new(max_queued_tokens: usize) -> Arc<Batcher<J>> {
        Arc::new(Batcher {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                closed: false,
                models: 0,
                started: false,
            }),
            ready: Condvar::new(),
            queued_tokens: AtomicUsize::new(0),
            max_queued_tokens: max_queued_tokens.max(1),
            queued_jobs: AtomicUsize::new(0),
            served_inputs: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tokens waiting for a model thread.
    pub fn queued_tokens(&self) -> usize {
        self.queued_tokens.load(Ordering::Relaxed)
    }

    /// The queue is at its limit: a request would be refused (checked before the work of
    /// tokenizing one that could not be queued).
    pub fn is_full(&self) -> bool {
        self.queued_tokens.load(Ordering::Relaxed) >= self.max_queued_tokens
    }

    /// Requests waiting for a model thread.
    pub fn queued_jobs(&self) -> usize {
        self.queued_jobs.load(Ordering::Relaxed)
    }

    /// Queue a job, unless the queue is full (a job alone in an empty queue always fits, so a
    /// request larger than the limit is not refused forever).
    pub fn submit(&self, job: J) -> (Admission, Option<J>) {
        let tokens = job.tokens();
        let mut s = self.lock();
        if s.closed {
            return (Admission::Closed, Some(job));
        }
        if s.started && s.models == 0 {
            return (Admission::NoModel, Some(job));
        }
        let queued = self.queued_tokens.load(Ordering::Relaxed);
        if queued > 0 && queued + tokens > self.max_queued_tokens {
            return (Admission::Full { tokens: queued }, Some(job));
        }
        self.queued_tokens.fetch_add(tokens, Ordering::Relaxed);
        self.queued_jobs.fetch_add(1, Ordering::Relaxed);
        s.jobs.push_back((job, tokens));
        drop(s);
        self.ready.notify_one();
        (Admission::Queued, None)
    }

    /// True once every model thread that ran has ended.
    pub fn models_gone(&self) -> bool {
        let s = self.lock();
        s.started && s.models == 0
    }

    /// A model thread ended: when it was the last, fail what waits.
    fn model_ended(&self, label: &str) {
        let orphans: Vec<(J, usize)> = {
            let mut s = self.lock();
            s.models = s.models.saturating_sub(1);
            if s.models > 0 {
                return;
            }
            s.jobs.drain(..).collect()
        };
        for (job, tokens) in orphans {
            self.queued_tokens.fetch_sub(tokens, Ordering::Relaxed);
            self.queued_jobs.fetch_sub(1, Ordering::Relaxed);
            job.fail(format!(
                "the model thread ({label}) stopped; no model is running"
            ));
        }
    }

    /// Refuse new jobs; model threads finish what is queued, then stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// The next window: whole jobs up to `window_tokens` (at least one), waiting at most
    /// `max_wait` after the first for company. None when closed and drained.
    fn next_window(&self, window_tokens: usize, max_wait: Duration) -> Option<Vec<J>> {
        let mut s = self.lock();
        // Wait for a first job.
        while s.jobs.is_empty() {
            if s.closed {
                return None;
            }
            s = self
                .ready
                .wait_timeout(s, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let deadline = s.jobs.front().map(|(j, _)| j.enqueued() + max_wait);
        let mut taken = Vec::new();
        let mut tokens = 0usize;
        loop {
            while let Some((_, t)) = s.jobs.front() {
                if !taken.is_empty() && tokens + t > window_tokens {
                    break;
                }
                let (job, t) = s.jobs.pop_front().expect("looked at it");
                tokens += t;
                self.queued_tokens.fetch_sub(t, Ordering::Relaxed);
                self.queued_jobs.fetch_sub(1, Ordering::Relaxed);
                taken.push(job);
            }
            let now = Instant::now();
            let urgent = taken.iter().any(|j| j.interactive());
            let full = tokens >= window_tokens || !s.jobs.is_empty() || urgent;
            match deadline {
                Some(d) if !full && now < d && !s.closed => {
                    s = self
                        .ready
                        .wait_timeout(s, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                _ => break,
            }
        }
        Some(taken)
    }

    /// A model thread's loop: windows of whole jobs (up to `window_tokens`, waiting at most
    /// `max_wait` for company) handed to `window` until the batcher is closed and drained.
    /// However the thread ends (a panic outside a window included), it is counted out.
    pub fn run_windows(
        &self,
        label: &str,
        window_tokens: usize,
        max_wait: Duration,
        mut window: impl FnMut(Vec<J>),
    ) {
        {
            let mut s = self.lock();
            s.models += 1;
            s.started = true;
        }
        struct Running<'a, J: Queued>(&'a Batcher<J>, &'a str);
        impl<J: Queued> Drop for Running<'_, J> {
            fn drop(&mut self) {
                self.0.model_ended(self.1);
            }
        }
        let _running = Running(self, label);
        while let Some(jobs) = self.next_window(window_tokens, max_wait) {
            window(jobs);
        }
    }
}

impl Batcher<Job> {
    /// A model thread: windows until the batcher is closed and drained. `report` hears about
    /// each window.
    pub fn run_model(
        &self,
        encoder: &(dyn Encoder + Sync),
        label: &str,
        batch_tokens: usize,
        window_tokens: usize,
        max_wait: Duration,
        report: &(dyn Fn(&WindowReport) + Sync),
    ) {
        let stats = RunStats::default();
        let mut recent = Recent::new(crate::embed::pool::RECENT_VECTORS);
        self.run_windows(label, window_tokens, max_wait, |jobs| {
            let started = Instant::now();
            let mut rep = WindowReport {
                requests: jobs.len(),
                queue_waits: jobs.iter().map(|j| started - j.enqueued).collect(),
                ..WindowReport::default()
            };
            // One prompt per window: jobs with another prompt wait for the next pass.
            let mut groups: Vec<(Vec<u32>, Vec<Job>)> = Vec::new();
            for job in jobs {
                match groups.iter_mut().find(|(p, _)| *p == job.prompt) {
                    Some((_, g)) => g.push(job),
                    None => groups.push((job.prompt.clone(), vec![job])),
                }
            }
            for (prompt, jobs) in groups {
                let batches_before = stats.batches.load(Ordering::Relaxed);
                let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    #[cfg(feature = "failpoints")]
                    fail::fail_point!("serve-model");
                    embed_jobs(
                        encoder,
                        label,
                        &prompt,
                        &jobs,
                        batch_tokens,
                        &mut recent,
                        &stats,
                    )
                }));
                let results = match results {
                    Ok(r) => r,
                    Err(panic) => {
                        // What the window cached may be half-written: start it afresh.
                        recent = Recent::new(crate::embed::pool::RECENT_VECTORS);
                        jobs.iter()
                            .map(|_| Err(ModelFailed(panic_message(&*panic))))
                            .collect()
                    }
                };
                rep.batches += stats.batches.load(Ordering::Relaxed) - batches_before;
                for (job, result) in jobs.into_iter().zip(results) {
                    rep.inputs += job.inputs.len();
                    rep.tokens += job.inputs.iter().map(|i| i.len() + 2).sum::<usize>();
                    self.served_inputs
                        .fetch_add(job.inputs.len() as u64, Ordering::Relaxed);
                    let _ = job.reply.send(result);
                }
            }
            rep.compute = started.elapsed();
            report(&rep);
        });
    }
}

/// What a request hears when the model panicked on its window.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let why = crate::panics::message(panic);
    format!("the model failed on this request's batch ({why}); the server goes on")
}

/// Embed the inputs of `jobs` as one window; each job's vectors, or its error.
fn embed_jobs(
    encoder: &(dyn Encoder + Sync),
    label: &str,
    prompt: &[u32],
    jobs: &[Job],
    batch_tokens: usize,
    recent: &mut Recent,
    stats: &RunStats,
) -> Vec<JobResult> {
    // The window puts the encoder's passage prompt before every input (and leaves it out of
    // pooling where the model says so): here that is this group's prompt. The keys of the
    // vectors remembered across windows include it.
    let items: Vec<WindowItem<'_>> = jobs
        .iter()
        .flat_map(|j| j.inputs.iter())
        .map(|ids| WindowItem {
            ids,
            key: Some(crate::document::Chunk::input_key_of(
                &[prompt, ids.as_slice()].concat(),
            )),
            text: "",
        })
        .collect();
    let mut out: Vec<Option<Result<Vec<f32>, ModelFailed>>> = vec![None; items.len()];
    let mut sink = |i: usize, o: Outcome| {
        out[i] = Some(match o {
            Outcome::Embedded(v) | Outcome::Reused(v) => Ok(v),
            Outcome::Failed(r) => Err(ModelFailed(r)),
        });
        true
    };
    embed_window(
        &Prompted { encoder, prompt },
        &items,
        batch_tokens,
        recent,
        stats,
        label,
        &mut sink,
    );
    let mut results = Vec::with_capacity(jobs.len());
    let mut it = out.into_iter();
    for job in jobs {
        let mut vectors = Vec::with_capacity(job.inputs.len());
        let mut error = None;
        for _ in 0..job.inputs.len() {
            match it.next().flatten() {
                Some(Ok(v)) => vectors.push(v),
                Some(Err(e)) => error = error.or(Some(e)),
                None => error = error.or(Some(ModelFailed("no vector computed: a bug".into()))),
            }
        }
        results.push(match error {
            Some(e) => Err(e),
            None => Ok(vectors),
        });
    }
    results
}

/// The server's encoder with a request's prompt as its passage prompt.
struct Prompted<'a> {
    encoder: &'a (dyn Encoder + Sync),
    prompt: &'a [u32],
}

impl Encoder for Prompted<'_> {
    fn max_content_len(&self) -> usize {
        self.encoder.max_content_len()
    }
    fn passage_prompt_ids(&self) -> &[u32] {
        self.prompt
    }
    fn plan_batches(&self, lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
        self.encoder.plan_batches(lengths, budget)
    }
    fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize {
        self.encoder.computed_tokens(lengths, batch)
    }
    fn embed_ids(
        &self,
        seqs: &[&[u32]],
        prompt: &[u32],
    ) -> Result<Vec<Vec<f32>>, crate::embed::EmbedError> {
        self.encoder.embed_ids(seqs, prompt)
    }
    fn content_ids(&self, text: &str) -> Result<Vec<u32>, crate::embed::EmbedError> {
        self.encoder.content_ids(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(inputs: Vec<Vec<u32>>) -> (Job, tokio::sync::oneshot::Receiver<JobResult>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (
            Job {
                inputs,
                prompt: Vec::new(),
                enqueued: Instant::now(),
                interactive: false,
                reply: tx,
            },
            rx,
        )
    }

    /// A search query's job does not wait `max_wait` for company: with an hour's wait, the
    /// window comes back (a plain job would hold it for the hour).
    #[test]
    fn an_interactive_job_goes_at_once() {
        let b = Arc::new(Batcher::new(1000));
        let (mut query, _rx) = job(vec![vec![1; 4]]);
        query.interactive = true;
        assert_eq!(b.submit(query).0, Admission::Queued);
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = Arc::clone(&b);
        std::thread::spawn(move || {
            let w = b2.next_window(1000, Duration::from_secs(3600));
            let _ = tx.send(w.map(|w| w.len()));
        });
        // Generous: a liveness check, not a timing (a plain job would take an hour).
        assert_eq!(rx.recv_timeout(Duration::from_secs(120)), Ok(Some(1)));
    }

    #[test]
    fn a_full_queue_refuses_but_an_empty_one_takes_anything() {
        let b = Batcher::new(10);
        let (big, _rx) = job(vec![vec![1; 50]]);
        assert_eq!(b.submit(big).0, Admission::Queued);
        assert_eq!(b.queued_tokens(), 52);
        let (small, _rx2) = job(vec![vec![1; 1]]);
        let (admission, back) = b.submit(small);
        assert_eq!(admission, Admission::Full { tokens: 52 });
        assert!(back.is_some());
        // A window takes the queued job, freeing the room.
        let window = b.next_window(1000, Duration::ZERO).unwrap();
        assert_eq!(window.len(), 1);
        assert_eq!(b.queued_tokens(), 0);
        let (small, _rx3) = job(vec![vec![1; 1]]);
        assert_eq!(b.submit(small).0, Admission::Queued);
        b.close();
        let (late, _rx4) = job(vec![vec![1]]);
        assert_eq!(b.submit(late).0, Admission::Closed);
        // Closed: what was queued is still handed out, then nothing.
        assert_eq!(b.next_window(1000, Duration::ZERO).unwrap().len(), 1);
        assert!(b.next_window(1000, Duration::ZERO).is_none());
    }

    #[test]
    fn windows_take_whole_jobs_up_to_their_tokens() {
        let b = Batcher::new(1_000_000);
        let mut rxs = Vec::new();
        for n in [10, 10, 10, 10] {
            let (j, rx) = job(vec![vec![1; n - 2]]);
            b.submit(j);
            rxs.push(rx);
        }
        // 25 tokens: two jobs of 10 fit, the third would not.
        assert_eq!(b.next_window(25, Duration::ZERO).unwrap().len(), 2);
        assert_eq!(b.next_window(1000, Duration::ZERO).unwrap().len(), 2);
    }

    /// An encoder that panics on inputs holding the id 666, and embeds the rest as [len].
    struct Fragile;

    impl Encoder for Fragile {
        fn max_content_len(&self) -> usize {
            100
        }
        fn passage_prompt_ids(&self) -> &[u32] {
            &[]
        }
        fn plan_batches(&self, lengths: &[usize], _budget: usize) -> Vec<Vec<usize>> {
            vec![(0..lengths.len()).collect()]
        }
        fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize {
            batch.iter().map(|&i| lengths[i]).sum()
        }
        fn embed_ids(
            &self,
            seqs: &[&[u32]],
            _prompt: &[u32],
        ) -> Result<Vec<Vec<f32>>, crate::embed::EmbedError> {
            assert!(!seqs.iter().any(|s| s.contains(&666)), "poisoned input");
            Ok(seqs.iter().map(|s| vec![s.len() as f32]).collect())
        }
        fn content_ids(&self, _text: &str) -> Result<Vec<u32>, crate::embed::EmbedError> {
            Ok(Vec::new())
        }
    }

    /// An encoder that embeds a sequence as [prompt length, sequence length, first id].
    struct Echo;

    impl Encoder for Echo {
        fn max_content_len(&self) -> usize {
            100
        }
        fn passage_prompt_ids(&self) -> &[u32] {
            &[]
        }
        fn plan_batches(&self, lengths: &[usize], _budget: usize) -> Vec<Vec<usize>> {
            vec![(0..lengths.len()).collect()]
        }
        fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize {
            batch.iter().map(|&i| lengths[i]).sum()
        }
        fn embed_ids(
            &self,
            seqs: &[&[u32]],
            prompt: &[u32],
        ) -> Result<Vec<Vec<f32>>, crate::embed::EmbedError> {
            Ok(seqs
                .iter()
                .map(|s| vec![prompt.len() as f32, s.len() as f32, s[0] as f32])
                .collect())
        }
        fn content_ids(&self, _text: &str) -> Result<Vec<u32>, crate::embed::EmbedError> {
            Ok(Vec::new())
        }
    }

    /// A request's prompt reaches the model as the prompt (so pooling can leave it out where
    /// the model says so), not as content; the same content under another prompt is not
    /// taken from the vectors remembered for the first.
    #[test]
    fn a_requests_prompt_reaches_the_model_as_its_prompt() {
        let b = Batcher::new(1_000_000);
        let (mut prompted, prompted_rx) = job(vec![vec![5, 6, 7]]);
        prompted.prompt = vec![9, 9];
        b.submit(prompted);
        std::thread::scope(|s| {
            s.spawn(|| {
                b.run_model(&Echo, "test", 1000, 1000, Duration::ZERO, &|_| {});
            });
            let got = prompted_rx.blocking_recv().unwrap().unwrap();
            assert_eq!(got, vec![vec![2.0, 3.0, 5.0]]);
            let (plain, plain_rx) = job(vec![vec![5, 6, 7]]);
            b.submit(plain);
            let got = plain_rx.blocking_recv().unwrap().unwrap();
            assert_eq!(got, vec![vec![0.0, 3.0, 5.0]]);
            b.close();
        });
    }

    #[test]
    fn a_panic_in_the_model_fails_its_requests_and_the_thread_goes_on() {
        let b = Batcher::new(1_000_000);
        let (bad, bad_rx) = job(vec![vec![666, 1]]);
        b.submit(bad);
        let (good, good_rx) = job(vec![vec![1, 2, 3]]);
        std::thread::scope(|s| {
            s.spawn(|| {
                b.run_model(&Fragile, "test", 1000, 1000, Duration::ZERO, &|_| {});
            });
            let got = bad_rx.blocking_recv().unwrap();
            assert!(got.unwrap_err().0.contains("poisoned input"));
            // The thread is still there: the next request is answered.
            b.submit(good);
            assert_eq!(good_rx.blocking_recv().unwrap().unwrap(), vec![vec![3.0]]);
            assert!(!b.models_gone());
            b.close();
        });
        // Once its only model thread ended, nothing waits for ever.
        assert!(b.models_gone());
    }

    #[test]
    fn when_the_last_model_thread_ends_queued_requests_fail_and_new_ones_are_refused() {
        let b = Batcher::new(1_000_000);
        {
            let mut s = b.lock();
            s.models = 1;
            s.started = true;
        }
        let (queued, rx) = job(vec![vec![1]]);
        assert_eq!(b.submit(queued).0, Admission::Queued);
        b.model_ended("cuda:0");
        assert!(rx
            .blocking_recv()
            .unwrap()
            .unwrap_err()
            .0
            .contains("cuda:0"));
        assert_eq!(b.queued_tokens(), 0);
        let (late, _rx) = job(vec![vec![1]]);
        assert_eq!(b.submit(late).0, Admission::NoModel);
        assert!(b.models_gone());
    }
}
