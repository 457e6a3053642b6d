//! Fuzz targets: every decoder of bytes that come from outside, as a function of arbitrary
//! bytes that must return (never panic, abort, hang or allocate beyond what the bytes
//! justify). `scripts/fuzz.sh TARGET SECONDS` runs one under libFuzzer (the `ragline-fuzz`
//! binary, `--features fuzzing`); the test suite runs each over its seeds and the inputs that
//! once broke it (`tests/fuzz/TARGET/`).
//!
//! | target | the bytes are |
//! |---|---|
//! | `wire` | a message from the broker: a batch envelope, documents and events (MessagePack) |
//! | `run_record` | a run's record from the broker's bucket (JSON holding `ragline.toml`) |
//! | `jsonl` | a JSONL file, line by line, as the connector reads it |
//! | `html`, `markdown`, `rst` | a text file of that format |
//! | `pdf`, `docx` | a binary file of that format |
//! | `serve_request` | the body of a POST to `ragline serve` (OpenAI and TEI shapes) |
//! | `retry_after` | a service's `Retry-After` header |
//! | `broker_message` | a document message on a broker subject (`ingest nats://.../SUBJECT`) |

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, SystemTime};

use crate::document::Document;
use crate::event::Event;
use crate::queue::wire::Wire;
use crate::stages::extract::budget::{Budget, Limits};

/// A target: arbitrary bytes in, nothing out (it must only return).
pub type Target = fn(&[u8]);

