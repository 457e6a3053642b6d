//! Parquet output (`--index parquet:PATH`, `embed --output FILE.parquet`), read back by
//! pyarrow and DuckDB (scripts/read-parquet.py in scripts/data-venv.sh's virtualenv): the
//! rows and vectors equal the JSONL output's.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::util::{data_python, model_dir, ragline, read_jsonl, root, run};

/// What pyarrow and DuckDB read from `file`.
fn read_back(file: &Path) -> Value {
    read_with(file, &[])
}

fn read_with(file: &Path, extra: &[&str]) -> Value {
    let o = run(std::process::Command::new(data_python())
        .arg(root().join("scripts/read-parquet.py"))
        .arg(file)
        .args(extra));
    assert!(o.status.success());
    serde_json::from_slice(&o.stdout).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn ingest_to_parquet_is_read_by_pyarrow_and_duckdb_with_the_jsonl_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    fs::create_dir_all(&c).unwrap();
    fs::copy(
        root().join("tests/fixtures/react/useEffect.md"),
        c.join("useEffect.md"),
    )
    .unwrap();
    fs::write(
        c.join("b.md"),
        "---\ntitle: B\ntags: [x]\n---\n\n# B\n\nAnother page.\n",
    )
    .unwrap();
    let out = |uri: String| {
        let o = run(ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(model_dir())
            .arg("--index")
            .arg(uri)
            .arg(&c));
        assert_eq!(o.status.code(), Some(0));
    };
    let pq = dir.path().join("out.parquet");
    let jl = dir.path().join("out.jsonl");
    out(format!("parquet:{}", pq.display()));
    out(format!("jsonl:{}", jl.display()));
    assert!(!dir.path().join("out.parquet.partial").exists());

    let seen = read_back(&pq);
    let jsonl = read_jsonl(&jl);
    assert_eq!(seen["rows"], jsonl.len());
    assert_eq!(
        seen["vector_type"],
        "fixed_size_list<item: float not null>[384]"
    );
    assert_eq!(seen["compression"], "ZSTD");
    for col in [
        "id",
        "kind",
        "parent_id",
        "ordinal",
        "text",
        "heading_path",
        "source",
        "metadata",
        "token_count",
        "vector",
    ] {
        assert!(
            seen["columns"].as_array().unwrap().iter().any(|c| c == col),
            "{col}"
        );
    }
    let mut chunks = 0;
    for rec in &jsonl {
        let id = rec["id"].as_str().unwrap();
        let row = &seen["pyarrow"][id];
        assert_eq!(row["kind"], rec["kind"], "{id}");
        assert_eq!(row["text"], rec["text"], "{id}");
        assert_eq!(
            row["parent_id"],
            rec.get("parent_id").cloned().unwrap_or(Value::Null)
        );
        match rec.get("vector") {
            Some(v) => {
                chunks += 1;
                assert_eq!(floats(&row["vector"]), floats(v), "{id}");
                assert_eq!(floats(&seen["duckdb"][id]), floats(v), "{id} (duckdb)");
                assert_eq!(row["token_count"], rec["token_count"]);
                assert_eq!(
                    row["heading_path"].as_str().unwrap(),
                    rec["heading_path"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|h| h.as_str().unwrap())
                        .collect::<Vec<_>>()
                        .join(" > ")
                );
            }
            None => {
                assert!(row["vector"].is_null(), "{id}");
                assert!(seen["duckdb"][id].is_null(), "{id} (duckdb)");
            }
        }
    }
    assert!(chunks > 20);
    // Metadata is a JSON string.
    let meta: Value =
        serde_json::from_str(seen["pyarrow"]["b.md"]["metadata"].as_str().unwrap()).unwrap();
    assert_eq!(meta["tags"], serde_json::json!(["x"]));
}

#[test]
fn embed_to_parquet_matches_embed_to_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let mut lines = String::new();
    for i in 0..50 {
        lines.push_str(&format!(
            "{{\"id\": \"t{i}\", \"text\": \"sentence number {i} about vectors\"}}\n"
        ));
    }
    lines.push_str("{\"id\": \"bad\", \"body\": \"no text field\"}\n");
    fs::write(&input, lines).unwrap();
    let embed = |out: &Path| {
        let o = run(ragline()
            .args(["embed", "--device", "cpu", "--model"])
            .arg(model_dir())
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(out));
        // The bad line is reported (exit 1) and keeps its row.
        assert_eq!(o.status.code(), Some(1));
    };
    let pq = dir.path().join("v.parquet");
    let jl = dir.path().join("v.jsonl");
    embed(&pq);
    embed(&jl);
    let seen = read_back(&pq);
    let jsonl = read_jsonl(&jl);
    assert_eq!(seen["rows"], 51);
    let by_id: HashMap<&str, &Value> = jsonl
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r))
        .collect();
    for i in 0..50 {
        let id = format!("t{i}");
        let want = floats(&by_id[id.as_str()]["vector"]);
        assert_eq!(floats(&seen["pyarrow"][&id]["vector"]), want, "{id}");
        assert_eq!(floats(&seen["duckdb"][&id]), want, "{id} (duckdb)");
        assert_eq!(seen["pyarrow"][&id]["kind"], "text");
    }
    let bad = &seen["pyarrow"]["bad"];
    assert!(bad["vector"].is_null());
    assert!(
        bad["error"].as_str().unwrap().contains("--text-field"),
        "{bad}"
    );
}

/// A million chunks (and their 100,000 parents) with 384-d vectors through the Parquet
/// backend: peak RSS stays under 500 MB (row groups bounded by bytes), and the file holds
/// every row. Peak RSS from GNU time (CI installs it).
#[test]
fn a_million_rows_keep_peak_memory_under_500_mb() {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        eprintln!("SKIPPED: /usr/bin/time (GNU time) is not installed: apt-get install time");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.parquet");
    let o = run(std::process::Command::new(time)
        .arg("-v")
        .arg(env!("CARGO_BIN_EXE_ragline"))
        .args(["bench", "--json", "--chunks", "1000000", "--write"])
        .arg(format!("parquet:{}", file.display())));
    assert_eq!(o.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let peak_kb: u64 = stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .expect("GNU time prints the peak RSS")
        .parse()
        .unwrap();
    eprintln!("peak RSS {} MB writing 1,100,000 rows", peak_kb / 1024);
    assert!(peak_kb < 500 * 1024, "peak RSS {peak_kb} kB");
    let seen = read_with(&file, &["--summary"]);
    assert_eq!(seen["rows"], 1_100_000);
    assert_eq!(seen["duckdb_rows"], 1_100_000);
    assert_eq!(seen["duckdb_vectors"], 1_000_000);
    assert!(seen["row_groups"].as_u64().unwrap() > 10, "{seen}");
}
