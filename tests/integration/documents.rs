//! PDF and DOCX: extraction quality on generated fixtures with known text
//! (tests/fixtures/docs, made by scripts/gen-doc-fixtures.sh), the failure and drop reasons,
//! page numbers through ingest and search, and the real-world corpus
//! (scripts/fetch-doc-corpus.sh) through ingest with exact counts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ragline::connectors::filesystem::read_document;
use ragline::document::{BlockKind, Document};
use ragline::stages::extract::Extract;
use ragline::stages::Stage;
use serde_json::Value;

use crate::util::{model_dir, ragline, root, run, stdout_json};

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/docs").join(name)
}

fn expected(name: &str) -> Value {
    let stem = name
        .rsplit_once('.')
        .expect("a file name with an extension")
        .0;
    let path = fixture(&format!("{stem}.expected.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("the fixture's answer"))
        .expect("valid JSON")
}

/// Extract one file as the ingest would: the document, or the failure message.
fn extract(path: &Path) -> Result<Document, String> {
    let mut doc =
        read_document(path, path.display().to_string(), 1 << 30).map_err(|e| format!("{e:?}"))?;
    Extract::default()
        .process(&mut doc)
        .map_err(|e| e.to_string())?;
    Ok(doc)
}

/// The words of a text, lower-cased, with markdown structure marks (`#`, list markers, table
/// rules, footnote markers) left out: the content a reader reads.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut line = line.trim_start().trim_start_matches('#').trim_start();
        for marker in ["- ", "* "] {
            line = line.strip_prefix(marker).unwrap_or(line);
        }
        let digits = line.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 && line[digits..].starts_with(". ") {
            line = &line[digits + 2..];
        }
        if line.starts_with('[') {
            if let Some(end) = line.find("] ") {
                line = &line[end + 2..];
            }
        }
        out.extend(
            line.split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_lowercase),
        );
    }
    out
}

fn word_f1(got: &[String], want: &[String]) -> f64 {
    let mut bag: HashMap<&str, i64> = HashMap::new();
    for w in want {
        *bag.entry(w).or_default() += 1;
    }
    let mut common = 0;
    for w in got {
        if let Some(n) = bag.get_mut(w.as_str()).filter(|n| **n > 0) {
            *n -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let p = common as f64 / got.len() as f64;
    let r = common as f64 / want.len() as f64;
    2.0 * p * r / (p + r)
}

/// 1 - the edit distance between the word sequences / the longer one's length.
fn order_similarity(got: &[String], want: &[String]) -> f64 {
    let mut prev: Vec<usize> = (0..=want.len()).collect();
    for (i, g) in got.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, w) in want.iter().enumerate() {
            cur.push(
                (prev[j + 1] + 1)
                    .min(cur[j] + 1)
                    .min(prev[j] + usize::from(g != w)),
            );
        }
        prev = cur;
    }
    1.0 - prev[want.len()] as f64 / got.len().max(want.len()).max(1) as f64
}

