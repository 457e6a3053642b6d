//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `ragline` binary built for these tests.
pub fn ragline() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ragline"));
    cmd.current_dir(root());
    cmd
}

/// Run and return the output, printing it when the test fails to help whoever reads the log.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("cannot start ragline");
    eprintln!(
        "--- {:?}\n--- status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        cmd,
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The shared data folder (`../shared/data`, or `$RAGLINE_DATA_DIR`), or None (with a
/// message) when this machine has none. With `RAGLINE_REQUIRE_DATA=1` (CI) a missing data
/// set fails the test instead of skipping it.
pub fn shared_data(sub: &str) -> Option<PathBuf> {
    let base = std::env::var_os("RAGLINE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("../shared/data"));
    let p = base.join(sub);
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("RAGLINE_REQUIRE_DATA").as_deref() != Ok("1"),
        "{} is absent and RAGLINE_REQUIRE_DATA=1: put the shared data set there or point \
         RAGLINE_DATA_DIR at it",
        p.display()
    );
    eprintln!(
        "SKIPPED: {} is absent (the shared data set is not on this machine)",
        p.display()
    );
    None
}

/// A random-weight BERT of `hidden` dimensions with the default model's tokenizer, written
/// into `dir` (a second model for migrations, and a fast one for lifecycle tests).
pub fn random_model(dir: &Path, hidden: usize, seed: u64) -> PathBuf {
    let out = dir.join(format!("random-{hidden}-{seed}"));
    ragline::embed::random::save_random_model(&model_dir(), &out, hidden, 2, seed)
        .expect("write a random model");
    out
}

/// The JSON a command printed on standard output: all of it, nothing else.
pub fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON alone ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The default model's folder; panics with the fix when it has not been fetched.
pub fn model_dir() -> PathBuf {
    let p = root().join("models/all-MiniLM-L6-v2");
    assert!(
        p.join("model.safetensors").is_file(),
        "the model is missing: run scripts/fetch-model.sh (CI's .ci/run does)"
    );
    p
}

/// Read a JSONL file into values.
pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

/// The data-tools virtualenv's python (made on first use; CI makes it before the tests):
/// pyarrow, DuckDB, psycopg, the `openai` client.
pub fn data_python() -> PathBuf {
    let o = std::process::Command::new(root().join("scripts/data-venv.sh"))
        .output()
        .expect("run scripts/data-venv.sh");
    assert!(
        o.status.success(),
        "scripts/data-venv.sh failed (it installs pyarrow, duckdb and openai from PyPI):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// Wait for `cond` (polled), failing after `limit`: waits for things to happen, never
/// asserts how fast.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL (what `Child::kill` sends on Unix): no cleanup, no chance to release anything.
pub fn kill9(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}
