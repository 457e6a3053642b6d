//! Reading a Postgres index for search: vector (HNSW at the URI's `ef_search`, or an exact
//! scan, over the active vector set), keyword (`ts_rank` over the `tsvector`), and the chunk
//! rows.

use std::cell::RefCell;

use postgres::Client;

use super::target::{PgTarget, VectorType};
use super::{pg_error, read_meta};
use crate::indexers::{BackendError, ChunkRow, IndexMeta, IndexReader};

pub struct PgReader {
    client: RefCell<Client>,
    target: PgTarget,
    meta: IndexMeta,
    vector_type: VectorType,
    exact: bool,
}

impl PgReader {
    /// Open an existing index; `exact`: vector search scans every vector instead of the
    /// HNSW index.
    pub fn open(target: &PgTarget, exact: bool) -> Result<Self, BackendError> {
        let mut client = target.connect()?;
        let Some(m) = read_meta(&mut client, target)? else {
            return Err(BackendError::NoIndex(format!(
                "no ragline index in schema `{}` of {target}: run `ragline ingest --index ...` \
                 first, or give the right ?schema=",
                target.schema
            )));
        };
        client
            .batch_execute(&format!("SET hnsw.ef_search = {}", target.ef_search))
            .map_err(|e| pg_error(target, e))?;
        let active = if m.schema_version >= 1 {
            super::sets::active(&mut client, &target.schema_sql())
                .map_err(|e| pg_error(target, e))?
        } else {
            None
        };
        let meta = IndexMeta {
            schema_version: m.schema_version,
            model: active.as_ref().map(|a| a.model.clone()).or(m.model),
            model_dir: active.as_ref().map(|a| a.model_dir.clone()).or(m.model_dir),
            model_fingerprint: active
                .as_ref()
                .map(|a| a.fingerprint.clone())
                .or(m.model_fingerprint),
            dimension: active.as_ref().map(|a| a.dimension),
            vec_table: active
                .as_ref()
                .map(|a| a.vec_table.clone())
                .unwrap_or_default(),
            active_bit: 0,
            sparse_model: m.sparse_model,
            sparse_model_dir: m.sparse_model_dir,
            sparse_dimension: m.sparse_dimension,
        };
        Ok(PgReader {
            client: RefCell::new(client),
            target: target.clone(),
            meta,
            vector_type: m.vector_type.unwrap_or(VectorType::Vector),
            exact,
        })
    }

    fn err(&self, e: postgres::Error) -> BackendError {
        pg_error(&self.target, e)
    }

    /// Whether the active set's HNSW index exists (search is exact without it).
    pub fn has_hnsw(&self) -> Result<bool, BackendError> {
        if self.meta.vec_table.is_empty() {
            return Ok(false);
        }
        super::schema::has_hnsw(
            &mut *self.client.borrow_mut(),
            &self.target.schema,
            &self.meta.vec_table,
        )
        .map_err(|e| self.err(e))
    }
}

impl IndexReader for PgReader {
    fn meta(&self) -> &IndexMeta {
        &self.meta
    }

    fn describe(&self) -> String {
        self.target.to_string()
    }

