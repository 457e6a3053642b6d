//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// The shared data folder, or None (with a message) when this checkout has none.
pub fn shared_data(sub: &str) -> Option<PathBuf> {
    let p = root().join("../shared/data").join(sub);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (the shared data set is not on this machine)",
            p.display()
        );
        None
    }
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