fn headings(doc: &Document) -> Vec<String> {
    doc.blocks
        .iter()
        .filter_map(|b| match &b.kind {
            BlockKind::Heading { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// The known text of a fixture: its body, then its footnotes (which ragline keeps too).
fn known_words(answer: &Value) -> Vec<String> {
    let mut text = answer["text"].as_str().expect("text").to_string();
    for note in answer["footnotes"].as_array().into_iter().flatten() {
        text.push('\n');
        text.push_str(note.as_str().unwrap_or_default());
    }
    words(&text)
}

#[test]
fn known_text_comes_back_with_its_words_order_headings_title_and_pages() {
    for (name, min_order) in [
        ("single.pdf", 0.95),
        ("report.docx", 0.95),
        // Two columns: reported, held to what the PDF reader gives (one line strays).
        ("twocol.pdf", 0.9),
    ] {
        let doc = extract(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let answer = expected(name);
        let (got, want) = (words(&doc.fields.text), known_words(&answer));
        let f1 = word_f1(&got, &want);
        let order = order_similarity(&got, &want);
        eprintln!("{name}: word F1 {f1:.4}, reading order {order:.4}");
        assert!(
            f1 >= 0.98,
            "{name}: word F1 {f1:.4} < 0.98\n{}",
            doc.fields.text
        );
        assert!(
            order >= min_order,
            "{name}: order {order:.4}\n{}",
            doc.fields.text
        );
        assert_eq!(
            doc.fields.title.as_deref(),
            answer["title"].as_str(),
            "{name}: title"
        );
        // Every known heading is a heading, in order.
        let found = headings(&doc);
        let mut at = 0;
        for h in answer["headings"].as_array().expect("headings") {
            let h = h["text"].as_str().expect("heading text");
            match found[at..].iter().position(|f| f == h) {
                Some(p) => at += p + 1,
                None => panic!("{name}: heading `{h}` not found in order in {found:?}"),
            }
        }
        for absent in answer["absent"].as_array().into_iter().flatten() {
            let absent = absent.as_str().expect("a string");
            assert!(
                !doc.fields.text.contains(absent),
                "{name}: deleted text `{absent}` is in the text"
            );
        }
    }
    // The PDF's pages: running header and footer gone, every page's own text on its page.
    let doc = extract(&fixture("single.pdf")).expect("single.pdf");
    let answer = expected("single.pdf");
    assert_eq!(doc.page_starts.len(), 3);
    assert!(!doc.fields.text.contains("Draft") && !doc.fields.text.contains("of 3"));
    for term in answer["terms"].as_array().expect("terms") {
        let (word, page) = (
            term["term"].as_str().unwrap(),
            term["page"].as_u64().unwrap(),
        );
        let at = doc
            .fields
            .text
            .find(word)
            .unwrap_or_else(|| panic!("`{word}` is missing"));
        assert_eq!(
            doc.pages_of(at, at + word.len()),
            Some((page as u32, page as u32))
        );
    }
    // Hyphenated at a line end, and ligatures: whole words.
    assert!(doc.fields.text.contains("propulsion"));
    assert!(doc.fields.text.contains("film") && doc.fields.text.contains("flexible"));
    assert!(!doc.fields.text.contains('\u{FB01}') && !doc.fields.text.contains("propul-"));
}

#[test]
fn encrypted_scanned_and_broken_files_say_what_is_wrong() {
    let err = extract(&fixture("encrypted.pdf")).expect_err("needs its password");
    assert!(err.starts_with("encrypted: needs a password"), "{err}");
    let doc = extract(&fixture("encrypted-empty.pdf")).expect("the empty user password opens it");
    assert!(doc.dropped.is_none() && !doc.fields.text.trim().is_empty());

    let doc = extract(&fixture("image-only.pdf")).expect("no error");
    let reason = doc.dropped.expect("a file without text is dropped");
    assert!(reason.contains("needs OCR"), "{reason}");

    let doc = extract(&fixture("scanned.pdf")).expect("page 1 has text");
    assert!(doc.dropped.is_none());
    assert_eq!(
        doc.warnings,
        vec![("extract", "page 2 has no text layer: needs OCR".to_string())]
    );

    // Damaged files fail with the reason, never a panic or an empty success.
    let dir = tempfile::tempdir().unwrap();
    let pdf = std::fs::read(fixture("single.pdf")).unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        ("truncated.pdf", pdf[..pdf.len() / 3].to_vec()),
        ("garbage.pdf", b"%PDF-1.7\n\x00\x01garbage\xff".repeat(50)),
        ("not-a-pdf.pdf", b"hello, I am text".to_vec()),
        ("zip-junk.docx", b"PK\x03\x04 broken zip".to_vec()),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        match extract(&path) {
            Err(reason) => assert!(reason.len() > 20, "{name}: {reason}"),
            Ok(doc) => assert!(
                doc.dropped.is_some() || !doc.fields.text.trim().is_empty(),
                "{name}: an empty success"
            ),
        }
    }
}

#[test]
fn ingest_counts_every_file_and_search_shows_pages() {
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("docs.db");
    let report = dir.path().join("run.json");
    let out = run(ragline()
        .args(["ingest", "tests/fixtures/docs", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(format!("sqlite://{}", index.display()))
        .arg("--report")
        .arg(&report));
    assert_eq!(out.status.code(), Some(1), "one file failed: exit code 1");
    let summary: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let c = &summary["counts"];
    assert_eq!(c["published"], 7);
    assert_eq!(
        (
            c["indexed"].as_u64(),
            c["failed"].as_u64(),
            c["dropped"].as_u64()
        ),
        (Some(5), Some(1), Some(1))
    );
    assert_eq!(summary["failures"][0]["id"], "encrypted.pdf");
    assert_eq!(summary["dropped"][0]["id"], "image-only.pdf");
    assert_eq!(summary["warnings"][0]["id"], "scanned.pdf");
    assert!(String::from_utf8_lossy(&out.stdout).contains("warning: scanned.pdf [extract] page 2"));

    let out = run(ragline()
        .args([
            "search",
            "--json",
            "--mode",
            "keyword",
            "-k",
            "3",
            "chromium emissivity",
        ])
        .arg("--index")
        .arg(format!("sqlite://{}", index.display())));
    assert!(out.status.success());
    let hits = stdout_json(&out);
    let top = &hits[0];
    assert_eq!(top["document_id"], "single.pdf");
    let pages = top["pages"].as_array().expect("the chunk's pages");
    assert!(
        pages.iter().all(|p| (1..=3).contains(&p.as_u64().unwrap())),
        "{top}"
    );
    assert!(
        top["heading_path"].as_str().unwrap().contains("Materials"),
        "{top}"
    );
    let out = run(ragline()
        .args(["search", "--mode", "keyword", "-k", "1", "syzygy drift"])
        .arg("--index")
        .arg(format!("sqlite://{}", index.display())));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("single.pdf") && text.contains("p. 3"),
        "{text}"
    );
}

/// The corpus from the PyPI source packages of pypdf, pdftotext, pypdfium2 and python-docx
/// (`scripts/fetch-doc-corpus.sh`; CI fetches it): every file is indexed, failed or dropped
/// with a reason, and the counts add up.
#[test]
fn the_real_corpus_goes_through_ingest_with_exact_counts() {
    let corpus = std::env::var_os("RAGLINE_DOC_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/doc-corpus"));
    if !corpus.join("pdf").is_dir() {
        assert!(
            std::env::var("RAGLINE_REQUIRE_DATA").as_deref() != Ok("1"),
            "{} is absent and RAGLINE_REQUIRE_DATA=1: run scripts/fetch-doc-corpus.sh",
            corpus.display()
        );
        eprintln!("SKIPPED: no document corpus; run scripts/fetch-doc-corpus.sh");
        return;
    }
    let files = walkdir::WalkDir::new(&corpus)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().to_lowercase();
            e.file_type().is_file() && (name.ends_with(".pdf") || name.ends_with(".docx"))
        })
        .count();
    assert!(files > 100, "the corpus holds {files} files");
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("run.json");
    let out = run(ragline()
        .arg("ingest")
        .arg(&corpus)
        .args(["--ext", "pdf,docx", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(format!(
            "sqlite://{}",
            dir.path().join("corpus.db").display()
        ))
        .arg("--report")
        .arg(&report));
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "the run completed"
    );
    let summary: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let c = &summary["counts"];
    let n = |k: &str| c[k].as_u64().unwrap();
    assert_eq!(n("published") as usize, files);
    assert_eq!(n("indexed") + n("failed") + n("dropped"), n("published"));
    let failures = summary["failures"].as_array().unwrap();
    let dropped = summary["dropped"].as_array().unwrap();
    assert_eq!(failures.len() as u64, n("failed"));
    assert_eq!(dropped.len() as u64, n("dropped"));
    for o in failures.iter().chain(dropped) {
        let reason = o["reason"].as_str().unwrap();
        assert!(reason.len() > 15, "{o}");
        assert!(!reason.contains("panicked"), "a parser crash: {o}");
    }
    eprintln!(
        "corpus: {files} files: {} indexed, {} failed, {} dropped",
        n("indexed"),
        n("failed"),
        n("dropped")
    );
    assert!(n("indexed") as usize > files / 2, "most files have text");
}

/// Every output carries what a chunk knows of its pages: the `jsonl:` records (`pages`, as
/// `search --json` gives it) and the Parquet rows (`page_start`, `page_end`) hold what the
/// SQLite index holds, chunk by chunk.
#[test]
fn every_backend_carries_the_pages_of_a_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let ingest = |index: String| {
        let out = run(ragline()
            .args(["ingest", "tests/fixtures/docs", "--model"])
            .arg(model_dir())
            .arg("--index")
            .arg(&index));
        assert_eq!(
            out.status.code(),
            Some(1),
            "{index}: one file fails: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let db = dir.path().join("docs.db");
    let jsonl = dir.path().join("docs.jsonl");
    let parquet = dir.path().join("docs.parquet");
    ingest(format!("sqlite://{}", db.display()));
    ingest(format!("jsonl:{}", jsonl.display()));
    ingest(format!("parquet:{}", parquet.display()));

    type Pages = std::collections::BTreeMap<String, Option<(u64, u64)>>;
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mut stmt = conn
        .prepare("SELECT id, page_start, page_end FROM chunks")
        .unwrap();
    let in_sqlite: Pages = stmt
        .query_map([], |r| {
            let (a, b): (Option<u64>, Option<u64>) = (r.get(1)?, r.get(2)?);
            Ok((r.get::<_, String>(0)?, a.zip(b)))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let paged = in_sqlite.values().filter(|p| p.is_some()).count();
    assert!(paged >= 3, "the PDFs' chunks have pages: {in_sqlite:?}");
    assert!(
        paged < in_sqlite.len(),
        "the DOCX's have none: {in_sqlite:?}"
    );

    let in_jsonl: Pages = crate::util::read_jsonl(&jsonl)
        .iter()
        .filter(|r| r["kind"] == "chunk")
        .map(|r| {
            let pages = r.get("pages").map(|p| {
                let p = p.as_array().unwrap();
                (p[0].as_u64().unwrap(), p[1].as_u64().unwrap())
            });
            (r["id"].as_str().unwrap().to_string(), pages)
        })
        .collect();
    assert_eq!(in_jsonl, in_sqlite, "jsonl: against SQLite");

    let o = run(std::process::Command::new(crate::util::data_python())
        .arg(crate::util::root().join("scripts/read-parquet.py"))
        .arg(&parquet));
    assert!(o.status.success());
    let read: Value = serde_json::from_slice(&o.stdout).unwrap();
    let in_parquet: Pages = read["pyarrow"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["kind"] == "chunk")
        .map(|r| {
            let pages = r["page_start"].as_u64().zip(r["page_end"].as_u64());
            (r["id"].as_str().unwrap().to_string(), pages)
        })
        .collect();
    assert_eq!(in_parquet, in_sqlite, "parquet: against SQLite");
}
