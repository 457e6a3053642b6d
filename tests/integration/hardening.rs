//! Inputs that once killed, hung or steered a run (the hardening review): each is fed to the
//! real binary, and the run must end with the input failed or dropped with its reason, the
//! rest done, and no secret in anything it printed or wrote. The broker's and the server's
//! cases are in `distributed.rs` and `serve.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{ragline, random_model, run};

/// Run `cmd`, killing it (and failing) if it has not ended within `limit`: a hang is a
/// failure, not a stuck test.
fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ragline");
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} did not end within {limit:?} (a hang):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    eprintln!(
        "--- {cmd:?}\n--- status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn report(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn reasons(report: &Value, list: &str) -> Vec<(String, String)> {
    report[list]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|o| {
            (
                o["id"].as_str().unwrap().to_string(),
                o["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn reason_of<'a>(list: &'a [(String, String)], id: &str) -> &'a str {
    list.iter()
        .find(|(i, _)| i == id)
        .map(|(_, r)| r.as_str())
        .unwrap_or_else(|| panic!("{id} is not in {list:?}"))
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

/// 100,000 nested `<div>`s (the stack overflow that took the whole ingest down), a link to a
/// FIFO (a read that never returned), and a JSONL line of 2 MB (read whole past
/// --max-file-bytes), among good files: each fails or is dropped with its reason, the good
/// files are indexed, and the run exits 1.
#[test]
fn hostile_files_fail_alone_and_the_run_ends() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 64, 5);
    let corpus = dir.path().join("corpus");
    fs::create_dir_all(&corpus).unwrap();
    fs::write(corpus.join("good1.md"), "# One\n\nThe first good page.\n").unwrap();
    fs::write(
        corpus.join("good2.html"),
        "<h1>Two</h1><p>The second good page.</p>",
    )
    .unwrap();
    fs::write(corpus.join("deep.html"), "<div>".repeat(100_000)).unwrap();
    mkfifo(&corpus.join("pipe"));
    std::os::unix::fs::symlink(corpus.join("pipe"), corpus.join("link.md")).unwrap();
    let long = format!(
        "{{\"id\": \"ok1\", \"text\": \"a short line\"}}\n{{\"id\": \"huge\", \"text\": \"{}\"}}\n\
         {{\"id\": \"ok2\", \"text\": \"another short line\"}}\n",
        "x".repeat(2 << 20)
    );
    fs::write(corpus.join("lines.jsonl"), long).unwrap();
    let rep = dir.path().join("run.json");
    let o = run_within(
        ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(&model)
            .args(["--max-file-bytes", "1000000", "--index"])
            .arg(format!("sqlite://{}", dir.path().join("x.db").display()))
            .arg("--report")
            .arg(&rep)
            .arg(&corpus),
        Duration::from_secs(300),
    );
    assert_eq!(o.status.code(), Some(1), "some documents failed");
    let r = report(&rep);
    let failed = reasons(&r, "failures");
    let dropped = reasons(&r, "dropped");
    assert!(
        reason_of(&failed, "deep.html").contains("nested more than 512"),
        "{failed:?}"
    );
    assert!(
        reason_of(&failed, "lines.jsonl:2").contains("over --max-file-bytes"),
        "{failed:?}"
    );
    assert!(
        reason_of(&dropped, "link.md").contains("not a regular file"),
        "{dropped:?}"
    );
    // The FIFO itself is not a file the walk takes (no extension); the good ones are in.
    assert_eq!(r["counts"]["indexed"], 4, "{}", r["counts"]);
    assert_eq!(r["counts"]["failed"], 2, "{}", r["counts"]);
}

/// A link that pointed inside the root when the walk saw it and outside when the file is
/// read: the opened file is checked, so the swap cannot lead out of the root.
#[test]
fn a_link_swapped_after_the_walk_cannot_lead_out_of_the_root() {
    use ragline::connectors::filesystem::{open_regular, Unusable};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a.md"), "inside").unwrap();
    fs::write(dir.path().join("secret.txt"), "outside").unwrap();
    let link = root.join("l.md");
    std::os::unix::fs::symlink(root.join("a.md"), &link).unwrap();
    let canonical = fs::canonicalize(&root).unwrap();
    assert!(open_regular(&link, Some(&canonical)).is_ok());
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), &link).unwrap();
    match open_regular(&link, Some(&canonical)) {
        Err(Unusable::Dropped(why)) => assert!(why.contains("outside the root"), "{why}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// A DOCX of 500 KB whose document.xml inflates to 500 MB fails with the reason, and the
/// ingest's memory stays far below what inflating it would take (peak RSS printed for
/// BENCHMARKS.md).
#[test]
fn a_docx_bomb_fails_with_the_reason_within_the_memory_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 64, 5);
    let corpus = dir.path().join("corpus");
    fs::create_dir_all(&corpus).unwrap();
    let bomb = corpus.join("bomb.docx");
    let made = Command::new("python3")
        .arg("-c")
        .arg(BOMB_PY)
        .arg(&bomb)
        .arg((500u64 << 20).to_string())
        .status()
        .expect("python3");
    assert!(made.success());
    let size = fs::metadata(&bomb).unwrap().len();
    assert!(size < 2 << 20, "the bomb is small on disk: {size} bytes");
    fs::write(corpus.join("good.md"), "# Good\n\nA page.\n").unwrap();
    let rep = dir.path().join("run.json");
    let time = Path::new("/usr/bin/time");
    let mut cmd = if time.is_file() {
        let mut c = Command::new(time);
        c.arg("-v").arg(env!("CARGO_BIN_EXE_ragline"));
        c
    } else {
        ragline()
    };
    let o = run_within(
        cmd.args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(&model)
            .arg("--index")
            .arg(format!("sqlite://{}", dir.path().join("x.db").display()))
            .arg("--report")
            .arg(&rep)
            .arg(&corpus),
        Duration::from_secs(300),
    );
    assert_eq!(o.status.code(), Some(1));
    let r = report(&rep);
    let failed = reasons(&r, "failures");
    let why = reason_of(&failed, "bomb.docx");
    assert!(why.contains("--max-extract-mb"), "{why}");
    assert_eq!(r["counts"]["indexed"], 1);
    let stderr = String::from_utf8_lossy(&o.stderr);
    if let Some(kb) = stderr.lines().find_map(|l| {
        l.trim()
            .strip_prefix("Maximum resident set size (kbytes): ")
    }) {
        let mb = kb.trim().parse::<u64>().unwrap() / 1024;
        eprintln!("PEAK RSS of the ingest with a 500 MB DOCX bomb: {mb} MB");
        assert!(mb < 1024, "peak RSS {mb} MB: the bomb was inflated");
    }
}

/// A DOCX (a zip) whose word/document.xml inflates to argv[2] bytes of text.
const BOMB_PY: &str = r#"
import sys, zipfile
path, size = sys.argv[1], int(sys.argv[2])
ct = ('<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/'
      'package/2006/content-types"><Default Extension="rels" ContentType="application/'
      'vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" '
      'ContentType="application/xml"/><Override PartName="/word/document.xml" '
      'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.'
      'main+xml"/></Types>')
rels = ('<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.'
        'openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://'
        'schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
        'Target="word/document.xml"/></Relationships>')
head = ('<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.'
        'openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>')
tail = '</w:t></w:r></w:p></w:body></w:document>'
with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    z.writestr('[Content_Types].xml', ct)
    z.writestr('_rels/.rels', rels)
    with z.open('word/document.xml', 'w', force_zip64=True) as f:
        f.write(head.encode())
        chunk = b'A' * (1 << 20)
        left = size - len(head) - len(tail)
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        f.write(tail.encode())
"#;

/// `ragline status --json` of an index.
#[cfg(feature = "failpoints")]
fn status(uri: &str) -> Value {
    let o = run(ragline().args(["status", "--json", "--index", uri]));
    assert_eq!(o.status.code(), Some(0));
    crate::util::stdout_json(&o)
}

#[cfg(feature = "failpoints")]
fn in_progress(uri: &str) -> u64 {
    status(uri)["stages"]["embed"]["in_progress"]
        .as_u64()
        .unwrap()
}

/// An enrich that claims work and then holds it (the failpoint sleeps after the claim).
#[cfg(feature = "failpoints")]
fn holder(uri: &str, model: &Path, dir: &Path) -> std::process::Child {
    ragline()
        .args([
            "enrich",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--index",
            uri,
        ])
        .arg("--model")
        .arg(model)
        .env("FAILPOINTS", "enrich::claimed=sleep(600000)")
        .stdout(Stdio::null())
        .stderr(fs::File::create(dir.join("holder.log")).unwrap())
        .spawn()
        .unwrap()
}

/// An enrich that ends while another live process holds work says what is left, who holds
/// it and until when; once that process is killed (and not yet reaped by its parent: a
/// zombie), the next enrich takes its work over at once and finishes everything.
#[cfg(feature = "failpoints")]
#[test]
fn enrich_says_what_others_hold_and_takes_over_from_a_killed_zombie() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 64, 5);
    let corpus = dir.path().join("corpus");
    fs::create_dir_all(&corpus).unwrap();
    for d in 0..30 {
        fs::write(
            corpus.join(format!("doc{d:02}.md")),
            format!("# Doc {d}\n\nParagraph about thing{d} in a few words.\n"),
        )
        .unwrap();
    }
    let uri = format!("sqlite://{}", dir.path().join("x.db").display());
    let o = run(ragline()
        .args([
            "ingest",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--defer",
            "embed",
        ])
        .arg("--model")
        .arg(&model)
        .args(["--index", &uri])
        .arg(&corpus));
    assert_eq!(o.status.code(), Some(0));
    let docs = status(&uri)["documents"].as_u64().unwrap();

    let mut held = holder(&uri, &model, dir.path());
    let deadline = Instant::now() + Duration::from_secs(120);
    while in_progress(&uri) == 0 {
        assert!(Instant::now() < deadline, "the holder never claimed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let holding = in_progress(&uri);
    // A live holder: the run does the rest and says what is left, whose and until when.
    let rep = dir.path().join("second.json");
    let o = run(ragline()
        .args([
            "enrich",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--index",
            &uri,
        ])
        .arg("--model")
        .arg(&model)
        .arg("--report")
        .arg(&rep));
    assert_eq!(o.status.code(), Some(0));
    let r = report(&rep);
    assert_eq!(r["held_by_others"], holding, "{r}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let pid = held.id().to_string();
    assert!(
        stdout.contains("in progress under the lease of another worker")
            && stdout.contains(&format!(":{pid}:"))
            && stdout.contains(" until 20"),
        "{stdout}"
    );
    assert_eq!(in_progress(&uri), holding);

    // SIGKILL, and no wait(): the holder stays in /proc as a zombie, as when `timeout -s
    // KILL` is killed with its child.
    held.kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(
            Instant::now() < deadline,
            "the killed holder is not a zombie"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rep = dir.path().join("third.json");
    let o = run(ragline()
        .args([
            "enrich",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--index",
            &uri,
        ])
        .arg("--model")
        .arg(&model)
        .arg("--report")
        .arg(&rep));
    assert_eq!(o.status.code(), Some(0));
    let s = status(&uri);
    assert_eq!(s["stages"]["embed"]["in_progress"], 0, "{s}");
    assert_eq!(s["stages"]["embed"]["done"], docs, "{s}");
    assert!(report(&rep).get("held_by_others").is_none());
    held.wait().unwrap();
}

/// URLs with secrets in a pipeline file: `ragline check` prints the resolved pipeline and its
/// errors without them.
#[test]
fn check_never_prints_a_password_or_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ragline.toml");
    fs::write(
        &config,
        "[index]\nuri = \"postgres://me:hunter2@127.0.0.1:9/db?password=hunter3\"\n\n\
         [stages.embed.remote]\nurl = \"http://u:hunter4@127.0.0.1:9/?api_key=hunter5\"\n\
         api = \"tei\"\ntimeout = \"1s\"\nretries = 1\n",
    )
    .unwrap();
    let o = run(ragline().arg("--config").arg(&config).arg("check"));
    assert_ne!(o.status.code(), Some(0), "nothing answers there");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    for secret in ["hunter2", "hunter3", "hunter4", "hunter5"] {
        assert!(!all.contains(secret), "{secret} printed:\n{all}");
    }
}

/// Writes acknowledged to a broker must survive a power loss: SQLite syncs every commit.
#[test]
fn sqlite_commits_are_durable() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 64, 5);
    let db: PathBuf = dir.path().join("x.db");
    let corpus = dir.path().join("c");
    fs::create_dir_all(&corpus).unwrap();
    fs::write(corpus.join("a.md"), "# A\n\ntext\n").unwrap();
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--index")
        .arg(format!("sqlite://{}", db.display()))
        .arg(&corpus));
    assert_eq!(o.status.code(), Some(0));
    // The setting is per connection: what every writer sets is what `connect` sets.
    let conn = ragline::indexers::sqlite::connect(&db).unwrap();
    let level: i64 = conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap();
    assert_eq!(level, 2, "synchronous = FULL");
}
