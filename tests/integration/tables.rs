//! SQL tables as a source, against a real SQLite file and the PostgreSQL test server
//! (`RAGLINE_TEST_POSTGRES`): a first run indexes every row; a second run with nothing changed
//! embeds nothing; one row changed, one added, one deleted: exactly those are re-embedded,
//! added and (with `--prune`) removed. Bad rows fail or drop alone, with their ids.

use std::path::Path;

use serde_json::{json, Value};

use crate::backend::{postgres_url, server_shared};
use crate::index::ingest_into;
use crate::util::{kill9, model_dir, ragline, run, wait_for};

/// A table the test writes with plain SQL.
trait Source {
    /// Run statements (SQLite's dialect and Postgres' agree on the ones used here).
    fn exec(&mut self, sql: &str);
    /// The source URL with `options` (`table=...&...`).
    fn url(&self, options: &str) -> String;
    fn name(&self) -> &'static str;
}

struct SqliteSource(std::path::PathBuf);

impl Source for SqliteSource {
    fn exec(&mut self, sql: &str) {
        rusqlite::Connection::open(&self.0)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
    }
    fn url(&self, options: &str) -> String {
        format!("sqlite://{}?{options}", self.0.display())
    }
    fn name(&self) -> &'static str {
        "sqlite"
    }
}

struct PgSource {
    url: String,
    schema: String,
    _server: std::sync::RwLockReadGuard<'static, ()>,
}

impl Source for PgSource {
    fn exec(&mut self, sql: &str) {
        let mut c = postgres::Client::connect(&self.url, postgres::NoTls).unwrap();
        c.batch_execute(&format!("SET search_path TO {}; {sql}", self.schema))
            .unwrap();
    }
    fn url(&self, options: &str) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        let options = options.replace("table=", &format!("table={}.", self.schema));
        format!("{}{sep}{options}", self.url)
    }
    fn name(&self) -> &'static str {
        "postgres"
    }
}

/// The sources a test named `name` reads: a SQLite file in `dir`, and a fresh schema on the
/// test server.
fn sources(dir: &Path, name: &str) -> Vec<Box<dyn Source>> {
    let mut v: Vec<Box<dyn Source>> = vec![Box::new(SqliteSource(dir.join(format!("{name}.db"))))];
    if let Some(url) = postgres_url() {
        let guard = server_shared();
        let schema = format!("src_{name}_{}", std::process::id());
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .unwrap();
        v.push(Box::new(PgSource {
            url,
            schema,
            _server: guard,
        }));
    }
    v
}

#[test]
fn a_table_is_indexed_incrementally_by_its_updated_column() {
    let dir = tempfile::tempdir().unwrap();
    for mut source in sources(dir.path(), "reruns") {
        eprintln!("=== {}", source.name());
        table_reruns(dir.path(), source.as_mut());
    }
}

