//! Reading the index: its metadata, vector and keyword searches, chunk rows. Opens the file
//! read-only, so it never changes it, and works while an ingest is writing (WAL).

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use super::{
    ann, keyword, read_only_flags, register_sqlite_vec, schema::SCHEMA_VERSION, vector_bytes,
};
use crate::indexers::meta::{annotation_sql, metadata_of};
use crate::indexers::{BackendError, ChunkRow, IndexMeta};

pub struct SqliteReader {
    conn: Connection,
    meta: IndexMeta,
    path: std::path::PathBuf,
    /// The active vector set (schema 6 on: the one whose ANN is searched).
    active: Option<super::sets::VectorSet>,
    /// Vector search scans every vector, ANN or not (`search --exact`).
    exact: bool,
    /// The active set's ANN, mapped on first use and again when a writer saves a new file.
    ann: std::sync::Mutex<Option<ann::AnnView>>,
    /// The graph's candidate list for every search (`search --ef`), over the measured one.
    ef: Option<usize>,
    /// How the last vector search was answered (`search --explain`).
    last: std::sync::Mutex<Option<crate::indexers::ann::VectorPlan>>,
    /// The chunks the last filter let through, with the file's `data_version` then: a
    /// service answering many queries under one filter (a tenant, a folder) finds them once
    /// per change of the index.
    allowed: std::sync::Mutex<Option<AllowedCache>>,
    /// The Tantivy index beside the file (`keyword.rs`), opened on first use.
    keyword: std::sync::Mutex<Option<keyword::KeywordView>>,
}

type AllowedCache = (
    crate::indexers::filter::Where,
    i64,
    std::sync::Arc<rustc_hash::FxHashSet<u64>>,
);

/// The index's `meta` table: the schema version and the models it was built with.
fn read_meta(conn: &Connection) -> rusqlite::Result<IndexMeta> {
    let rows: Vec<(String, String)> = conn
        .prepare("SELECT key, value FROM meta")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut meta = IndexMeta {
        vec_table: "chunk_vectors".into(),
        active_bit: 2,
        ..IndexMeta::default()
    };
    for (k, v) in rows {
        match k.as_str() {
            "schema_version" => meta.schema_version = v.parse().unwrap_or(0),
            "model" => meta.model = Some(v),
            "model_dir" => meta.model_dir = Some(v),
            "model_fingerprint" => meta.model_fingerprint = Some(v),
            "dimension" => meta.dimension = v.parse().ok(),
            "sparse_model" => meta.sparse_model = Some(v),
            "sparse_model_dir" => meta.sparse_model_dir = Some(v),
            "sparse_dimension" => meta.sparse_dimension = v.parse().ok(),
            _ => {}
        }
    }
    Ok(meta)
}