    /// Old versions of chunks kept for search are not counted.
    fn counts(&self) -> Result<(u64, u64, u64), BackendError> {
        let s = self.target.schema_sql();
        let embedded = if self.meta.vec_table.is_empty() {
            "0::bigint".to_string()
        } else {
            format!(
                "(SELECT count(*) FROM {s}.chunks c JOIN {s}.{} v ON v.rowid = c.rowid
                  WHERE c.replaced_by IS NULL)",
                self.meta.vec_table
            )
        };
        let row = self
            .client
            .borrow_mut()
            .query_one(
                &format!(
                    "SELECT (SELECT count(*) FROM {s}.documents),
                            (SELECT count(*) FROM {s}.chunks WHERE replaced_by IS NULL),
                            {embedded}"
                ),
                &[],
            )
            .map_err(|e| self.err(e))?;
        Ok((
            row.get::<_, i64>(0) as u64,
            row.get::<_, i64>(1) as u64,
            row.get::<_, i64>(2) as u64,
        ))
    }

    fn unembedded(&self) -> Result<(u64, u64), BackendError> {
        if self.meta.vec_table.is_empty() {
            return Ok((0, 0));
        }
        super::admin::unembedded(&mut *self.client.borrow_mut(), &self.target.schema_sql())
            .map_err(|e| self.err(e))
    }

    fn unembedded_documents(&self, ids: &[String]) -> Result<Vec<String>, BackendError> {
        let s = self.target.schema_sql();
        let rows = self
            .client
            .borrow_mut()
            .query(
                &format!(
                    "SELECT DISTINCT e.document_id FROM {s}.enrichment e
                     JOIN {s}.vector_sets v ON v.id = e.vector_set AND v.state = 'active'
                     WHERE e.document_id = ANY($1::text[]) AND e.stage = 'embed'
                       AND e.status IN ('pending', 'failed')"
                ),
                &[&ids],
            )
            .map_err(|e| self.err(e))?;
        let found: std::collections::HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
        Ok(ids.iter().filter(|i| found.contains(*i)).cloned().collect())
    }

    fn nearest(&self, query: &[f32], k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        let Some(dim) = self.meta.dimension else {
            return Ok(Vec::new());
        };
        let q = match self.vector_type {
            VectorType::Vector => "$1::vector".to_string(),
            VectorType::Halfvec => format!("$1::vector::halfvec({dim})"),
        };
        // `+ 0` hides the ordering from the planner, so no index serves it: an exact scan.
        let order = if self.exact {
            format!("(embedding <=> {q}) + 0")
        } else {
            format!("embedding <=> {q}")
        };
        let rows = self
            .client
            .borrow_mut()
            .query(
                &format!(
                    "SELECT rowid, embedding <=> {q} FROM {}.{} ORDER BY {order} LIMIT $2",
                    self.target.schema_sql(),
                    self.meta.vec_table
                ),
                &[&pgvector::Vector::from(query.to_vec()), &(k as i64)],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Every word of the query is optional (OR), as for the SQLite index; ranked by
    /// PostgreSQL's `ts_rank` with normalisation 1 (divided by 1 + the log of the chunk's
    /// length, as BM25 favours the shorter of two chunks with the same matches). Not BM25:
    /// `ts_rank_cd` (cover density) ranked long chunks with one query word repeated first.
    /// The query's words are analysed as the chunks' text was (`fts.rs`).
    fn keyword(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        let Some(tsquery) = super::fts::any_word_query(query) else {
            return Ok(Vec::new());
        };
        let rows = self
            .client
            .borrow_mut()
            .query(
                &format!(
                    "SELECT rowid, ts_rank(fts, q, 1)::float8 AS score
                     FROM {}.chunks, CAST($1::text AS tsquery) q
                     WHERE fts @@ q ORDER BY score DESC, rowid LIMIT $2",
                    self.target.schema_sql()
                ),
                &[&tsquery, &(k as i64)],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// An exact scan of the sparse vectors by inner product (`<#>` is its negative).
    fn sparse_where(
        &self,
        terms: &[u32],
        weights: &[f32],
        k: usize,
        filter: &crate::indexers::filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        let (Some(_), Some(dim)) = (&self.meta.sparse_model, self.meta.sparse_dimension) else {
            return Err(crate::indexers::no_sparse(&self.describe()));
        };
        if !filter.is_empty() {
            return Err(crate::indexers::no_filters(&self.describe()));
        }
        let query = super::sparse_vector(terms, weights, dim);
        let rows = self
            .client
            .borrow_mut()
            .query(
                &format!(
                    "SELECT chunk, -(embedding <#> $1)::float8 AS score FROM {}.sparse_vectors
                     ORDER BY embedding <#> $1, chunk LIMIT $2",
                    self.target.schema_sql()
                ),
                &[&query, &(k as i64)],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i64>(0), r.get::<_, f64>(1)))
            .filter(|(_, score)| *score > 0.0)
            .collect())
    }

    fn chunk(&self, rowid: i64) -> Result<Option<ChunkRow>, BackendError> {
        let s = self.target.schema_sql();
        let row = self
            .client
            .borrow_mut()
            .query_opt(
                &format!(
                    "SELECT c.rowid, c.id, c.document_id, d.source, d.title, c.heading_path,
                            c.ordinal, c.text, c.page_start, c.page_end,
                            c.replaced_by IS NOT NULL, d.metadata::text
                     FROM {s}.chunks c LEFT JOIN {s}.documents d ON d.id = c.document_id
                     WHERE c.rowid = $1"
                ),
                &[&rowid],
            )
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| ChunkRow {
            rowid: r.get(0),
            id: r.get(1),
            document_id: r.get(2),
            source: r.get(3),
            title: r.get(4),
            heading_path: r.get(5),
            ordinal: r.get::<_, i32>(6) as i64,
            text: r.get(7),
            superseded: r.get(10),
            pages: match (r.get::<_, Option<i32>>(8), r.get::<_, Option<i32>>(9)) {
                (Some(a), Some(b)) => Some((a as u32, b as u32)),
                _ => None,
            },
            outputs: Default::default(),
            metadata: crate::indexers::sqlite::reader::metadata_of(
                r.get::<_, Option<String>>(11).as_deref(),
            ),
        }))
        .and_then(|row| match row {
            Some(mut row) => {
                row.outputs = self
                    .client
                    .borrow_mut()
                    .query(
                        &format!(
                            "SELECT stage, output FROM {s}.stage_outputs WHERE document_id = $1"
                        ),
                        &[&row.document_id],
                    )
                    .map_err(|e| self.err(e))?
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect();
                Ok(Some(row))
            }
            None => Ok(None),
        })
    }

    fn keyword_outputs(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        let Some(tsquery) = super::fts::any_word_query(query) else {
            return Ok(Vec::new());
        };
        let s = self.target.schema_sql();
        let rows = self
            .client
            .borrow_mut()
            .query(
                &format!(
                    "SELECT first.rowid, ts_rank(o.fts, q, 1)::float8 AS score
                     FROM {s}.stage_outputs o, CAST($1::text AS tsquery) q,
                          LATERAL (SELECT c.rowid FROM {s}.chunks c
                                   WHERE c.document_id = o.document_id
                                     AND c.replaced_by IS NULL
                                   ORDER BY c.ordinal LIMIT 1) first
                     WHERE o.fts @@ q ORDER BY score DESC, first.rowid LIMIT $2"
                ),
                &[&tsquery, &(k as i64)],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    fn document_of(&self, rowid: i64) -> Result<Option<String>, BackendError> {
        let row = self
            .client
            .borrow_mut()
            .query_opt(
                &format!(
                    "SELECT document_id FROM {}.chunks WHERE rowid = $1",
                    self.target.schema_sql()
                ),
                &[&rowid],
            )
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| r.get(0)))
    }

    fn documents_of(&self, rowids: &[i64]) -> Result<Vec<Option<String>>, BackendError> {
        let rows = self
            .client
            .borrow_mut()
            .query(
                &format!(
                    "SELECT rowid, document_id FROM {}.chunks WHERE rowid = ANY($1)",
                    self.target.schema_sql()
                ),
                &[&rowids],
            )
            .map_err(|e| self.err(e))?;
        let of: std::collections::HashMap<i64, String> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(rowids.iter().map(|r| of.get(r).cloned()).collect())
    }
}
