//! Document-level stages (LLM stages) in the Postgres index: the same as the SQLite index's
//! (`indexers/sqlite/outputs.rs`): queueing, the document's text, outputs replaced in one
//! transaction with the status, a `tsvector` when they go in the keyword index.

use postgres::GenericClient;

use super::fts::TsVector;
use super::queue::{PgStore, Sql};
use crate::indexers::admin::{self, OutputSql};
use crate::lifecycle::{
    Annotations, ChunkSparse, ChunkText, DocumentText, Priority, SparseModelRecord, StoreError,
    WorkKey,
};

impl PgStore {
    pub(super) fn sync_stage_rows(
        &mut self,
        stage: &str,
        fingerprint: &str,
        priority: Priority,
    ) -> Result<u64, StoreError> {
        self.write(|tx, s, now| {
            let n = tx.execute(
                &format!(
                    "INSERT INTO {s}.enrichment(document_id, stage, vector_set, status, priority,
                         seq, fingerprint, input_version, enqueued_at, updated_at)
                     SELECT d.id, $1, 0, 'pending',
                            CASE WHEN e.input_version = d.version THEN $5::int ELSE $2::int END,
                            nextval('{s}.enrichment_seq'), $3, d.version, $4, $4
                     FROM {s}.documents d
                     LEFT JOIN {s}.enrichment e
                       ON e.document_id = d.id AND e.stage = $1 AND e.vector_set = 0
                     WHERE e.id IS NULL
                        OR ((e.input_version != d.version OR COALESCE(e.fingerprint, '') != $3)
                            AND e.status != 'in_progress')
                     ORDER BY d.id
                     ON CONFLICT (document_id, stage, vector_set) DO UPDATE SET
                         status = 'pending',
                         priority = CASE WHEN {s}.enrichment.status = 'done'
                             THEN excluded.priority
                             ELSE GREATEST({s}.enrichment.priority, excluded.priority) END,
                         seq = excluded.seq, attempts = 0, not_before = 0, lease_owner = NULL,
                         lease_expires = NULL, fingerprint = excluded.fingerprint,
                         input_version = excluded.input_version, claimed_at = NULL,
                         claim_seq = NULL, done_at = NULL, enqueued_at = excluded.enqueued_at,
                         updated_at = excluded.updated_at"
                ),
                &[
                    &stage,
                    &(priority.level() as i32),
                    &fingerprint,
                    &now,
                    &(Priority::Backfill.level() as i32),
                ],
            )?;
            Ok(n)
        })
    }

    pub(super) fn read_document_text(
        &mut self,
        id: &str,
    ) -> Result<Option<DocumentText>, StoreError> {
        let s = self.s.clone();
        let mut q = Sql {
            c: &mut self.client,
            s: &s,
        };
        admin::document_text(&mut q, id).map_err(|e| self.err(e))
    }

    pub(super) fn write_stage_output(
        &mut self,
        owner: &str,
        key: &WorkKey,
        output: &str,
        keyword: bool,
    ) -> Result<bool, StoreError> {
        self.write(|tx, s, now| {
            let mut q = Sql { c: tx, s };
            Ok(admin::write_output(
                &mut q, owner, key, output, keyword, now,
            )?)
        })
    }

    pub(super) fn read_current_chunks(
        &mut self,
        id: &str,
    ) -> Result<Option<Vec<ChunkText>>, StoreError> {
        let s = self.s.clone();
        let mut q = Sql {
            c: &mut self.client,
            s: &s,
        };
        admin::current_chunks(&mut q, id).map_err(|e| self.err(e))
    }

    pub(super) fn write_sparse_vectors(
        &mut self,
        owner: &str,
        key: &WorkKey,
        chunks: &[ChunkSparse],
    ) -> Result<bool, StoreError> {
        self.write(|tx, s, now| {
            let mut q = Sql { c: tx, s };
            Ok(admin::write_sparse(&mut q, owner, key, chunks, now)?)
        })
    }

    pub(super) fn write_stage_annotations(
        &mut self,
        owner: &str,
        key: &WorkKey,
        annotations: &Annotations,
        prompt_text: &str,
    ) -> Result<bool, StoreError> {
        self.write(|tx, s, now| {
            let mut q = Sql { c: tx, s };
            Ok(admin::write_annotations(
                &mut q,
                owner,
                key,
                annotations,
                prompt_text,
                now,
            )?)
        })
    }

    pub(super) fn write_dependencies(
        &mut self,
        edges: &[(String, String)],
    ) -> Result<(), StoreError> {
        self.write(|tx, s, _| {
            let mut q = Sql { c: tx, s };
            Ok(q.put_dependencies(edges)?)
        })
    }

    pub(super) fn read_sparse_model(&mut self) -> Result<Option<SparseModelRecord>, StoreError> {
        let s = self.s.clone();
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT key, value FROM {s}.meta WHERE key IN ('sparse_model',
                         'sparse_model_dir', 'sparse_fingerprint', 'sparse_dimension')"
                ),
                &[],
            )
            .map_err(|e| self.err(e))?;
        let get = |k: &str| {
            rows.iter()
                .find(|r| r.get::<_, &str>(0) == k)
                .map(|r| r.get::<_, String>(1))
        };
        let (Some(name), Some(fingerprint)) = (get("sparse_model"), get("sparse_fingerprint"))
        else {
            return Ok(None);
        };
        Ok(Some(SparseModelRecord {
            name,
            dir: get("sparse_model_dir").unwrap_or_default(),
            fingerprint,
            dimension: get("sparse_dimension")
                .and_then(|d| d.parse().ok())
                .unwrap_or(0),
        }))
    }

    pub(super) fn put_sparse_model(&mut self, m: &SparseModelRecord) -> Result<(), StoreError> {
        self.write(|tx, s, _| {
            let sql = format!(
                "INSERT INTO {s}.meta(key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value"
            );
            let dimension = m.dimension.to_string();
            for (k, v) in [
                ("sparse_model", &m.name),
                ("sparse_model_dir", &m.dir),
                ("sparse_fingerprint", &m.fingerprint),
                ("sparse_dimension", &dimension),
            ] {
                tx.execute(&sql, &[&k, v])?;
            }
            Ok(())
        })
    }
}