impl SqliteReader {
    /// Open an existing index read-only; a file that is not a ragline index is an error that
    /// says so.
    pub fn open(path: &Path) -> Result<Self, BackendError> {
        register_sqlite_vec();
        let not_index = |why: String| {
            BackendError::Invalid(format!(
                "`{}` is not a ragline index ({why}); choose another --index, or move the file \
                 away to create a new index there",
                path.display()
            ))
        };
        if !path.is_file() {
            return Err(BackendError::Invalid(format!(
                "no index at `{}`: run `ragline ingest` first, or give --index",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(path, read_only_flags())
            .map_err(|e| not_index(e.to_string()))?;
        // A writer's lock (another process's commit, its first set-up) is waited for.
        conn.busy_timeout(super::BUSY_TIMEOUT)
            .map_err(|e| not_index(e.to_string()))?;
        let unreadable = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => {
                not_index("not an SQLite database, or a corrupted one".into())
            }
            _ => not_index(e.to_string()),
        };
        if !has_table(&conn, "meta").map_err(unreadable)? {
            return Err(not_index(
                "an SQLite database without ragline's tables".into(),
            ));
        }
        let mut meta = read_meta(&conn).map_err(unreadable)?;
        if meta.schema_version > SCHEMA_VERSION {
            return Err(BackendError::Invalid(format!(
                "index `{}` has schema version {}, newer than this ragline understands ({}); \
                 upgrade ragline",
                path.display(),
                meta.schema_version,
                SCHEMA_VERSION
            )));
        }
        let mut active = None;
        if meta.schema_version >= 3 {
            if let Some(set) = super::sets::active(&conn).map_err(|e| not_index(e.to_string()))? {
                meta.vec_table = set.vec_table.clone();
                meta.active_bit = set.bit();
                meta.dimension = Some(set.dimension);
                active = Some(set);
            }
        }
        Ok(SqliteReader {
            conn,
            meta,
            path: path.to_path_buf(),
            active,
            exact: false,
            ann: std::sync::Mutex::new(None),
            ef: None,
            last: std::sync::Mutex::new(None),
            allowed: std::sync::Mutex::new(None),
            keyword: std::sync::Mutex::new(None),
        })
    }

    /// Vector search scans every vector instead of asking the ANN (`search --exact`).
    pub fn with_exact(mut self, exact: bool) -> Self {
        self.exact = exact;
        self
    }

    /// Every search through the ANN walks its graph with this ef (`search --ef`), not the one
    /// measured for the index's recall target.
    pub fn with_ef(mut self, ef: Option<usize>) -> Self {
        self.ef = ef;
        self
    }

    /// The `k` nearest chunks through the active set's ANN, among `allowed` ones, with how
    /// the search went; `None` when there is no usable ANN (or `--exact`).
    pub fn nearest_ann(
        &self,
        query: &[f32],
        k: usize,
        allowed: ann::Allowed<'_>,
    ) -> Result<Option<ann::AnnHits>, BackendError> {
        let exact = |why: &str| {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(crate::indexers::ann::VectorPlan {
                    index: "exact",
                    path: if allowed.is_some() {
                        "filter-scan"
                    } else {
                        "scan"
                    },
                    why: why.into(),
                    filtered_to: allowed.map(|a| a.len()),
                    rescored_from: "index",
                    ..Default::default()
                });
        };
        if self.exact {
            exact("--exact");
            return Ok(None);
        }
        let Some(set) = self
            .active
            .as_ref()
            .filter(|_| self.meta.schema_version >= 6)
        else {
            exact("the index has no vector set an ANN is kept for");
            return Ok(None);
        };
        // One snapshot: the ANN's record, the changes it lacks and the vectors.
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        let mut cache = self.ann.lock().unwrap_or_else(|p| p.into_inner());
        let ask = ann::AnnQuery {
            vector: query,
            k,
            allowed,
            ef: self.ef,
        };
        let found = ann::search(&self.path, &tx, &mut cache, set, &ask);
        match &found {
            Ok(Some((_, stats))) => {
                *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats.plan())
            }
            Ok(None) | Err(_) => exact(
                "no usable ANN: none built (`--ann hnsw`, or `auto` past 50,000 vectors), one \
                 being built, or more changes since it was saved than replaying them is worth",
            ),
        }
        match found {
            Ok(found) => Ok(found),
            Err(ann::AnnError::Sql(e)) => Err(self.err(e)),
            Err(e) => {
                tracing::warn!("{e}; searching exactly");
                *cache = None;
                Ok(None)
            }
        }
    }

    pub fn meta(&self) -> &IndexMeta {
        &self.meta
    }

    fn err(&self, e: rusqlite::Error) -> BackendError {
        BackendError::Io(format!("index: {e}"))
    }

    /// (documents, chunks, chunks with a vector in the active set) in the index; old
    /// versions of chunks kept for search are not counted.
    pub fn counts(&self) -> Result<(u64, u64, u64), BackendError> {
        let count = |sql: &str| -> Result<u64, BackendError> {
            self.conn
                .query_row(sql, [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(|e| self.err(e))
        };
        let documents = count("SELECT COUNT(*) FROM documents")?;
        if self.meta.schema_version < 3 {
            let vectors = if self.meta.dimension.is_some() {
                count("SELECT COUNT(*) FROM chunk_vectors")?
            } else {
                0
            };
            return Ok((documents, count("SELECT COUNT(*) FROM chunks")?, vectors));
        }
        let (chunks, vectors): (i64, i64) = self
            .conn
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(embedded & ?1 != 0), 0) FROM chunks
                 WHERE replaced_by IS NULL",
                [self.meta.active_bit],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(|e| self.err(e))?;
        Ok((documents, chunks as u64, vectors as u64))
    }

    /// Chunks not embedded yet in the active set, and all chunks: what vector search cannot
    /// see yet. (0, n) for a fully embedded index; cheap when nothing is missing.
    pub fn unembedded(&self) -> Result<(u64, u64), BackendError> {
        if self.meta.schema_version < 3 || self.meta.dimension.is_none() {
            return Ok((0, 0));
        }
        unembedded(&self.conn).map_err(|e| self.err(e))
    }

    /// Documents among `ids` whose embedding in the active set is still to do.
    pub fn unembedded_documents(&self, ids: &[String]) -> Result<Vec<String>, BackendError> {
        if self.meta.schema_version < 3 {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT 1 FROM enrichment e JOIN vector_sets s ON s.id = e.vector_set
                 WHERE e.document_id = ?1 AND e.stage = 'embed' AND s.state = 'active'
                   AND e.status IN ('pending', 'failed')",
            )
            .map_err(|e| self.err(e))?;
        for id in ids {
            if stmt.exists([id]).map_err(|e| self.err(e))? {
                out.push(id.clone());
            }
        }
        Ok(out)
    }

    /// The `k` chunks nearest to `query` by cosine distance: (rowid, distance), nearest first;
    /// through the ANN when the active set has one (exact distances either way).
    pub fn nearest(&self, query: &[f32], k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        if self.meta.dimension.is_none() {
            return Ok(Vec::new());
        }
        if let Some((found, _)) = self.nearest_ann(query, k, None)? {
            return Ok(found);
        }
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT rowid, distance FROM {}
                 WHERE embedding MATCH ?1 AND k = ?2 ORDER BY distance",
                self.meta.vec_table
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![vector_bytes(query), k as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// The chunks `filter` lets through (current ones and old versions kept for search).
    pub fn allowed(
        &self,
        filter: &crate::indexers::filter::Where,
    ) -> Result<std::sync::Arc<rustc_hash::FxHashSet<u64>>, BackendError> {
        // Changes when another connection commits (this one never writes).
        let version: i64 = self
            .conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let mut cache = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((w, v, set)) = cache.as_ref() {
            if w == filter && *v == version {
                return Ok(set.clone());
            }
        }
        // Documents first (every clause is about the document), then their chunks by the
        // index: 20 ms for 1% of 1M chunks, where chunks first walks all of them (300 ms).
        let (cond, params) = filter.sqlite();
        let set: rustc_hash::FxHashSet<u64> = self
            .conn
            .prepare_cached(&format!(
                "SELECT c.rowid FROM documents doc CROSS JOIN chunks c ON c.document_id = doc.id
                 WHERE {cond}"
            ))
            .and_then(|mut s| {
                s.query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    r.get::<_, i64>(0).map(|x| x as u64)
                })?
                .collect()
            })
            .map_err(|e| self.err(e))?;
        let set = std::sync::Arc::new(set);
        *cache = Some((filter.clone(), version, set.clone()));
        Ok(set)
    }

    /// [`SqliteReader::nearest`] among the chunks `filter` lets through: inside the ANN
    /// search (a mask on the graph, or scoring what matches when few do), else by scanning
    /// the vectors of what matches.
    pub fn nearest_where(
        &self,
        query: &[f32],
        k: usize,
        filter: &crate::indexers::filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        if filter.is_empty() {
            return self.nearest(query, k);
        }
        if self.meta.dimension.is_none() {
            return Ok(Vec::new());
        }
        if !self.exact && self.meta.schema_version >= 6 {
            let allowed = self.allowed(filter)?;
            if let Some((found, _)) = self.nearest_ann(query, k, Some(allowed.as_ref()))? {
                return Ok(found);
            }
        }
        let (cond, mut params) = filter.sqlite();
        let n = params.len();
        let sql = format!(
            "SELECT c.rowid, vec_distance_cosine(v.embedding, ?{q}) AS d
             FROM documents doc CROSS JOIN chunks c ON c.document_id = doc.id
                  JOIN {table} v ON v.rowid = c.rowid
             WHERE {cond} ORDER BY d LIMIT ?{k}",
            q = n + 1,
            k = n + 2,
            table = self.meta.vec_table
        );
        // The query as a float32 blob: as JSON, sqlite-vec would parse it again for every row.
        let mut values: Vec<rusqlite::types::Value> =
            params.drain(..).map(rusqlite::types::Value::Text).collect();
        values.push(rusqlite::types::Value::Blob(vector_bytes(query)));
        values.push(rusqlite::types::Value::Integer(k as i64));
        self.scored_rows(&sql, &values)
    }

    /// [`SqliteReader::keyword`] among the chunks `filter` lets through.
    pub fn keyword_where(
        &self,
        query: &str,
        k: usize,
        filter: &crate::indexers::filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        if filter.is_empty() {
            return self.keyword(query, k);
        }
        let allowed = self.allowed(filter)?;
        if let Some(found) = self.keyword_tantivy(query, k, Some(&allowed))? {
            return Ok(found);
        }
        let Some(terms) = fts_terms(query) else {
            return Ok(Vec::new());
        };
        let (cond, mut params) = filter.sqlite();
        let n = params.len();
        let sql = format!(
            "SELECT chunk_fts.rowid, bm25(chunk_fts) FROM chunk_fts
                 JOIN chunks c ON c.rowid = chunk_fts.rowid
                 JOIN documents doc ON doc.id = c.document_id
             WHERE chunk_fts MATCH ?{m} AND {cond} ORDER BY bm25(chunk_fts) LIMIT CAST(?{k} AS INTEGER)",
            m = n + 1,
            k = n + 2
        );
        params.push(terms);
        params.push(k.to_string());
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut s| {
                s.query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    Ok((r.get(0)?, -r.get::<_, f64>(1)?))
                })?
                .collect()
            })
            .map_err(|e| self.err(e))
    }

