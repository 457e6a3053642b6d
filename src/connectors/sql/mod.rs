//! SQL tables as documents: `sqlite://FILE?table=T` and `postgres://...?table=T` (the
//! `postgres` feature). Each row is a document: its id column (`id=`, default `id`) names it
//! `TABLE/ID`, its text columns (`text=a,b`, default `text`) are joined as the document's
//! sections, `title=` names the title column, and every other column goes to metadata.
//!
//! Incremental runs: unchanged rows are neither chunked nor embedded (their content hash
//! matches the index's). With `updated=COLUMN`, a row's version is that column's value: the
//! connector first reads only ids and versions, and fetches the text of the rows whose version
//! the index does not hold yet, so an unchanged row costs a look-up, not a read of its text.
//! Rows gone from the table are reported, and removed with `--prune`, as for files.
//!
//! A bad row fails or is dropped alone, with its id and the reason: a NULL id (failed), text
//! columns that are all NULL or empty (dropped), text that is not UTF-8 or binary, or a row
//! over `--max-file-bytes` (failed). The table or a column that is not there stops the run
//! before anything is published, naming what the table has.

#[cfg(feature = "postgres")]
pub mod postgres;
mod sqlite;

use serde_json::{Map, Value};

use super::{known_unchanged, Connector, ConnectorError, KnownIndex};
use crate::document::Document;
use crate::publisher::Publisher;

#[cfg(feature = "postgres")]
pub use self::postgres::PgConnect;

/// The query options of a table source, as ragline reads them (the others are the database's).
pub const TABLE_OPTIONS: &[&str] = &["table", "id", "text", "title", "updated", "format"];

/// The formats a row's text may be read as.
const FORMATS: &[&str] = &["text", "markdown", "html"];

/// Rows whose text is fetched per query when `updated=` chose which.
const FETCH_BATCH: usize = 256;

/// Which table, and which of its columns make the document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// `table` or `schema.table`, each part a plain identifier.
    pub table: String,
    pub id: String,
    pub text: Vec<String>,
    pub title: Option<String>,
    pub updated: Option<String>,
    /// How the text is extracted: `text` (default), `markdown` or `html`.
    pub format: String,
    /// PostgreSQL: the channel `ingest --follow` listens on (`LISTEN`), a pass starting as soon
    /// as a notification comes instead of at the next poll.
    pub notify: Option<String>,
}

/// Whether `source` names a table (a `sqlite://` or `postgres://` URL with `table=`) rather
/// than a file or folder.
pub fn is_table_source(source: &str) -> bool {
    is_database_url(source)
        && source.split_once('?').is_some_and(|(_, q)| {
            q.split('&')
                .any(|p| p.split_once('=').map_or(p, |(k, _)| k) == "table")
        })
}

/// Whether `source` is a database URL (`sqlite://`, `postgres://`, `postgresql://`), with or
/// without `table=`.
pub fn is_database_url(source: &str) -> bool {
    ["sqlite://", "postgres://", "postgresql://"]
        .iter()
        .any(|s| source.starts_with(s))
}

