//! Reading a Postgres index for search: vector (HNSW at the URI's `ef_search`, or an exact
//! scan, over the active vector set), keyword (`ts_rank` over the `tsvector`), and the chunk
//! rows.

use std::cell::RefCell;

use postgres::types::ToSql;
use postgres::Client;

use super::target::{PgTarget, VectorType};
use super::{pg_error, read_meta};
use crate::indexers::filter::{Param, Where};
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

/// A filter's values as Postgres binds them.
fn bind(params: &[Param]) -> Vec<Box<dyn ToSql + Sync>> {
    params
        .iter()
        .map(|p| -> Box<dyn ToSql + Sync> {
            match p {
                Param::Text(t) => Box::new(t.clone()),
                Param::Path(keys) => Box::new(keys.clone()),
            }
        })
        .collect()
}

impl PgReader {
    /// The rows of `sql`, whose parameters are the filter's then `more`.
    fn rows(
        &self,
        sql: &str,
        filter: &[Param],
        more: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, BackendError> {
        if self.meta.schema_version < 5 {
            return Err(crate::indexers::facets::no_entities(&self.describe()));
        }
        let bound = bind(filter);
        let mut all: Vec<&(dyn ToSql + Sync)> = bound.iter().map(|b| b.as_ref()).collect();
        all.extend_from_slice(more);
        self.client
            .borrow_mut()
            .query(sql, &all)
            .map_err(|e| self.err(e))
    }

    /// Rows of (rowid, score) from `sql`, whose `$1`, `$2` are `first` and the filter's
    /// parameters follow.
    fn filtered(
        &self,
        sql: &str,
        first: [&(dyn ToSql + Sync); 2],
        filter: &[Param],
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        let rest = bind(filter);
        let mut all: Vec<&(dyn ToSql + Sync)> = first.to_vec();
        all.extend(rest.iter().map(|b| b.as_ref()));
        let rows = self
            .client
            .borrow_mut()
            .query(sql, &all)
            .map_err(|e| self.err(e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

impl PgReader {
    /// The hit's document's entities and labels.
    fn annotate(&self, row: &mut ChunkRow) -> Result<(), BackendError> {
        let s = self.target.schema_sql();
        let (entities, labels) = crate::indexers::meta::annotation_sql(
            &format!("{s}.document_entities"),
            &format!("{s}.document_labels"),
        );
        let mut client = self.client.borrow_mut();
        row.entities = client
            .query(&entities.replace("?1", "$1"), &[&row.document_id])
            .map_err(|e| pg_error(&self.target, e))?
            .iter()
            .map(|r| crate::lifecycle::DocumentEntity {
                kind: r.get(0),
                text: r.get(1),
                norm: r.get(2),
                mentions: r.get::<_, i32>(3).max(0) as u32,
                score: r.get(4),
                spans: Vec::new(),
            })
            .collect();
        row.labels = client
            .query(&labels.replace("?1", "$1"), &[&row.document_id])
            .map_err(|e| pg_error(&self.target, e))?
            .iter()
            .map(|r| crate::lifecycle::DocumentLabel {
                label: r.get(0),
                score: r.get(1),
            })
            .collect();
        Ok(())
    }
}

impl IndexReader for PgReader {
    fn entity_facets(
        &self,
        filter: &Where,
        kind: Option<&str>,
        top: usize,
    ) -> Result<Vec<crate::indexers::facets::EntityFacet>, BackendError> {
        use crate::indexers::facets::{entity_facet_sql, Dialect, EntityFacet};
        let s = self.target.schema_sql();
        let (cond, params) = filter.postgres(&s, 1);
        let sql = entity_facet_sql(Dialect::Postgres, &format!("{s}."), &cond, params.len());
        let kind = kind.map(str::to_string);
        let top = top as i64;
        let rows = self.rows(&sql, &params, &[&kind, &top])?;
        Ok(rows
            .iter()
            .map(|r| EntityFacet {
                kind: r.get(0),
                text: r.get(1),
                norm: r.get(2),
                documents: r.get::<_, i64>(3).max(0) as u64,
                mentions: r.get::<_, i64>(4).max(0) as u64,
            })
            .collect())
    }

    fn label_facets(
        &self,
        filter: &Where,
        top: usize,
    ) -> Result<Vec<crate::indexers::facets::LabelFacet>, BackendError> {
        use crate::indexers::facets::{label_facet_sql, Dialect, LabelFacet};
        let s = self.target.schema_sql();
        let (cond, params) = filter.postgres(&s, 1);
        let sql = label_facet_sql(Dialect::Postgres, &format!("{s}."), &cond, params.len());
        let rows = self.rows(&sql, &params, &[&(top as i64)])?;
        Ok(rows
            .iter()
            .map(|r| LabelFacet {
                label: r.get(0),
                documents: r.get::<_, i64>(1).max(0) as u64,
            })
            .collect())
    }

    fn entity_edges(
        &self,
        filter: &Where,
        kind: Option<&str>,
        each: &mut dyn FnMut(crate::indexers::facets::EntityEdge) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        use crate::indexers::facets::{edges_sql, Dialect, EntityEdge};
        let s = self.target.schema_sql();
        let (cond, params) = filter.postgres(&s, 1);
        let sql = edges_sql(Dialect::Postgres, &format!("{s}."), &cond, params.len());
        let kind = kind.map(str::to_string);
        for r in self.rows(&sql, &params, &[&kind])? {
            each(EntityEdge {
                document: r.get(0),
                kind: r.get(1),
                entity: r.get(2),
                norm: r.get(3),
                count: r.get::<_, i32>(4).max(0) as u64,
            })?;
        }
        Ok(())
    }

    /// An exact scan of the vectors of the chunks `filter` lets through (found by the
    /// indexes of documents, entities and labels): k results whenever k match. HNSW with a
    /// filter would stop at `ef_search` candidates and return fewer.
    fn nearest_where(
        &self,
        query: &[f32],
        k: usize,
        filter: &Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        if filter.is_empty() {
            return self.nearest(query, k);
        }
        let Some(dim) = self.meta.dimension else {
            return Ok(Vec::new());
        };
        let q = match self.vector_type {
            VectorType::Vector => "$1::vector".to_string(),
            VectorType::Halfvec => format!("$1::vector::halfvec({dim})"),
        };
        let s = self.target.schema_sql();
        let (cond, params) = filter.postgres(&s, 3);
        let sql = format!(
            "SELECT v.rowid, v.embedding <=> {q} FROM {s}.{table} v
                 JOIN {s}.chunks c ON c.rowid = v.rowid
                 JOIN {s}.documents doc ON doc.id = c.document_id
             WHERE {cond} ORDER BY (v.embedding <=> {q}) + 0, v.rowid LIMIT $2",
            table = self.meta.vec_table
        );
        let vector = pgvector::Vector::from(query.to_vec());
        self.filtered(&sql, [&vector, &(k as i64)], &params)
    }

    fn keyword_where(
        &self,
        query: &str,
        k: usize,
        filter: &Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        if filter.is_empty() {
            return self.keyword(query, k);
        }
        let Some(tsquery) = super::fts::any_word_query(query) else {
            return Ok(Vec::new());
        };
        let s = self.target.schema_sql();
        let (cond, params) = filter.postgres(&s, 3);
        let sql = format!(
            "SELECT c.rowid, ts_rank(c.fts, q, 1)::float8 AS score
             FROM {s}.chunks c JOIN {s}.documents doc ON doc.id = c.document_id,
                  CAST($1::text AS tsquery) q
             WHERE c.fts @@ q AND {cond} ORDER BY score DESC, c.rowid LIMIT $2"
        );
        self.filtered(&sql, [&tsquery, &(k as i64)], &params)
    }

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
        filter: &Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        let (Some(_), Some(dim)) = (&self.meta.sparse_model, self.meta.sparse_dimension) else {
            return Err(crate::indexers::no_sparse(&self.describe()));
        };
        let query = super::sparse_vector(terms, weights, dim);
        let s = self.target.schema_sql();
        let (cond, params) = filter.postgres(&s, 3);
        let sql = format!(
            "SELECT v.chunk, -(v.embedding <#> $1)::float8 AS score FROM {s}.sparse_vectors v
                 JOIN {s}.chunks c ON c.rowid = v.chunk
                 JOIN {s}.documents doc ON doc.id = c.document_id
             WHERE {cond} ORDER BY v.embedding <#> $1, v.chunk LIMIT $2"
        );
        Ok(self
            .filtered(&sql, [&query, &(k as i64)], &params)?
            .into_iter()
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
            entities: Vec::new(),
            labels: Vec::new(),
            metadata: crate::indexers::meta::metadata_of(r.get::<_, Option<String>>(11).as_deref()),
        }))
        .and_then(|row| match row {
            Some(mut row) => {
                row.outputs = self
                    .client
                    .borrow_mut()
                    .query(
                        &format!(
                            "SELECT stage, output FROM {s}.stage_outputs
                             WHERE document_id = $1 AND stage NOT IN ('entities', 'labels')"
                        ),
                        &[&row.document_id],
                    )
                    .map_err(|e| self.err(e))?
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect();
                if self.meta.schema_version >= 5 {
                    self.annotate(&mut row)?;
                }
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
