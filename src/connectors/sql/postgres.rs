//! A PostgreSQL table, read through a connection the caller makes (the index's TLS settings
//! and URL options apply: `sslmode=verify-full` and its companions). Rows come as
//! `row_to_json`, so every column type reads as JSON, streamed from the server.

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::Client;
use serde_json::{Map, Value};

use super::{quote, Row, Rows, TableSpec};
use crate::connectors::ConnectorError;

/// Makes a connection to the database (the URL's password stays inside it).
pub type PgConnect = Box<dyn FnMut() -> Result<Client, ConnectorError> + Send>;

pub(super) struct PgRows {
    connect: PgConnect,
    client: Option<Client>,
    /// For messages: `postgres` and the table.
    shown: String,
}

impl PgRows {
    pub(super) fn new(connect: PgConnect) -> Self {
        PgRows {
            connect,
            client: None,
            shown: "postgres".into(),
        }
    }

    fn client(&mut self) -> Result<&mut Client, ConnectorError> {
        if self.client.is_none() {
            self.client = Some((self.connect)()?);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    fn err(&self, e: postgres::Error) -> ConnectorError {
        ConnectorError::Source(format!("{}: {e}", self.shown))
    }

    /// Rows of `SELECT row_to_json(t)::text ... {tail}` to `each`.
    fn rows(
        &mut self,
        spec: &TableSpec,
        tail: &str,
        params: &[&(dyn ToSql + Sync)],
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError> {
        let sql = format!(
            "SELECT row_to_json(t)::text FROM {} AS t {tail}",
            spec.quoted_table()
        );
        let shown = self.shown.clone();
        let err = |e: postgres::Error| ConnectorError::Source(format!("{shown}: {e}"));
        let client = self.client()?;
        let mut rows = client
            .query_raw(&sql, params.iter().copied())
            .map_err(err)?;
        while let Some(r) = rows.next().map_err(err)? {
            let json: &str = r.try_get(0).map_err(err)?;
            // Parsed whole: its allocations are bounded by its own size (and serde_json's
            // nesting limit); the text's size is checked against --max-file-bytes after.
            let row = match serde_json::from_str::<Map<String, Value>>(json) {
                Ok(columns) => Row {
                    columns,
                    unreadable: None,
                },
                Err(e) => Row {
                    columns: Map::new(),
                    unreadable: Some((spec.id.clone(), format!("unreadable row: {e}"))),
                },
            };
            if !each(row)? {
                break;
            }
        }
        Ok(())
    }
}

impl Rows for PgRows {
    fn columns(&mut self, spec: &TableSpec) -> Result<Vec<String>, ConnectorError> {
        self.shown = format!("postgres table `{}`", spec.table);
        let (schema, table) = match spec.table.split_once('.') {
            Some((s, t)) => (Some(s.to_string()), t.to_string()),
            None => (None, spec.table.clone()),
        };
        let shown = self.shown.clone();
        let err = |e: postgres::Error| ConnectorError::Source(format!("{shown}: {e}"));
        let client = self.client()?;
        // The table as the search path finds it, unless a schema is named.
        let rows = client
            .query(
                "SELECT a.attname::text FROM pg_attribute a
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
                 ORDER BY a.attnum",
                &[&spec.quoted_table()],
            )
            .map_err(err)?;
        if rows.is_empty() {
            let listed = client
                .query(
                    "SELECT table_schema || '.' || table_name FROM information_schema.tables
                     WHERE ($1::text IS NULL AND table_schema = ANY (current_schemas(false)))
                        OR table_schema = $1
                     ORDER BY 1 LIMIT 50",
                    &[&schema],
                )
                .map_err(err)?;
            let names: Vec<String> = listed.iter().map(|r| r.get(0)).collect();
            return Err(ConnectorError::Config(format!(
                "the database has no table `{}`{}; tables it has: {}",
                table,
                schema
                    .map(|s| format!(" in schema `{s}`"))
                    .unwrap_or_default(),
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            )));
        }
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn all(
        &mut self,
        spec: &TableSpec,
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError> {
        let tail = format!("ORDER BY t.{}", quote(&spec.id));
        self.rows(spec, &tail, &[], each)
    }

    fn versions(&mut self, spec: &TableSpec) -> Result<Vec<(Value, Value)>, ConnectorError> {
        let updated = spec.updated.as_deref().unwrap_or(&spec.id);
        let sql = format!(
            "SELECT json_build_array(t.{}, t.{})::text FROM {} AS t ORDER BY t.{}",
            quote(&spec.id),
            quote(updated),
            spec.quoted_table(),
            quote(&spec.id)
        );
        let rows = self.client()?.query(&sql, &[]);
        let rows = rows.map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let json: &str = r.get(0);
            let pair: (Value, Value) =
                serde_json::from_str(json).unwrap_or((Value::Null, Value::Null));
            out.push(pair);
        }
        Ok(out)
    }

    fn some(
        &mut self,
        spec: &TableSpec,
        ids: &[Value],
        each: &mut dyn FnMut(Row) -> Result<bool, ConnectorError>,
    ) -> Result<(), ConnectorError> {
        // The ids go as one JSON parameter, `[{"id": ...}, ...]`, turned back into the id
        // column's own type by jsonb_populate_recordset (a timestamp, numeric or uuid id reads
        // as the server wrote it), so the comparison is the column's and can use its index.
        let records: Vec<Value> = ids
            .iter()
            .map(|v| {
                let mut m = Map::new();
                m.insert(spec.id.clone(), v.clone());
                Value::Object(m)
            })
            .collect();
        let list = Value::Array(records).to_string();
        let tail = format!(
            "WHERE t.{id} IN (SELECT r.{id} FROM jsonb_populate_recordset(NULL::{table}, \
             $1::text::jsonb) AS r) ORDER BY t.{id}",
            id = quote(&spec.id),
            table = spec.quoted_table()
        );
        self.rows(spec, &tail, &[&list], each)
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }
}

/// `LISTEN` on a channel: `ingest --follow` waits on it between passes, so a change the
/// application announces (`NOTIFY channel`, or `pg_notify` in a trigger) starts a pass at once.
pub struct Listener {
    client: Client,
    channel: String,
}

impl Listener {
    /// A connection listening on `channel` (a plain identifier, checked by `TableSpec`).
    pub fn new(mut connect: PgConnect, channel: &str) -> Result<Listener, ConnectorError> {
        let mut client = connect()?;
        client
            .batch_execute(&format!("LISTEN {}", quote(channel)))
            .map_err(|e| ConnectorError::Source(format!("LISTEN {channel}: {e}")))?;
        Ok(Listener {
            client,
            channel: channel.to_string(),
        })
    }

    /// Wait up to `timeout` for a notification: true when one (or more: they are taken
    /// together) came, false when the time ran out.
    pub fn wait(&mut self, timeout: std::time::Duration) -> Result<bool, ConnectorError> {
        let failed =
            |e: postgres::Error| ConnectorError::Source(format!("LISTEN {}: {e}", self.channel));
        let mut notes = self.client.notifications();
        let first = notes.timeout_iter(timeout).next().map_err(failed)?;
        if first.is_none() {
            return Ok(false);
        }
        // Those that came with it start the same pass.
        while notes.iter().next().map_err(failed)?.is_some() {}
        Ok(true)
    }
}