/// (document id, title, text) of every document the index holds, by id.
fn documents(db: &Path) -> Vec<(String, Option<String>, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut s = conn
        .prepare(
            "SELECT d.id, d.title, group_concat(c.text, ' | ')
             FROM documents d JOIN chunks c ON c.document_id = d.id
             GROUP BY d.id ORDER BY d.id",
        )
        .unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn table_reruns(dir: &Path, source: &mut dyn Source) {
    source.exec(
        "CREATE TABLE articles (id integer, title text, body text, lang text,
                                updated_at integer);
         INSERT INTO articles VALUES
           (1, 'Hooks', 'Hooks let you use state without writing a class.', 'en', 1),
           (2, 'Routing', 'A router maps URLs to pages.', 'en', 1),
           (3, 'Effects', 'Effects synchronise a component with an outside system.', 'en', 1),
           (4, 'Refs', 'A ref holds a value that is not needed for rendering.', 'de', 1),
           (5, NULL, NULL, 'en', 1),
           (NULL, 'Orphan', 'A row without an id.', 'en', 1);",
    );
    let db = dir.join(format!("{}-index.db", source.name()));
    let uri = format!("sqlite://{}", db.display());
    let report = dir.join("report.json");
    let url = source.url("table=articles&text=title,body&title=title&updated=updated_at");
    let ingest = |extra: &[&str]| ingest_into(Path::new(&url), &uri, &report, extra);

    // First run: every good row indexed; the empty row dropped, the row without an id failed.
    let (code, first) = ingest(&[]);
    // 1: a document failed (the row without an id); the run went on.
    assert_eq!(code, Some(1), "{first}");
    let c = &first["counts"];
    assert_eq!(
        (&c["published"], &c["indexed"], &c["failed"], &c["dropped"]),
        (&json!(6), &json!(4), &json!(1), &json!(1)),
        "{first}"
    );
    assert_eq!(first["chunks_embedded"], 4);
    let failure = &first["failures"][0];
    let failed_id = failure["id"].as_str().unwrap();
    assert!(
        failed_id.starts_with("articles/(row ") && failed_id.ends_with(": no id)"),
        "{failed_id}"
    );
    assert!(failure["reason"].as_str().unwrap().contains("`id` is NULL"));
    assert_eq!(first["dropped"][0]["id"], "articles/5");
    assert!(first["dropped"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("`title`, `body` are NULL or empty"));
    let docs = documents(&db);
    assert_eq!(docs.len(), 4);
    assert_eq!(
        docs[0],
        (
            "articles/1".to_string(),
            Some("Hooks".to_string()),
            "Hooks\n\nHooks let you use state without writing a class.".to_string()
        )
    );

    // Nothing changed: nothing chunked or embedded.
    let (_, second) = ingest(&[]);
    assert_eq!(second["counts"]["unchanged"], 4, "{second}");
    assert_eq!(second["counts"]["children_created"], 0);
    assert_eq!(second["chunks_embedded"], 0);

    // A body edited without its `updated` column moving: the row's text is not even read
    // (the index keeps the old text: `updated=` is the row's version).
    source.exec("UPDATE articles SET body = 'Silently edited.' WHERE id = 4");
    let (_, quiet) = ingest(&[]);
    assert_eq!(quiet["counts"]["unchanged"], 4, "{quiet}");
    assert!(documents(&db)[3].2.contains("not needed for rendering"));

    // One row changed, one added, one deleted.
    source.exec(
        "UPDATE articles SET body = 'A router maps URLs to pages and back.', updated_at = 2
           WHERE id = 2;
         INSERT INTO articles VALUES (7, 'Context', 'Context passes data deep down.', 'en', 1);
         DELETE FROM articles WHERE id = 3;",
    );
    let (_, third) = ingest(&["--prune"]);
    let c = &third["counts"];
    assert_eq!(
        (&c["indexed"], &c["unchanged"], &third["chunks_embedded"]),
        (&json!(4), &json!(2), &json!(2)),
        "{third}"
    );
    assert_eq!(third["pruned"], 1);
    let ids: Vec<String> = documents(&db).into_iter().map(|d| d.0).collect();
    assert_eq!(
        ids,
        ["articles/1", "articles/2", "articles/4", "articles/7"]
    );
    assert!(documents(&db)[1].2.contains("pages and back"));

    // Search finds rows, with the other columns as metadata.
    let o = run(ragline()
        .args(["search", "which URL shows which page", "-k", "1", "--json"])
        .arg("--index")
        .arg(&uri));
    let hits: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(hits[0]["document_id"], "articles/2");
    assert_eq!(hits[0]["metadata"]["lang"], "en");
    assert_eq!(hits[0]["metadata"]["updated_at"], 2);
}

#[test]
fn bad_tables_and_columns_stop_the_run_naming_what_there_is() {
    let dir = tempfile::tempdir().unwrap();
    for mut source in sources(dir.path(), "bad") {
        eprintln!("=== {}", source.name());
        source.exec("CREATE TABLE notes (id integer, body text)");
        let db = dir.path().join(format!("{}-bad.db", source.name()));
        for (options, says) in [
            ("table=nope", "no table `nope`"),
            (
                "table=notes&text=content",
                "has no column `content`; its columns: id, body",
            ),
            ("table=notes;drop", "a name must be letters, digits and `_`"),
        ] {
            let o = run(ragline()
                .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
                .arg(model_dir())
                .arg("--index")
                .arg(format!("sqlite://{}", db.display()))
                .arg(source.url(options)));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{options}: {err}");
            assert!(err.contains(says), "{options}: {err}");
        }
        if source.name() == "sqlite" {
            // Text that is not UTF-8 fails its row alone.
            source.exec(
                "INSERT INTO notes VALUES (1, 'fine'), (2, CAST(X'6361666509' || X'e9' AS TEXT))",
            );
            let (code, r) = ingest_into(
                Path::new(&source.url("table=notes&text=body")),
                &format!("sqlite://{}", db.display()),
                &dir.path().join("bad.json"),
                &[],
            );
            assert_eq!(code, Some(1), "{r}");
            assert_eq!(r["counts"]["indexed"], 1, "{r}");
            assert_eq!(r["failures"][0]["id"], "notes/2");
            assert!(r["failures"][0]["reason"]
                .as_str()
                .unwrap()
                .contains("invalid UTF-8"));
        }
    }
}

/// Postgres types as they are used: uuid ids, timestamptz versions, numeric and array columns
/// as metadata. Only the row whose version moved is read again.
#[test]
fn a_postgres_table_with_uuid_ids_and_timestamps_rereads_only_what_moved() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut source) = sources(dir.path(), "typed")
        .into_iter()
        .find(|s| s.name() == "postgres")
    else {
        return;
    };
    source.exec(
        "CREATE TABLE pages (id uuid, body text, updated_at timestamptz, score numeric,
                             tags text[]);
         INSERT INTO pages VALUES
           ('00000000-0000-0000-0000-000000000001', 'Hooks let you use state.',
            '2026-01-01 10:00+00', 1.50, ARRAY['react', 'hooks']),
           ('00000000-0000-0000-0000-000000000002', 'A router maps URLs to pages.',
            '2026-01-01 10:00+00', 2.25, NULL);",
    );
    let db = dir.path().join("typed.db");
    let uri = format!("sqlite://{}", db.display());
    let report = dir.path().join("typed.json");
    let url = source.url("table=pages&text=body&updated=updated_at");
    let ingest = || ingest_into(Path::new(&url), &uri, &report, &[]);
    let (code, first) = ingest();
    assert_eq!(code, Some(0), "{first}");
    assert_eq!(first["counts"]["indexed"], 2);
    source.exec(
        "UPDATE pages SET body = 'A router maps URLs to pages and back.',
                          updated_at = '2026-01-02 10:00+00'
         WHERE id = '00000000-0000-0000-0000-000000000002'",
    );
    let (code, second) = ingest();
    assert_eq!(code, Some(0), "{second}");
    assert_eq!(
        (&second["counts"]["unchanged"], &second["chunks_embedded"]),
        (&json!(1), &json!(1)),
        "{second}"
    );
    let docs = documents(&db);
    assert_eq!(docs[1].0, "pages/00000000-0000-0000-0000-000000000002");
    assert!(docs[1].2.contains("pages and back"), "{docs:?}");
    let o = run(ragline()
        .args(["search", "state in a component", "-k", "1", "--json"])
        .arg("--index")
        .arg(&uri));
    let hits: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(hits[0]["metadata"]["tags"], json!(["react", "hooks"]));
    assert_eq!(hits[0]["metadata"]["score"], json!(1.5));
}

