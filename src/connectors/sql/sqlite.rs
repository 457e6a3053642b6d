//! A SQLite file's table, opened read-only (another process may be writing it: WAL readers
//! see the last commit).

use std::path::PathBuf;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use serde_json::{Map, Value};

use super::{quote, Row, Rows, TableSpec};
use crate::connectors::{decode, BadRecord, ConnectorError, Decoded};

pub(super) struct SqliteRows {
    path: PathBuf,
    conn: Connection,
}

impl SqliteRows {
    /// `url` is `sqlite://PATH` (the table options taken off).
    pub(super) fn open(url: &str) -> Result<Self, ConnectorError> {
        let path = url.strip_prefix("sqlite://").unwrap_or(url);
        if path.contains('?') {
            return Err(ConnectorError::Config(format!(
                "{url}: unknown option; a SQLite table takes table=, id=, text=, title=, \
                 updated= and format="
            )));
        }
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(ConnectorError::Config(format!(
                "sqlite://{}: no such file",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| ConnectorError::Source(format!("{}: {e}", path.display())))?;
        // A writer holding the file a moment is waited for, not failed on.
        let _ = conn.busy_timeout(std::time::Duration::from_secs(30));
        Ok(SqliteRows { path, conn })
    }

    fn err(&self, e: rusqlite::Error) -> ConnectorError {
        ConnectorError::Source(format!("{}: {e}", self.path.display()))
    }

    /// Run `sql` with `params`, each row to `each` as a [`Row`].
    fn rows(
        &self,
        spec: &TableSpec,
        sql: &str,
        params: &[rusqlite::types::Value],
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError> {
        let mut stmt = self.conn.prepare(sql).map_err(|e| self.err(e))?;
        let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params))
            .map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let mut row = Row {
                columns: Map::new(),
                unreadable: None,
            };
            for (i, name) in names.iter().enumerate() {
                let value = r.get_ref(i).map_err(|e| self.err(e))?;
                let text_column = spec.text.iter().any(|t| t == name)
                    || spec.title.as_deref() == Some(name.as_str());
                match cell(value, text_column) {
                    Ok(Some(v)) => {
                        row.columns.insert(name.clone(), v);
                    }
                    Ok(None) => {}
                    Err(reason) => {
                        row.unreadable.get_or_insert((name.clone(), reason.0));
                    }
                }
            }
            if !each(row)? {
                break;
            }
        }
        Ok(())
    }
}

/// A cell as JSON: `None` for a blob outside the text columns (not metadata); an error for a
/// text column whose bytes are not text.
fn cell(value: ValueRef<'_>, text_column: bool) -> Result<Option<Value>, BadRecord> {
    Ok(Some(match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Real(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) if text_column => {
            match decode(bytes.to_vec()) {
                Decoded::Text(t) => Value::String(t),
                Decoded::Empty => Value::Null,
                Decoded::Binary => {
                    return Err(BadRecord("holds binary data (NUL bytes), not text".into()));
                }
                Decoded::Invalid(why) => {
                    return Err(BadRecord(why.replace("the file", "the value")))
                }
            }
        }
        ValueRef::Text(bytes) => Value::String(String::from_utf8_lossy(bytes).into_owned()),
        ValueRef::Blob(_) => return Ok(None),
    }))
}

impl Rows for SqliteRows {
    fn columns(&mut self, spec: &TableSpec) -> Result<Vec<String>, ConnectorError> {
        let exists: bool = self
            .conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type IN ('table', 'view')
                                AND name = ?1)",
                [spec.name()],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        if !exists {
            let tables: Vec<String> = self
                .conn
                .prepare(
                    "SELECT name FROM sqlite_schema WHERE type IN ('table', 'view') ORDER BY name",
                )
                .and_then(|mut s| {
                    s.query_map([], |r| r.get::<_, String>(0))?
                        .collect::<Result<_, _>>()
                })
                .map_err(|e| self.err(e))?;
            return Err(ConnectorError::Config(format!(
                "{} has no table `{}`; its tables: {}",
                self.path.display(),
                spec.table,
                tables.join(", ")
            )));
        }
        let sql = format!("SELECT * FROM {} LIMIT 0", spec.quoted_table());
        let stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let names = stmt.column_names().iter().map(|s| s.to_string()).collect();
        Ok(names)
    }

    fn all(
        &mut self,
        spec: &TableSpec,
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError> {
        let sql = format!(
            "SELECT * FROM {} ORDER BY {}",
            spec.quoted_table(),
            quote(&spec.id)
        );
        self.rows(spec, &sql, &[], each)
    }

    fn versions(&mut self, spec: &TableSpec) -> Result<Vec<(Value, Value)>, ConnectorError> {
        let updated = spec.updated.as_deref().unwrap_or(&spec.id);
        let sql = format!(
            "SELECT {}, {} FROM {} ORDER BY 1",
            quote(&spec.id),
            quote(updated),
            spec.quoted_table()
        );
        let mut out = Vec::new();
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let mut rows = stmt.query([]).map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let get = |i| -> Result<Value, ConnectorError> {
                let v = r.get_ref(i).map_err(|e| self.err(e))?;
                Ok(cell(v, false).ok().flatten().unwrap_or(Value::Null))
            };
            out.push((get(0)?, get(1)?));
        }
        Ok(out)
    }

    fn some(
        &mut self,
        spec: &TableSpec,
        ids: &[Value],
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError> {
        let marks = vec!["?"; ids.len()].join(", ");
        let sql = format!(
            "SELECT * FROM {} WHERE {} IN ({marks}) ORDER BY {}",
            spec.quoted_table(),
            quote(&spec.id),
            quote(&spec.id)
        );
        let params: Vec<rusqlite::types::Value> = ids
            .iter()
            .map(|v| match v {
                Value::Number(n) if n.is_i64() => {
                    rusqlite::types::Value::Integer(n.as_i64().unwrap_or_default())
                }
                Value::Number(n) => rusqlite::types::Value::Real(n.as_f64().unwrap_or_default()),
                Value::String(s) => rusqlite::types::Value::Text(s.clone()),
                _ => rusqlite::types::Value::Null,
            })
            .collect();
        self.rows(spec, &sql, &params, each)
    }

    fn describe(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }
}
