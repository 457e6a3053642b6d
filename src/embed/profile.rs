//! Where one forward pass spends its time, part by part, for finding what to speed up on a GPU.
//!
//! Off unless `RAGLINE_PROFILE_PARTS=1`: then the encoder waits for the device after each part
//! (which costs throughput: device work no longer overlaps the host's launches) and logs one line
//! per batch at target `ragline::embed::profile` (`RAGLINE_LOG=ragline::embed::profile=info`):
//!
//! ```text
//! parts b=256 len=128 tokens=32768 embeddings=0.10 qkv=0.41 attention=0.80 ... total=4.2 (ms)
//! ```
//!
//! `RAGLINE_PROFILE_PARTS=launch` instead waits only once per batch and logs how long the host
//! took to enqueue the batch's work and how long it then waited for the device.
//!
//! The parts: `embeddings` (gather, positions, norm), `qkv` (the fused product and its bias),
//! `attention` (heads split, scores, mask, softmax, context, heads merged), `attention_out` (the
//! output product, bias and residual), `ffn` (both products, bias, activation, residual),
//! `norms` (the two layer norms of every layer), `pooling` (pooling, the head, the copy back);
//! `encoder`, the whole encoder of a family without the finer parts (the rotary ones).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use candle_core::{Device, Result};

/// The parts, in the order the log line gives them.
pub const PARTS: [&str; 8] = [
    "embeddings",
    "qkv",
    "attention",
    "attention_out",
    "ffn",
    "norms",
    "pooling",
    "encoder",
];

/// What `RAGLINE_PROFILE_PARTS` asks for (read once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// Wait for the device after every part and charge each its time.
    Parts,
    /// `launch`: no waits inside the batch; how long the host took to enqueue the batch's
    /// work, then how long it waited for the results (device-bound when the wait dominates,
    /// launch-bound when the enqueueing does).
    Launch,
}

pub fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("RAGLINE_PROFILE_PARTS").as_deref() {
        Ok("launch") => Mode::Launch,
        Ok("") | Ok("0") | Err(_) => Mode::Off,
        Ok(_) => Mode::Parts,
    })
}

/// Whether the per-part timing is on.
pub fn enabled() -> bool {
    mode() == Mode::Parts
}

/// The clock of one batch: nothing at all when profiling is off.
pub struct Parts {
    on: Option<Clock>,
    /// `launch` mode: when the batch started and when its work was all enqueued.
    launch: Option<(Instant, Option<Instant>)>,
}

struct Clock {
    device: Device,
    last: Instant,
    spent: [Duration; PARTS.len()],
}

impl Parts {
    pub fn start(device: &Device) -> Result<Parts> {
        match mode() {
            Mode::Off => Ok(Parts {
                on: None,
                launch: None,
            }),
            Mode::Launch => {
                device.synchronize()?;
                Ok(Parts {
                    on: None,
                    launch: Some((Instant::now(), None)),
                })
            }
            Mode::Parts => {
                device.synchronize()?;
                Ok(Parts {
                    on: Some(Clock {
                        device: device.clone(),
                        last: Instant::now(),
                        spent: [Duration::ZERO; PARTS.len()],
                    }),
                    launch: None,
                })
            }
        }
    }

    /// The batch's work is all enqueued (`launch` mode): what follows waits for it.
    pub fn enqueued(&mut self) {
        if let Some((_, done)) = &mut self.launch {
            *done = Some(Instant::now());
        }
    }

    /// Charge the time since the last mark (the device's work included) to `part`.
    pub fn mark(&mut self, part: &str) -> Result<()> {
        let Some(clock) = &mut self.on else {
            return Ok(());
        };
        clock.device.synchronize()?;
        let now = Instant::now();
        if let Some(i) = PARTS.iter().position(|p| *p == part) {
            clock.spent[i] += now - clock.last;
        }
        clock.last = now;
        Ok(())
    }

    /// Restart the clock without charging anyone (host work between parts).
    pub fn skip(&mut self) -> Result<()> {
        let Some(clock) = &mut self.on else {
            return Ok(());
        };
        clock.device.synchronize()?;
        clock.last = Instant::now();
        Ok(())
    }

    /// Log the batch's line.
    pub fn finish(self, batch: usize, len: usize, tokens: usize) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if let Some((started, enqueued)) = self.launch {
            let now = Instant::now();
            let enqueued = enqueued.unwrap_or(now);
            tracing::info!(
                target: "ragline::embed::profile",
                "launch b={batch} len={len} tokens={tokens} enqueue={:.3} wait={:.3} (ms)",
                ms(enqueued - started),
                ms(now - enqueued)
            );
            return;
        }
        let Some(clock) = self.on else { return };
        let total: Duration = clock.spent.iter().sum();
        let parts: Vec<String> = PARTS
            .iter()
            .zip(clock.spent)
            .map(|(p, d)| format!("{p}={:.3}", ms(d)))
            .collect();
        tracing::info!(
            target: "ragline::embed::profile",
            "parts b={batch} len={len} tokens={tokens} {} total={:.3} (ms)",
            parts.join(" "),
            ms(total)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_charges_nothing_and_on_charges_the_named_part() {
        let mut off = Parts {
            on: None,
            launch: None,
        };
        off.mark("qkv").unwrap();
        assert!(off.on.is_none());

        let mut on = Parts {
            on: Some(Clock {
                device: Device::Cpu,
                last: Instant::now(),
                spent: [Duration::ZERO; PARTS.len()],
            }),
            launch: None,
        };
        std::thread::sleep(Duration::from_millis(2));
        on.mark("ffn").unwrap();
        on.mark("no such part").unwrap();
        let spent = on.on.as_ref().unwrap().spent;
        let ffn = PARTS.iter().position(|p| *p == "ffn").unwrap();
        assert!(spent[ffn] >= Duration::from_millis(2));
        assert!(spent
            .iter()
            .enumerate()
            .all(|(i, d)| i == ffn || d.is_zero()));
    }
}