/// The targets by name.
pub const TARGETS: &[(&str, Target)] = &[
    ("wire", wire),
    ("run_record", run_record),
    ("jsonl", jsonl),
    ("html", html),
    ("markdown", markdown),
    ("rst", rst),
    ("pdf", pdf),
    ("docx", docx),
    ("serve_request", serve_request),
    ("retry_after", retry_after),
    ("broker_message", broker_message),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

thread_local! {
    static CONTAINED: Cell<bool> = const { Cell::new(false) };
}

/// True while a target runs a parser the way production contains it (under
/// `catch_unwind`, as `stages::extract::budget` does): a panic there is that file's failure,
/// not a crash, so the fuzz binary's panic hook lets it unwind.
pub fn panic_is_contained() -> bool {
    CONTAINED.with(Cell::get)
}

/// Run `parse` as production runs a third-party parser: a panic fails the input only.
fn contained(parse: impl FnOnce()) {
    CONTAINED.with(|c| c.set(true));
    let _ = catch_unwind(AssertUnwindSafe(parse));
    CONTAINED.with(|c| c.set(false));
}

/// What a parser may spend on one input: the fuzzer's own timeout catches a hang first.
fn budget() -> Budget {
    Budget::new(Limits {
        time: Duration::from_secs(60),
        memory: 1 << 30,
    })
}

pub fn wire(data: &[u8]) {
    let bytes = bytes::Bytes::copy_from_slice(data);
    if let Ok((items, _)) = crate::queue::jetstream::split_message(&bytes) {
        for item in items {
            if let Ok(doc) = Document::decode(&item) {
                // What a later stage does with it first: encode it again (a republish).
                let _ = Document::decode(&doc.encode());
            }
            let _ = Event::decode(&item);
        }
    }
}

pub fn run_record(data: &[u8]) {
    if let Ok(record) = serde_json::from_slice::<crate::queue::jetstream::RunRecord>(data) {
        let _ = crate::jobs::PipelineConfig::parse(&record.config);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::jobs::PipelineConfig::parse(text);
    }
}

pub fn jsonl(data: &[u8]) {
    crate::connectors::jsonl::fuzz_lines(data, 4096);
}

pub fn html(data: &[u8]) {
    let _ = crate::stages::extract::html::extract(&String::from_utf8_lossy(data), &budget());
}

pub fn markdown(data: &[u8]) {
    let _ = crate::stages::extract::markdown::extract(&String::from_utf8_lossy(data));
}

pub fn rst(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = crate::stages::extract::text::extract_rst(&text);
    let _ = crate::stages::extract::text::extract_plain(&text);
}

/// pdf_oxide and office_oxide run under `catch_unwind` in production (a panic in them fails
/// the file): here too, so the fuzzer hunts what that cannot contain (aborts, stack
/// overflows, hangs, runaway memory) and ragline's own panics.
pub fn pdf(data: &[u8]) {
    #[cfg(feature = "pdf")]
    contained(|| {
        let _ = crate::stages::extract::pdf::extract(data, &budget());
    });
    #[cfg(not(feature = "pdf"))]
    let _ = data;
}

pub fn docx(data: &[u8]) {
    #[cfg(feature = "docx")]
    contained(|| {
        let _ = crate::stages::extract::docx::extract(data, &budget());
    });
    #[cfg(not(feature = "docx"))]
    let _ = data;
}

pub fn serve_request(data: &[u8]) {
    crate::serve::fuzz_request(data);
    crate::serve::fuzz_classifier_bodies(data);
}

pub fn broker_message(data: &[u8]) {
    #[cfg(feature = "nats")]
    crate::connectors::nats::message::fuzz(data);
    #[cfg(not(feature = "nats"))]
    let _ = data;
}

pub fn retry_after(data: &[u8]) {
    if let Ok(value) = reqwest::header::HeaderValue::from_bytes(data) {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, value);
        if let Some(d) = crate::http::retry_after(&headers, SystemTime::now()) {
            assert!(d <= crate::http::MAX_RETRY_AFTER, "{d:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), for the mutations below.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Inputs of the wire target made here: documents, events and batches as processes send
    /// them (the seeds on disk are the hostile ones).
    fn wire_inputs() -> Vec<Vec<u8>> {
        let mut doc = Document::new("guide.md#3", "the chunk's text");
        doc.fields.metadata.insert(
            "tags".into(),
            serde_json::json!(["a", {"b": [1, [2, [3]]]}]),
        );
        doc.raw = Some(vec![0, 255, 7]);
        let event = Event::fail(&doc, "extract", "why");
        let (d, e) = (doc.encode(), event.encode());
        let batch = crate::queue::jetstream::encode_batch(
            &[bytes::Bytes::from(d.clone()), bytes::Bytes::from(e.clone())],
            0,
        );
        vec![d, e, batch.to_vec()]
    }

    #[test]
    fn every_fuzz_target_survives_its_seeds_its_past_crashes_and_their_mutations() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
        let mut seen = 0;
        for (name, run) in TARGETS {
            let dir = root.join(name);
            let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| std::fs::read(e.unwrap().path()).unwrap())
                .collect();
            assert!(!inputs.is_empty(), "{name}: no seeds in {}", dir.display());
            if *name == "wire" {
                inputs.extend(wire_inputs());
            }
            let mut state = 0x9E37_79B9_7F4A_7C15u64;
            for input in &inputs {
                run(input);
                seen += 1;
                // Byte flips, cuts and repeats of each seed (the fuzzer does far more).
                let rounds = if input.len() > 64 << 10 { 4 } else { 40 };
                for _ in 0..rounds {
                    let mut m = input.clone();
                    match next(&mut state) % 3 {
                        0 if !m.is_empty() => {
                            let at = (next(&mut state) as usize) % m.len();
                            m[at] = next(&mut state) as u8;
                        }
                        1 => m.truncate((next(&mut state) as usize) % (m.len() + 1)),
                        _ => {
                            let at = (next(&mut state) as usize) % (m.len() + 1);
                            let piece: Vec<u8> = m[at..].iter().take(64).copied().collect();
                            m.splice(at..at, piece);
                        }
                    }
                    run(&m);
                    seen += 1;
                }
            }
        }
        assert!(seen > TARGETS.len() * 40, "{seen} inputs");
    }
}