impl TableSpec {
    /// Split ragline's options off `url`'s query: the table spec, and the URL with the
    /// database's own options only.
    pub fn parse(url: &str) -> Result<(TableSpec, String), ConnectorError> {
        let shown = crate::secret::redact_url(url);
        let bad = |why: String| ConnectorError::Config(format!("{shown}: {why}"));
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut spec = TableSpec {
            table: String::new(),
            id: "id".into(),
            text: vec!["text".into()],
            title: None,
            updated: None,
            format: "text".into(),
            notify: None,
        };
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let column = |v: &str| -> Result<String, ConnectorError> {
                identifier(v).ok_or_else(|| bad(format!("`{key}={v}`: {IDENTIFIER_RULE}")))
            };
            match key {
                "table" => {
                    let parts: Vec<&str> = value.split('.').collect();
                    if parts.len() > 2 {
                        return Err(bad(format!("`table={value}`: give TABLE or SCHEMA.TABLE")));
                    }
                    for p in &parts {
                        column(p)?;
                    }
                    spec.table = value.to_string();
                }
                "id" => spec.id = column(value)?,
                "text" => {
                    spec.text = value.split(',').map(column).collect::<Result<_, _>>()?;
                }
                "title" => spec.title = Some(column(value)?),
                "updated" => spec.updated = Some(column(value)?),
                "notify" => spec.notify = Some(column(value)?),
                "format" => {
                    if !FORMATS.contains(&value) {
                        return Err(bad(format!(
                            "`format={value}`: give one of {}",
                            FORMATS.join(", ")
                        )));
                    }
                    spec.format = value.to_string();
                }
                _ => rest.push(pair),
            }
        }
        if spec.table.is_empty() {
            return Err(bad("give the table: `?table=NAME`".into()));
        }
        let url = if rest.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        Ok((spec, url))
    }

    /// The table, quoted for SQL (`"schema"."table"`).
    fn quoted_table(&self) -> String {
        self.table
            .split('.')
            .map(quote)
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The table's name as document ids carry it.
    fn name(&self) -> &str {
        self.table.rsplit('.').next().unwrap_or(&self.table)
    }

    /// The columns the spec names, each once.
    fn named_columns(&self) -> Vec<&str> {
        let mut all = vec![self.id.as_str()];
        all.extend(self.text.iter().map(String::as_str));
        all.extend(self.title.as_deref());
        all.extend(self.updated.as_deref());
        all.dedup();
        all
    }

    /// Refuse a table without the columns the spec names, saying which it has.
    fn check_columns(&self, have: &[String]) -> Result<(), ConnectorError> {
        for c in self.named_columns() {
            if !have.iter().any(|h| h == c) {
                return Err(ConnectorError::Config(format!(
                    "table `{}` has no column `{c}`; its columns: {}",
                    self.table,
                    have.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The version key a row with `updated` value `version` has: what the index stores as its
    /// content hash, so a row whose version it holds is known unchanged without its text.
    fn version_key(&self, version: &Value) -> String {
        super::version_key(&[
            "sql-row",
            &self.text.join(","),
            self.title.as_deref().unwrap_or(""),
            &self.format,
            self.updated.as_deref().unwrap_or(""),
            &version.to_string(),
        ])
    }
}

/// A plain SQL identifier (letters, digits, `_`, not starting with a digit): what a column or
/// table option may be, so it can be quoted into a statement.
fn identifier(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    ok.then(|| name.to_string())
}

/// Why [`identifier`] refused a name.
const IDENTIFIER_RULE: &str =
    "a name must be letters, digits and `_` (not starting with a digit), at most 63";

fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

/// One row as read: its columns as JSON values, and what could not be read of it.
struct Row {
    columns: Map<String, Value>,
    /// (column, reason): a text column that is not text (not UTF-8, binary).
    unreadable: Option<(String, String)>,
}

/// Where a table's rows come from.
trait Rows: Send {
    /// The table's columns (the run stops here if the table is not there).
    fn columns(&mut self, spec: &TableSpec) -> Result<Vec<String>, ConnectorError>;
    /// Every row, in id order, to `each` (false from `each`: stop).
    fn all(
        &mut self,
        spec: &TableSpec,
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError>;
    /// (id, version) of every row, in id order.
    fn versions(&mut self, spec: &TableSpec) -> Result<Vec<(Value, Value)>, ConnectorError>;
    /// The rows of these ids (as `versions` gave them; never none).
    fn some(
        &mut self,
        spec: &TableSpec,
        ids: &[Value],
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError>;
    /// The source, for messages (no password).
    fn describe(&self) -> String;
}

/// Reads one table.
pub struct TableConnector {
    spec: TableSpec,
    rows: Box<dyn Rows>,
    max_row_bytes: u64,
    known: Option<KnownIndex>,
    /// Rows read so far (names a row without an id).
    rows_read: usize,
}

impl TableConnector {
    /// A SQLite table: `url` is `sqlite://FILE?table=...`. The file is opened read-only.
    pub fn sqlite(url: &str, max_row_bytes: u64) -> Result<Self, ConnectorError> {
        let (spec, rest) = TableSpec::parse(url)?;
        if spec.notify.is_some() {
            return Err(ConnectorError::Config(format!(
                "{}: `notify=` is PostgreSQL's LISTEN/NOTIFY; SQLite has none (--follow polls \
                 every --poll-interval)",
                crate::secret::redact_url(url)
            )));
        }
        let rows = sqlite::SqliteRows::open(&rest)?;
        Ok(TableConnector {
            spec,
            rows: Box::new(rows),
            max_row_bytes,
            known: None,
            rows_read: 0,
        })
    }

    /// A PostgreSQL table, through the connection `connect` makes (TLS as the URL says).
    #[cfg(feature = "postgres")]
    pub fn postgres(
        spec: TableSpec,
        connect: PgConnect,
        max_row_bytes: u64,
    ) -> Result<Self, ConnectorError> {
        Ok(TableConnector {
            spec,
            rows: Box::new(self::postgres::PgRows::new(connect)),
            max_row_bytes,
            known: None,
            rows_read: 0,
        })
    }

    /// Whether the index holds the row `id` at version `key`, made with this pipeline.
    fn holds(&self, id: &str, key: &str) -> bool {
        self.known.as_ref().is_some_and(|k| k.holds(id, key))
    }

    fn publish_row(&mut self, row: Row, publisher: &Publisher) -> Result<(), ConnectorError> {
        self.rows_read += 1;
        match row_document(&self.spec, row, self.rows_read, self.max_row_bytes) {
            Made::Doc(doc) => publisher.publish(*doc)?,
            Made::Failed(id, reason) => publisher.publish_failed(&id, Some(&id), "read", &reason),
            Made::Dropped(id, reason) => publisher.publish_dropped(&id, Some(&id), "read", &reason),
        }
        Ok(())
    }

    /// With `updated=`: versions first, then the text of the rows the index lacks.
    fn run_by_version(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        let versions = self.rows.versions(&self.spec)?;
        let mut fetch = Vec::new();
        for (raw_id, version) in versions {
            let Some(id) = id_text(&raw_id) else {
                // A NULL id: the full read reports it with its row.
                fetch.push(raw_id);
                continue;
            };
            let doc_id = format!("{}/{id}", self.spec.name());
            let key = self.spec.version_key(&version);
            if self.holds(&doc_id, &key) {
                publisher.publish(known_unchanged(doc_id.clone(), doc_id, key))?;
            } else {
                fetch.push(raw_id);
            }
            if fetch.len() >= FETCH_BATCH {
                self.fetch(&std::mem::take(&mut fetch), publisher)?;
            }
        }
        self.fetch(&fetch, publisher)
    }

    fn fetch(&mut self, ids: &[Value], publisher: &Publisher) -> Result<(), ConnectorError> {
        if ids.is_empty() {
            return Ok(());
        }
        let (nulls, ids): (Vec<&Value>, Vec<Value>) = (
            ids.iter().filter(|v| v.is_null()).collect(),
            ids.iter().filter(|v| !v.is_null()).cloned().collect(),
        );
        for _ in nulls {
            self.rows_read += 1;
            let at = null_id(&self.spec, self.rows_read);
            publisher.publish_failed(
                &at,
                Some(&at),
                "read",
                &format!(
                    "the id column `{}` is NULL; give every row an id (or choose another \
                     column with `id=`)",
                    self.spec.id
                ),
            );
        }
        if ids.is_empty() {
            return Ok(());
        }
        let mut batch = Vec::with_capacity(ids.len());
        self.rows.some(&self.spec, &ids, &mut |row| {
            batch.push(row);
            Ok(true)
        })?;
        for row in batch {
            self.publish_row(row, publisher)?;
        }
        Ok(())
    }
}

impl Connector for TableConnector {
    fn name(&self) -> &'static str {
        "sql"
    }

    fn know(&mut self, index: &KnownIndex) {
        self.known = Some(index.clone());
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        let have = self.rows.columns(&self.spec)?;
        self.spec.check_columns(&have)?;
        tracing::info!(
            "reading table `{}` of {}",
            self.spec.table,
            self.rows.describe()
        );
        if self.spec.updated.is_some() {
            return self.run_by_version(publisher);
        }
        let spec = self.spec.clone();
        let max = self.max_row_bytes;
        let mut stopped = None;
        let mut number = 0;
        self.rows.all(&spec, &mut |row| {
            number += 1;
            let made = row_document(&spec, row, number, max);
            let sent = match made {
                Made::Doc(doc) => publisher.publish(*doc),
                Made::Failed(id, reason) => {
                    publisher.publish_failed(&id, Some(&id), "read", &reason);
                    Ok(())
                }
                Made::Dropped(id, reason) => {
                    publisher.publish_dropped(&id, Some(&id), "read", &reason);
                    Ok(())
                }
            };
            match sent {
                Ok(()) => Ok(true),
                Err(e) => {
                    stopped = Some(e);
                    Ok(false)
                }
            }
        })?;
        match stopped {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// What a row makes.
enum Made {
    Doc(Box<Document>),
    /// (document id, reason)
    Failed(String, String),
    Dropped(String, String),
}

/// The id a row without one is reported under (`TABLE/(row N: no id)`, N counting from 1 in
/// id order).
fn null_id(spec: &TableSpec, number: usize) -> String {
    format!("{}/(row {number}: no id)", spec.name())
}

/// An id value as text: a non-empty string or a number.
fn id_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The non-empty values of the text columns, taken out of `columns`.
fn text_parts(spec: &TableSpec, columns: &mut Map<String, Value>) -> Vec<String> {
    let mut parts = Vec::new();
    for c in &spec.text {
        match columns.remove(c) {
            Some(Value::String(s)) if !s.trim().is_empty() => parts.push(s),
            Some(Value::Null | Value::String(_)) | None => {}
            Some(other) => parts.push(other.to_string()),
        }
    }
    parts
}

/// Why a row with no text is dropped.
fn no_text(spec: &TableSpec) -> String {
    format!(
        "the text column{} {} NULL or empty",
        if spec.text.len() > 1 { "s" } else { "" },
        spec.text
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
            + if spec.text.len() > 1 { " are" } else { " is" }
    )
}

/// The document a row makes, or why it makes none.
fn row_document(spec: &TableSpec, row: Row, number: usize, max_bytes: u64) -> Made {
    let Row {
        mut columns,
        unreadable,
    } = row;
    let raw_id = columns.remove(&spec.id).unwrap_or(Value::Null);
    let Some(id) = id_text(&raw_id) else {
        return Made::Failed(
            null_id(spec, number),
            format!(
                "the id column `{}` is {}; give every row an id (or choose another column \
                 with `id=`)",
                spec.id,
                if raw_id.is_null() {
                    "NULL"
                } else {
                    "empty or not a string or number"
                }
            ),
        );
    };
    let doc_id = format!("{}/{id}", spec.name());
    if let Some((column, reason)) = unreadable {
        return Made::Failed(doc_id, format!("column `{column}`: {reason}"));
    }
    let version = spec
        .updated
        .as_ref()
        .map(|u| spec.version_key(columns.get(u).unwrap_or(&Value::Null)));
    let title = spec.title.as_ref().and_then(|t| match columns.get(t) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        Some(Value::Null | Value::String(_)) | None => None,
        Some(other) => Some(other.to_string()),
    });
    let parts = text_parts(spec, &mut columns);
    if parts.is_empty() {
        return Made::Dropped(doc_id, no_text(spec));
    }
    let text = parts.join("\n\n");
    if text.len() as u64 > max_bytes {
        return Made::Failed(
            doc_id,
            format!(
                "the row's text is {} bytes, over --max-file-bytes={max_bytes} (the limit of one \
                 document); raise it to ingest this row",
                text.len()
            ),
        );
    }
    let mut doc = Document::new(doc_id.clone(), text);
    doc.fields.source = Some(doc_id);
    doc.fields.title = title;
    if let Some(t) = &spec.title {
        columns.remove(t);
    }
    doc.content_hash = version;
    doc.fields.metadata = columns.into_iter().collect();
    doc.fields
        .metadata
        .insert("table".into(), Value::String(spec.table.clone()));
    doc.fields
        .metadata
        .insert("format".into(), Value::String(spec.format.clone()));
    Made::Doc(Box::new(doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> TableSpec {
        TableSpec::parse(url).unwrap().0
    }

    #[test]
    fn the_options_are_split_from_the_databases() {
        let (s, rest) = TableSpec::parse(
            "postgres://u:pw@h/db?sslmode=require&table=docs.articles&id=aid&text=title,body\
             &updated=updated_at&format=markdown&notify=articles_changed",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:pw@h/db?sslmode=require");
        assert_eq!(s.table, "docs.articles");
        assert_eq!(s.quoted_table(), "\"docs\".\"articles\"");
        assert_eq!(s.name(), "articles");
        assert_eq!((s.id.as_str(), s.text.len()), ("aid", 2));
        assert_eq!(s.updated.as_deref(), Some("updated_at"));
        assert_eq!(s.format, "markdown");
        assert_eq!(s.notify.as_deref(), Some("articles_changed"));
        assert!(is_table_source("sqlite://x.db?table=t"));
        assert!(!is_table_source("sqlite://x.db"));
        assert!(!is_table_source("docs/table=x"));
    }

    #[test]
    fn names_that_are_not_plain_identifiers_are_refused_without_the_password() {
        for bad in [
            "sqlite://x.db?table=t;drop",
            "sqlite://x.db?table=t&text=a\"b",
            "sqlite://x.db?table=a.b.c",
            "sqlite://x.db?table=1t",
            "sqlite://x.db?id=x",
            "postgres://u:hunter2@h/db?table=t&format=pdf",
            "postgres://u:hunter2@h/db?table=t&notify=a-b",
        ] {
            let err = TableSpec::parse(bad).unwrap_err().to_string();
            assert!(!err.contains("hunter2"), "{err}");
            assert!(err.contains("table") || err.contains("name") || err.contains("format"));
        }
    }

    fn row(pairs: &[(&str, Value)]) -> Row {
        Row {
            columns: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            unreadable: None,
        }
    }

    #[test]
    fn a_row_makes_a_document_or_says_why_not() {
        let s = spec("sqlite://x.db?table=a&text=title,body&title=title");
        let made = row_document(
            &s,
            row(&[
                ("id", 7.into()),
                ("title", "Hooks".into()),
                ("body", "Use state.".into()),
                ("lang", "en".into()),
            ]),
            1,
            1 << 20,
        );
        let Made::Doc(doc) = made else { panic!() };
        assert_eq!(doc.id, "a/7");
        assert_eq!(doc.fields.text, "Hooks\n\nUse state.");
        assert_eq!(doc.fields.title.as_deref(), Some("Hooks"));
        assert_eq!(doc.fields.metadata["lang"], "en");
        assert_eq!(doc.fields.metadata["table"], "a");
        assert!(doc.content_hash.is_none());

        match row_document(&s, row(&[("id", 8.into()), ("body", Value::Null)]), 2, 100) {
            Made::Dropped(id, why) => {
                assert_eq!(id, "a/8");
                assert!(why.contains("`title`, `body` are NULL or empty"), "{why}");
            }
            _ => panic!(),
        }
        match row_document(
            &s,
            row(&[("id", Value::Null), ("body", "x".into())]),
            3,
            100,
        ) {
            Made::Failed(id, why) => {
                assert_eq!(id, "a/(row 3: no id)");
                assert!(why.contains("`id` is NULL"), "{why}");
            }
            _ => panic!(),
        }
        match row_document(
            &s,
            row(&[("id", 9.into()), ("body", "x".repeat(101).into())]),
            4,
            100,
        ) {
            Made::Failed(id, why) => {
                assert_eq!(id, "a/9");
                assert!(why.contains("over --max-file-bytes=100"), "{why}");
            }
            _ => panic!(),
        }
        let mut bad = row(&[("id", "k".into())]);
        bad.unreadable = Some(("body".into(), "not UTF-8".into()));
        match row_document(&s, bad, 5, 100) {
            Made::Failed(id, why) => assert_eq!(
                (id.as_str(), why.as_str()),
                ("a/k", "column `body`: not UTF-8")
            ),
            _ => panic!(),
        }
    }

    #[test]
    fn the_version_key_follows_the_version_and_the_spec() {
        let s = spec("sqlite://x.db?table=a&updated=u");
        let k1 = s.version_key(&Value::from(1));
        assert_eq!(k1, s.version_key(&Value::from(1)));
        assert_ne!(k1, s.version_key(&Value::from(2)));
        let other = spec("sqlite://x.db?table=a&updated=u&text=body");
        assert_ne!(k1, other.version_key(&Value::from(1)));
        let Made::Doc(doc) = row_document(
            &s,
            row(&[("id", 1.into()), ("text", "t".into()), ("u", 1.into())]),
            1,
            100,
        ) else {
            panic!()
        };
        assert_eq!(doc.content_hash.as_deref(), Some(k1.as_str()));
    }
}
