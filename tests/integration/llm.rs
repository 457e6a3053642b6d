//! The LLM stages on react-docs through `scripts/chat-stub.py` (an OpenAI-compatible chat
//! endpoint that answers deterministic text: no language model can run here): every document
//! gets exactly one summary, searchable by keyword and shown by `ragline search`; a second
//! run with unchanged documents makes no call; an edited document gets a new summary that
//! replaces the old one. On SQLite and, with a server, Postgres.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::backend::{backend_kinds, BackendKind};
use crate::distributed::react_slice;
use crate::serve::get;
use crate::util::{ragline, random_model, root, run, stdout_json};

/// `scripts/chat-stub.py` of the test's own.
pub(crate) struct ChatStub {
    child: Child,
    pub(crate) url: String,
}

impl ChatStub {
    pub(crate) fn start() -> ChatStub {
        let mut child = Command::new("python3")
            .arg(root().join("scripts/chat-stub.py"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("start scripts/chat-stub.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .expect("stub address");
        ChatStub {
            child,
            url: format!("http://{addr}"),
        }
    }

    pub(crate) fn calls(&self) -> u64 {
        let (_, body) = get(&format!("{}/stats", self.url));
        serde_json::from_str::<Value>(&body).unwrap()["calls"]
            .as_u64()
            .unwrap()
    }
}

impl Drop for ChatStub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn every_document_gets_one_summary_and_unchanged_ones_cost_no_call() {
    for kind in backend_kinds() {
        summaries_on(&kind);
    }
}

fn summaries_on(kind: &BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let Some(corpus) = react_slice(dir.path(), 225) else {
        return;
    };
    let model = random_model(dir.path(), 64, 11);
    let index = kind.index(dir.path(), "llm");
    let uri = index.uri();
    let ingest = || {
        let o = run(ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(&model)
            .args(["--index", &uri])
            .arg(&corpus));
        assert!(o.status.success());
    };
    ingest();
    let stub = ChatStub::start();
    let config = dir.path().join("ragline.toml");
    fs::write(
        &config,
        format!(
            "[stages.summary]\nurl = \"{}\"\nmodel = \"stub\"\nkeyword_index = true\n",
            stub.url
        ),
    )
    .unwrap();
    let check = run(ragline().arg("--config").arg(&config).args(["check"]));
    assert!(check.status.success(), "ragline check refused the stage");
    let enrich = |report: &Path| {
        run(ragline()
            .arg("--config")
            .arg(&config)
            .args([
                "enrich",
                "--progress",
                "none",
                "--stage",
                "summary",
                "--index",
                &uri,
            ])
            .arg("--report")
            .arg(report))
    };
    let documents = index.count(
        "SELECT COUNT(*) FROM documents",
        "SELECT count(*) FROM {s}.documents",
    );
    assert!(documents > 200, "{documents} documents");

    let o = enrich(&dir.path().join("first.json"));
    assert!(o.status.success());
    let first: Value =
        serde_json::from_slice(&fs::read(dir.path().join("first.json")).unwrap()).unwrap();
    assert_eq!(first["counts"]["indexed"].as_i64().unwrap(), documents);
    assert_eq!(stub.calls() as i64, documents, "one call per document");
    // Exactly one summary per document, the stub's answer, in the metadata too.
    let outputs = index.strings(
        "SELECT document_id, output FROM stage_outputs WHERE stage = 'summary'",
        "SELECT document_id, output FROM {s}.stage_outputs WHERE stage = 'summary'",
    );
    assert_eq!(outputs.len() as i64, documents);
    assert!(outputs.iter().all(|(_, o)| o.starts_with("summary of ")));
    let in_metadata = index.count(
        "SELECT COUNT(*) FROM documents WHERE json_extract(metadata, '$.summary') IS NOT NULL",
        "SELECT count(*) FROM {s}.documents WHERE metadata ? 'summary'",
    );
    assert_eq!(in_metadata, documents);
    let status = stdout_json(&run(ragline().args(["status", "--json", "--index", &uri])));
    assert_eq!(
        status["stages"]["summary"]["done"].as_i64().unwrap(),
        documents,
        "{status}"
    );

    // Searchable: the stub's answer ends with a hash unique to its prompt.
    let (doc, summary) = outputs
        .iter()
        .find(|(d, _)| d.ends_with("useEffect.md"))
        .expect("useEffect.md has a summary");
    let hash = summary.rsplit('[').next().unwrap().trim_end_matches(']');
    let hits = stdout_json(&run(ragline().args([
        "search", hash, "--mode", "keyword", "--json", "--index", &uri,
    ])));
    let top = &hits.as_array().expect("hits")[0];
    assert_eq!(&top["document_id"], doc, "{hits}");
    assert_eq!(top["outputs"]["summary"].as_str(), Some(summary.as_str()));
    let shown = run(ragline().args(["search", hash, "--mode", "keyword", "--index", &uri]));
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown
            .lines()
            .any(|l| l.trim_start().starts_with("summary: ") && l.contains(hash)),
        "{shown}"
    );

    // Unchanged documents: no call.
    let before = stub.calls();
    let o = enrich(&dir.path().join("second.json"));
    assert!(o.status.success());
    assert_eq!(
        stub.calls(),
        before,
        "a second run with unchanged documents called the model"
    );

    // One edited document: one call, and its summary replaced (still one).
    let page = corpus.join(doc);
    let mut text = fs::read_to_string(&page).unwrap();
    text.insert_str(0, "# A new title for this page\n\n");
    fs::write(&page, text).unwrap();
    ingest();
    let o = enrich(&dir.path().join("third.json"));
    assert!(o.status.success());
    assert_eq!(stub.calls(), before + 1);
    let after = index.strings(
        "SELECT document_id, output FROM stage_outputs WHERE stage = 'summary'",
        "SELECT document_id, output FROM {s}.stage_outputs WHERE stage = 'summary'",
    );
    assert_eq!(after.len(), outputs.len());
    let new = &after.iter().find(|(d, _)| d == doc).unwrap().1;
    assert_ne!(new, summary, "the edited page kept its old summary");
}
