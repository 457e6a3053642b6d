//! Embedding a stream of texts (`ragline embed`, `ragline bench`): tokenization spread over
//! all cores on one thread while the model runs on another, length-sorted batches by a token
//! budget, results in input order.

use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::model::EmbeddingModel;
use super::EmbedError;

/// Texts tokenized together, then sorted and batched together.
pub const WINDOW_TEXTS: usize = 8192;

/// Figures of one embedding job.
#[derive(Clone, Debug, Default)]
pub struct EmbedStats {
    pub texts: usize,
    /// Real tokens, special tokens included.
    pub tokens: usize,
    /// Tokens computed including padding.
    pub padded_tokens: usize,
    pub batches: usize,
    pub tokenize_time: Duration,
    pub model_time: Duration,
}

/// Embed `texts` with the `prompt` ids before each, in batches of at most `batch_tokens`
/// padded tokens. `each` receives every vector in input order, with its index.
pub fn embed_texts<S: AsRef<str> + Sync>(
    model: &EmbeddingModel,
    texts: &[S],
    prompt: &[u32],
    batch_tokens: usize,
    mut each: impl FnMut(usize, Vec<f32>) -> Result<(), EmbedError>,
) -> Result<EmbedStats, EmbedError> {
    let mut stats = EmbedStats::default();
    let windows: Vec<&[S]> = texts.chunks(WINDOW_TEXTS).collect();
    let specials = {
        let (a, b) = model.tokenizer.specials();
        a.len() + b.len()
    };
    // Tokenize window i+1 (on the rayon pool, from a helper thread) while window i runs.
    std::thread::scope(|scope| -> Result<(), EmbedError> {
        let (tx, rx) =
            crossbeam_channel::bounded::<(usize, Result<Vec<Vec<u32>>, EmbedError>, Duration)>(1);
        let tokenizer = &model.tokenizer;
        let windows_ref = &windows;
        scope.spawn(move || {
            for (w, window) in windows_ref.iter().enumerate() {
                let started = Instant::now();
                let ids: Result<Vec<Vec<u32>>, EmbedError> = window
                    .par_iter()
                    .map(|t| tokenizer.ids_for_embedding(t.as_ref(), prompt))
                    .collect();
                if tx.send((w, ids, started.elapsed())).is_err() {
                    return;
                }
            }
        });
        for (w, ids, took) in rx {
            stats.tokenize_time += took;
            let ids = ids?;
            let base = w * WINDOW_TEXTS;
            let lengths: Vec<usize> = ids
                .iter()
                .map(|s| s.len() + prompt.len() + specials)
                .collect();
            let mut out: Vec<Option<Vec<f32>>> = vec![None; ids.len()];
            let started = Instant::now();
            let plans = model.plan_batches(&lengths, batch_tokens);
            let batches: Vec<Vec<&[u32]>> = plans
                .iter()
                .map(|plan| plan.iter().map(|&i| ids[i].as_slice()).collect())
                .collect();
            let mut failed = None;
            model.embed_batches(&batches, prompt, |b, vectors| match vectors {
                Ok(vectors) => {
                    let plan = &plans[b];
                    stats.batches += 1;
                    stats.padded_tokens += model.computed_tokens(&lengths, plan);
                    for (&i, v) in plan.iter().zip(vectors) {
                        out[i] = Some(v);
                    }
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            stats.model_time += started.elapsed();
            stats.tokens += lengths.iter().sum::<usize>();
            stats.texts += ids.len();
            for (i, v) in out.into_iter().enumerate() {
                each(base + i, v.expect("every text is in one batch"))?;
            }
        }
        Ok(())
    })?;
    tracing::info!(
        target: "ragline::embed::profile",
        "texts={} tokens={} padded_tokens={} batches={} tokenize_s={:.3} model_s={:.3}",
        stats.texts,
        stats.tokens,
        stats.padded_tokens,
        stats.batches,
        stats.tokenize_time.as_secs_f64(),
        stats.model_time.as_secs_f64()
    );
    Ok(stats)
}