/// `ingest --follow`: the index follows the table, a pass every --poll-interval seconds,
/// rows added and (with --prune) deleted included, until the process is stopped.
#[test]
fn ingest_follow_keeps_the_index_in_sync_with_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut source = SqliteSource(dir.path().join("follow.db"));
    source.exec(
        "CREATE TABLE notes (id integer, body text, updated_at integer);
         INSERT INTO notes VALUES (1, 'Hooks let you use state.', 1),
                                  (2, 'A router maps URLs to pages.', 1);",
    );
    let db = dir.path().join("follow-index.db");
    let mut child = ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(format!("sqlite://{}", db.display()))
        .args(["--prune", "--follow", "--poll-interval", "1"])
        .arg(source.url("table=notes&text=body&updated=updated_at"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ids = || -> Vec<String> {
        if !db.exists() {
            return Vec::new();
        }
        let Ok(conn) = rusqlite::Connection::open(&db) else {
            return Vec::new();
        };
        conn.prepare("SELECT id FROM documents ORDER BY id")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap_or_default()
    };
    let limit = std::time::Duration::from_secs(120);
    wait_for("the first pass", limit, || ids() == ["notes/1", "notes/2"]);
    source.exec("INSERT INTO notes VALUES (3, 'Effects synchronise with the outside.', 1)");
    wait_for("the added row", limit, || ids().len() == 3);
    source.exec("DELETE FROM notes WHERE id = 1");
    wait_for("the deleted row to be pruned", limit, || {
        ids() == ["notes/2", "notes/3"]
    });
    // Still following: the process has not exited.
    assert!(child.try_wait().unwrap().is_none());
    kill9(&mut child);
}

/// `notify=CHANNEL` on a PostgreSQL table: `--follow` listens, and a pass starts when the
/// application notifies (here by a trigger), long before the poll interval (10 minutes) is up.
#[test]
fn ingest_follow_on_postgres_wakes_on_notify() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut source) = sources(dir.path(), "notify")
        .into_iter()
        .find(|s| s.name() == "postgres")
    else {
        return;
    };
    let channel = format!("ragline_notes_{}", std::process::id());
    source.exec(&format!(
        "CREATE TABLE notes (id integer PRIMARY KEY, body text, updated_at integer);
         INSERT INTO notes VALUES (1, 'Hooks let you use state.', 1);
         CREATE FUNCTION notes_changed() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $$;
         CREATE TRIGGER notes_changed AFTER INSERT OR UPDATE OR DELETE ON notes
           FOR EACH STATEMENT EXECUTE FUNCTION notes_changed();"
    ));
    let db = dir.path().join("notify-index.db");
    let mut child = ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(format!("sqlite://{}", db.display()))
        .args(["--prune", "--follow", "--poll-interval", "600"])
        .arg(source.url(&format!(
            "table=notes&text=body&updated=updated_at&notify={channel}"
        )))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let count = || -> usize {
        if !db.exists() {
            // Opening would make an empty file before ragline makes the index.
            return 0;
        }
        rusqlite::Connection::open(&db)
            .and_then(|c| c.query_row("SELECT count(*) FROM documents", [], |r| r.get(0)))
            .unwrap_or(0)
    };
    let limit = std::time::Duration::from_secs(120);
    wait_for("the first pass", limit, || count() == 1);
    source.exec("INSERT INTO notes VALUES (2, 'A router maps URLs to pages.', 1)");
    wait_for("the notified row", limit, || count() == 2);
    source.exec("DELETE FROM notes WHERE id = 1");
    wait_for("the notified deletion", limit, || count() == 1);
    assert!(child.try_wait().unwrap().is_none(), "still following");
    kill9(&mut child);
}