impl<C: GenericClient> OutputSql for Sql<'_, C> {
    type Error = postgres::Error;

    fn document_version(
        &mut self,
        id: &str,
    ) -> Result<Option<(Option<String>, Option<String>, String)>, postgres::Error> {
        let s = self.s;
        let sql = format!("SELECT title, source, version FROM {s}.documents WHERE id = $1");
        Ok(self
            .c
            .query_opt(&sql, &[&id])?
            .map(|r| (r.get(0), r.get(1), r.get(2))))
    }

    fn chunk_spans(
        &mut self,
        id: &str,
        version: &str,
    ) -> Result<Vec<(usize, usize, String)>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT start_byte, end_byte, text FROM {s}.chunks
                 WHERE document_id = $1 AND version = $2 AND replaced_by IS NULL
                 ORDER BY ordinal"
            ),
            &[&id, &version],
        )?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<_, i64>(0) as usize,
                    r.get::<_, i64>(1) as usize,
                    r.get(2),
                )
            })
            .collect())
    }

    fn held_for_output(
        &mut self,
        owner: &str,
        key: &WorkKey,
    ) -> Result<Option<i64>, postgres::Error> {
        let s = self.s;
        let row = self.c.query_opt(
            &format!(
                "SELECT e.id FROM {s}.enrichment e JOIN {s}.documents d
                   ON d.id = e.document_id
                 WHERE e.document_id = $1 AND e.stage = $2 AND e.vector_set = 0
                   AND e.status = 'in_progress' AND e.lease_owner = $3
                   AND e.input_version = d.version
                 FOR UPDATE OF e"
            ),
            &[&key.document_id, &key.stage, &owner],
        )?;
        Ok(row.map(|r| r.get(0)))
    }

    fn put_output(
        &mut self,
        key: &WorkKey,
        output: &str,
        keyword: bool,
        metadata: bool,
        now: i64,
    ) -> Result<bool, postgres::Error> {
        let s = self.s;
        let before: Option<String> = self
            .c
            .query_opt(
                &format!(
                    "SELECT output FROM {s}.stage_outputs WHERE document_id = $1 AND stage = $2"
                ),
                &[&key.document_id, &key.stage],
            )?
            .map(|r| r.get(0));
        // Analysed as chunks are (`fts.rs`), when it goes in the keyword index.
        let fts = keyword.then(|| TsVector::of(&[output]));
        self.c.execute(
            &format!(
                "INSERT INTO {s}.stage_outputs(document_id, stage, output, keyword, at, fts)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (document_id, stage) DO UPDATE SET output = excluded.output,
                     keyword = excluded.keyword, at = excluded.at, fts = excluded.fts"
            ),
            &[&key.document_id, &key.stage, &output, &keyword, &now, &fts],
        )?;
        if metadata {
            self.c.execute(
                &format!(
                    "UPDATE {s}.documents
                     SET metadata = jsonb_set(metadata, ARRAY[$2::text], to_jsonb($3::text))
                     WHERE id = $1"
                ),
                &[&key.document_id, &key.stage, &output],
            )?;
        }
        Ok(before.as_deref() != Some(output))
    }

    fn outputs_of(&mut self, id: &str) -> Result<Vec<(String, String)>, postgres::Error> {
        let s = self.s;
        Ok(self
            .c
            .query(
                &format!(
                    "SELECT stage, output FROM {s}.stage_outputs WHERE document_id = $1
                     ORDER BY stage"
                ),
                &[&id],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    fn put_annotations(
        &mut self,
        document: &str,
        annotations: &Annotations,
    ) -> Result<(), postgres::Error> {
        let s = self.s;
        match annotations {
            Annotations::Entities(entities) => {
                self.c.execute(
                    &format!("DELETE FROM {s}.document_entities WHERE document_id = $1"),
                    &[&document],
                )?;
                let insert = self.c.prepare(&format!(
                    "INSERT INTO {s}.document_entities(document_id, type, norm, text, mentions,
                         score, spans) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                ))?;
                for e in entities {
                    let spans = serde_json::to_string(&e.spans).unwrap_or_else(|_| "[]".into());
                    let mentions = e.mentions.min(i32::MAX as u32) as i32;
                    self.c.execute(
                        &insert,
                        &[
                            &document, &e.kind, &e.norm, &e.text, &mentions, &e.score, &spans,
                        ],
                    )?;
                }
            }
            Annotations::Labels(labels) => {
                self.c.execute(
                    &format!("DELETE FROM {s}.document_labels WHERE document_id = $1"),
                    &[&document],
                )?;
                let insert = self.c.prepare(&format!(
                    "INSERT INTO {s}.document_labels(document_id, label, score)
                     VALUES ($1, $2, $3)"
                ))?;
                for l in labels {
                    self.c.execute(&insert, &[&document, &l.label, &l.score])?;
                }
            }
        }
        Ok(())
    }

    fn stale_dependents(
        &mut self,
        document: &str,
        stage: &str,
        now: i64,
    ) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "UPDATE {s}.enrichment SET status = 'pending', attempts = 0, not_before = 0,
                     lease_owner = NULL, lease_expires = NULL, claimed_at = NULL,
                     claim_seq = NULL, done_at = NULL, updated_at = $3
                 WHERE document_id = $1 AND vector_set = 0
                   AND status IN ('done', 'failed', 'in_progress')
                   AND stage IN (SELECT stage FROM {s}.stage_dependencies WHERE depends_on = $2)"
            ),
            &[&document, &stage, &now],
        )?;
        Ok(())
    }

    fn put_dependencies(&mut self, edges: &[(String, String)]) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c
            .execute(&format!("DELETE FROM {s}.stage_dependencies"), &[])?;
        for (stage, on) in edges {
            self.c.execute(
                &format!(
                    "INSERT INTO {s}.stage_dependencies(stage, depends_on) VALUES ($1, $2)
                     ON CONFLICT DO NOTHING"
                ),
                &[stage, on],
            )?;
        }
        Ok(())
    }

    fn chunk_texts(&mut self, id: &str, version: &str) -> Result<Vec<ChunkText>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT rowid, ordinal, start_byte, text FROM {s}.chunks
                 WHERE document_id = $1 AND version = $2 AND replaced_by IS NULL
                 ORDER BY ordinal"
            ),
            &[&id, &version],
        )?;
        Ok(rows
            .iter()
            .map(|r| ChunkText {
                rowid: r.get(0),
                ordinal: r.get::<_, i32>(1) as i64,
                start_byte: r.get::<_, i64>(2).max(0) as usize,
                text: r.get(3),
            })
            .collect())
    }

    fn put_sparse(
        &mut self,
        document: &str,
        chunks: &[ChunkSparse],
    ) -> Result<(), postgres::Error> {
        let s = self.s;
        let dimension: usize = self
            .c
            .query_opt(
                &format!("SELECT value FROM {s}.meta WHERE key = 'sparse_dimension'"),
                &[],
            )?
            .and_then(|r| r.get::<_, String>(0).parse().ok())
            .unwrap_or(0);
        self.c.execute(
            &format!(
                "DELETE FROM {s}.sparse_vectors WHERE chunk IN
                     (SELECT rowid FROM {s}.chunks WHERE document_id = $1 AND replaced_by IS NULL)"
            ),
            &[&document],
        )?;
        let insert = self.c.prepare(&format!(
            "INSERT INTO {s}.sparse_vectors(chunk, embedding) VALUES ($1, $2)
             ON CONFLICT (chunk) DO UPDATE SET embedding = excluded.embedding"
        ))?;
        for c in chunks.iter().filter(|c| !c.terms.is_empty()) {
            let v = super::sparse_vector(&c.terms, &c.weights, dimension);
            self.c.execute(&insert, &[&c.rowid, &v])?;
        }
        Ok(())
    }

    fn set_done(&mut self, id: i64, now: i64) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "UPDATE {s}.enrichment SET status = 'done', lease_owner = NULL,
                     lease_expires = NULL, not_before = 0, done_at = $2, updated_at = $2
                 WHERE id = $1"
            ),
            &[&id, &now],
        )?;
        Ok(())
    }
}