    /// The `k` best chunks for `query` by BM25 over text and heading path: (rowid, score),
    /// best first (higher is better). Every word of the query is optional (OR), as keyword
    /// retrieval over natural-language questions wants.
    pub fn keyword(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        match self.keyword_tantivy(query, k, None)? {
            Some(found) => Ok(found),
            None => self.keyword_fts5(query, k),
        }
    }

    /// [`SqliteReader::keyword`] by FTS5 alone.
    pub fn keyword_fts5(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        let terms: Vec<String> = query
            .split(|c: char| !c.is_alphanumeric())
            .filter(|t| !t.is_empty())
            .map(|t| format!("\"{t}\""))
            .collect();
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT rowid, bm25(chunk_fts) FROM chunk_fts
                 WHERE chunk_fts MATCH ?1 ORDER BY bm25(chunk_fts) LIMIT ?2",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![terms.join(" OR "), k as i64], |r| {
                // FTS5's bm25() is negative, lower is better: flip it.
                Ok((r.get(0)?, -r.get::<_, f64>(1)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// [`SqliteReader::keyword`] from the Tantivy index beside the file, among `allowed`
    /// where given; `None` where there is none or it has yet to take in a logged change (FTS5
    /// answers then).
    pub fn keyword_tantivy(
        &self,
        query: &str,
        k: usize,
        allowed: Option<&std::sync::Arc<rustc_hash::FxHashSet<u64>>>,
    ) -> Result<Option<Vec<(i64, f64)>>, BackendError> {
        if self.meta.schema_version < 10 {
            return Ok(None);
        }
        let mut view = self.keyword.lock().unwrap_or_else(|p| p.into_inner());
        if view.is_none() {
            *view = keyword::KeywordView::open(&self.path);
        }
        let Some(v) = view.as_mut() else {
            return Ok(None);
        };
        let (committed, mut waiting) =
            keyword::standing(&self.conn, v.seq()).map_err(|e| self.err(e))?;
        if committed > v.seq() {
            if let Err(e) = v.reload() {
                tracing::warn!("reloading the keyword index: {e}; FTS5 answers");
                *view = None;
                return Ok(None);
            }
            waiting = keyword::standing(&self.conn, v.seq())
                .map_err(|e| self.err(e))?
                .1;
        }
        if waiting {
            return Ok(None);
        }
        v.search(query, k, allowed).map(Some).map_err(|e| {
            BackendError::Io(format!(
                "keyword search in `{}`: {e}",
                keyword::dir_of(&self.path).display()
            ))
        })
    }

    pub fn chunk(&self, rowid: i64) -> Result<Option<ChunkRow>, BackendError> {
        let superseded = if self.meta.schema_version >= 3 {
            "c.replaced_by IS NOT NULL"
        } else {
            "0"
        };
        let pages = if self.meta.schema_version >= 4 {
            "c.page_start, c.page_end"
        } else {
            "NULL, NULL"
        };
        self.conn
            .prepare_cached(&format!(
                "SELECT c.rowid, c.id, c.document_id, d.source, d.title, c.heading_path,
                        c.ordinal, c.text, {superseded}, {pages}, d.metadata
                 FROM chunks c LEFT JOIN documents d ON d.id = c.document_id
                 WHERE c.rowid = ?1"
            ))
            .and_then(|mut s| {
                s.query_row([rowid], |r| {
                    Ok(ChunkRow {
                        rowid: r.get(0)?,
                        id: r.get(1)?,
                        document_id: r.get(2)?,
                        source: r.get(3)?,
                        title: r.get(4)?,
                        heading_path: r.get(5)?,
                        ordinal: r.get(6)?,
                        text: r.get(7)?,
                        superseded: r.get(8)?,
                        pages: match (r.get::<_, Option<u32>>(9)?, r.get::<_, Option<u32>>(10)?) {
                            (Some(a), Some(b)) => Some((a, b)),
                            _ => None,
                        },
                        outputs: Default::default(),
                        entities: Vec::new(),
                        labels: Vec::new(),
                        metadata: metadata_of(r.get::<_, Option<String>>(11)?.as_deref()),
                    })
                })
                .optional()
            })
            .map_err(|e| self.err(e))
            .and_then(|row| match row {
                Some(mut row) if self.meta.schema_version >= 5 => {
                    row.outputs = self.outputs_of(&row.document_id)?;
                    if self.meta.schema_version >= 9 {
                        self.annotate(&mut row)?;
                    }
                    Ok(Some(row))
                }
                other => Ok(other),
            })
    }

    /// The hit's document's entities and labels.
    fn annotate(&self, row: &mut ChunkRow) -> Result<(), BackendError> {
        let (entities, labels) = annotation_sql("document_entities", "document_labels");
        let doc = &row.document_id;
        row.entities = self
            .conn
            .prepare_cached(&entities)
            .and_then(|mut s| {
                s.query_map([doc], |r| {
                    Ok(crate::lifecycle::DocumentEntity {
                        kind: r.get(0)?,
                        text: r.get(1)?,
                        norm: r.get(2)?,
                        mentions: r.get(3)?,
                        score: r.get::<_, f64>(4)? as f32,
                        spans: Vec::new(),
                    })
                })?
                .collect()
            })
            .map_err(|e| self.err(e))?;
        row.labels = self
            .conn
            .prepare_cached(&labels)
            .and_then(|mut s| {
                s.query_map([doc], |r| {
                    Ok(crate::lifecycle::DocumentLabel {
                        label: r.get(0)?,
                        score: r.get::<_, f64>(1)? as f32,
                    })
                })?
                .collect()
            })
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// What document-level stages made of a document, by stage.
    fn outputs_of(
        &self,
        document: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, BackendError> {
        self.conn
            .prepare_cached(
                "SELECT stage, output FROM stage_outputs
                 WHERE document_id = ?1 AND stage NOT IN ('entities', 'labels')",
            )
            .and_then(|mut s| {
                s.query_map([document], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect()
            })
            .map_err(|e| self.err(e))
    }

    /// The documents whose stage outputs (in the keyword index) match `query`, as the rowid
    /// of each document's first chunk, best first.
    pub fn keyword_outputs(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        let terms: Vec<String> = query
            .split(|c: char| !c.is_alphanumeric())
            .filter(|t| !t.is_empty())
            .map(|t| format!("\"{t}\""))
            .collect();
        if terms.is_empty() || self.meta.schema_version < 5 {
            return Ok(Vec::new());
        }
        self.conn
            .prepare_cached(
                "SELECT (SELECT c.rowid FROM chunks c
                         WHERE c.document_id = o.document_id AND c.replaced_by IS NULL
                         ORDER BY c.ordinal LIMIT 1),
                        -bm25(output_fts)
                 FROM output_fts JOIN stage_outputs o ON o.rowid = output_fts.rowid
                 WHERE output_fts MATCH ?1 ORDER BY bm25(output_fts) LIMIT ?2",
            )
            .and_then(|mut s| {
                s.query_map(params![terms.join(" OR "), k as i64], |r| {
                    Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, f64>(1)?))
                })?
                .filter_map(|x| x.map(|(id, score)| id.map(|id| (id, score))).transpose())
                .collect()
            })
            .map_err(|e| self.err(e))
    }

    /// The `k` chunks whose sparse vectors have the largest dot product with the query's
    /// (`terms`, `weights`), among those `filter` lets through: (rowid, score), best first.
    pub fn sparse_where(
        &self,
        terms: &[u32],
        weights: &[f32],
        k: usize,
        filter: &crate::indexers::filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        if self.meta.sparse_model.is_none() {
            return Err(crate::indexers::no_sparse(&format!(
                "index `{}`",
                self.path.display()
            )));
        }
        let (cond, params) = filter.sqlite();
        let n = params.len();
        let sql = format!(
            "WITH s AS ({scored})
             SELECT s.chunk, s.score FROM s
                  JOIN chunks c ON c.rowid = s.chunk
                  JOIN documents doc ON doc.id = c.document_id
             WHERE {cond} ORDER BY s.score DESC, s.chunk LIMIT ?{k}",
            scored = super::sparse::scored_sql(n + 1),
            k = n + 2
        );
        let mut values: Vec<rusqlite::types::Value> = params
            .into_iter()
            .map(rusqlite::types::Value::Text)
            .collect();
        values.push(rusqlite::types::Value::Text(super::sparse::query_json(
            terms, weights,
        )));
        values.push(rusqlite::types::Value::Integer(k as i64));
        self.scored_rows(&sql, &values)
    }

    /// Runs `sql`, whose rows are (chunk rowid, score), with `values` bound in order.
    fn scored_rows(
        &self,
        sql: &str,
        values: &[rusqlite::types::Value],
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_map(rusqlite::params_from_iter(values.iter()), |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect()
            })
            .map_err(|e| self.err(e))
    }

    /// The document id of each chunk rowid (for document-level evaluation).
    pub fn document_of(&self, rowid: i64) -> Result<Option<String>, BackendError> {
        self.conn
            .prepare_cached("SELECT document_id FROM chunks WHERE rowid = ?1")
            .and_then(|mut s| s.query_row([rowid], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))
    }
}

impl SqliteReader {
    /// Rows of a facet statement, with the filter's values then `more`.
    fn facet_rows<T>(
        &self,
        sql: &str,
        filter: Vec<String>,
        more: Vec<rusqlite::types::Value>,
        mut each: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, BackendError> {
        if self.meta.schema_version < 9 {
            return Err(crate::indexers::facets::no_entities(
                &crate::indexers::IndexReader::describe(self),
            ));
        }
        let values: Vec<rusqlite::types::Value> = filter
            .into_iter()
            .map(rusqlite::types::Value::Text)
            .chain(more)
            .collect();
        self.conn
            .prepare(sql)
            .and_then(|mut s| {
                s.query_map(rusqlite::params_from_iter(values.iter()), |r| each(r))?
                    .collect()
            })
            .map_err(|e| self.err(e))
    }
}

impl crate::indexers::IndexReader for SqliteReader {
    fn entity_facets(
        &self,
        filter: &crate::indexers::filter::Where,
        kind: Option<&str>,
        top: usize,
    ) -> Result<Vec<crate::indexers::facets::EntityFacet>, BackendError> {
        use crate::indexers::facets::{entity_facet_sql, Dialect, EntityFacet};
        use rusqlite::types::Value;
        let (cond, params) = filter.sqlite();
        let sql = entity_facet_sql(Dialect::Sqlite, "", &cond, params.len());
        let kind = kind.map_or(Value::Null, |k| Value::Text(k.into()));
        self.facet_rows(&sql, params, vec![kind, Value::Integer(top as i64)], |r| {
            Ok(EntityFacet {
                kind: r.get(0)?,
                text: r.get(1)?,
                norm: r.get(2)?,
                documents: r.get::<_, i64>(3)?.max(0) as u64,
                mentions: r.get::<_, i64>(4)?.max(0) as u64,
            })
        })
    }

    fn label_facets(
        &self,
        filter: &crate::indexers::filter::Where,
        top: usize,
    ) -> Result<Vec<crate::indexers::facets::LabelFacet>, BackendError> {
        use crate::indexers::facets::{label_facet_sql, Dialect, LabelFacet};
        let (cond, params) = filter.sqlite();
        let sql = label_facet_sql(Dialect::Sqlite, "", &cond, params.len());
        let top = rusqlite::types::Value::Integer(top as i64);
        self.facet_rows(&sql, params, vec![top], |r| {
            Ok(LabelFacet {
                label: r.get(0)?,
                documents: r.get::<_, i64>(1)?.max(0) as u64,
            })
        })
    }

    fn entity_edges(
        &self,
        filter: &crate::indexers::filter::Where,
        kind: Option<&str>,
        each: &mut dyn FnMut(crate::indexers::facets::EntityEdge) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        use crate::indexers::facets::{edges_sql, Dialect, EntityEdge};
        use rusqlite::types::Value;
        if self.meta.schema_version < 9 {
            return Err(crate::indexers::facets::no_entities(
                &crate::indexers::IndexReader::describe(self),
            ));
        }
        let (cond, params) = filter.sqlite();
        let sql = edges_sql(Dialect::Sqlite, "", &cond, params.len());
        let mut values: Vec<Value> = params.into_iter().map(Value::Text).collect();
        values.push(kind.map_or(Value::Null, |k| Value::Text(k.into())));
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(values.iter()))
            .map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let edge = (|| -> rusqlite::Result<EntityEdge> {
                Ok(EntityEdge {
                    document: r.get(0)?,
                    kind: r.get(1)?,
                    entity: r.get(2)?,
                    norm: r.get(3)?,
                    count: r.get::<_, i64>(4)?.max(0) as u64,
                })
            })()
            .map_err(|e| self.err(e))?;
            each(edge)?;
        }
        Ok(())
    }

    fn meta(&self) -> &IndexMeta {
        SqliteReader::meta(self)
    }

    fn describe(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    fn counts(&self) -> Result<(u64, u64, u64), BackendError> {
        SqliteReader::counts(self)
    }

    fn unembedded(&self) -> Result<(u64, u64), BackendError> {
        SqliteReader::unembedded(self)
    }

    fn unembedded_documents(&self, ids: &[String]) -> Result<Vec<String>, BackendError> {
        SqliteReader::unembedded_documents(self, ids)
    }

    fn nearest(&self, query: &[f32], k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        SqliteReader::nearest(self, query, k)
    }

    fn keyword(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        SqliteReader::keyword(self, query, k)
    }

    fn nearest_where(
        &self,
        query: &[f32],
        k: usize,
        filter: &crate::indexers::filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        SqliteReader::nearest_where(self, query, k, filter)
    }

    fn keyword_where(
        &self,
        query: &str,
        k: usize,
        filter: &crate::indexers::filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        SqliteReader::keyword_where(self, query, k, filter)
    }

    fn keyword_outputs(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        SqliteReader::keyword_outputs(self, query, k)
    }

    fn chunk(&self, rowid: i64) -> Result<Option<ChunkRow>, BackendError> {
        SqliteReader::chunk(self, rowid)
    }

    fn sparse_where(
        &self,
        terms: &[u32],
        weights: &[f32],
        k: usize,
        filter: &crate::indexers::filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        SqliteReader::sparse_where(self, terms, weights, k, filter)
    }

    fn document_of(&self, rowid: i64) -> Result<Option<String>, BackendError> {
        SqliteReader::document_of(self, rowid)
    }

    fn set_ef(&mut self, ef: Option<usize>) {
        self.ef = ef;
    }

    fn last_plan(&self) -> Option<crate::indexers::ann::VectorPlan> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// (chunks of the active set without a vector, current chunks), from the lifecycle rows.
pub(super) fn unembedded(conn: &Connection) -> rusqlite::Result<(u64, u64)> {
    let missing: i64 = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(e.todo_chunks), 0) FROM enrichment e
             JOIN vector_sets s ON s.id = e.vector_set AND s.state = 'active'
             WHERE e.stage = 'embed' AND e.status != 'done'",
        )?
        .query_row([], |r| r.get(0))?;
    if missing == 0 {
        return Ok((0, 0));
    }
    let total: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM chunks WHERE replaced_by IS NULL")?
        .query_row([], |r| r.get(0))?;
    Ok((missing as u64, total as u64))
}

/// Whether the database has a table `name` (asked of its schema, not guessed from an error).
pub(crate) fn has_table(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [name],
        |r| r.get(0),
    )
}

/// A keyword query as FTS5 terms: every word quoted, any of them may match (OR); `None`
/// when it has no words.
fn fts_terms(query: &str) -> Option<String> {
    let terms: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(|t| format!("\"{t}\""))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" OR "))
}
