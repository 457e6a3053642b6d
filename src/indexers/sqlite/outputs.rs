//! Document-level stages (LLM stages) in the SQLite index: queueing them for the documents
//! that need them, the document text they read, and their outputs (one per document and
//! stage, replaced, never appended; in `output_fts` when they go in the keyword index, and in
//! the document's metadata under the stage's name).

use rusqlite::{params, OptionalExtension};

use super::queue::{Sql, SqliteStore};
use super::schema::{advance, next_in};
use crate::indexers::admin::{self, OutputSql};
use crate::lifecycle::{
    now_ms, Annotations, ChunkSparse, ChunkText, DocumentText, Priority, SparseModelRecord,
    StoreError, WorkKey,
};

impl SqliteStore {
    pub(super) fn sync_stage_rows(
        &mut self,
        stage: &str,
        fingerprint: &str,
        priority: Priority,
    ) -> Result<u64, StoreError> {
        self.write(|tx| {
            let now = now_ms();
            let base = next_in(tx, "enrichment_seq")?;
            let n = tx.execute(
                "INSERT INTO enrichment(document_id, stage, vector_set, status, priority, seq,
                                        fingerprint, input_version, enqueued_at, updated_at)
                 SELECT d.id, ?1, 0, 'pending',
                        CASE WHEN e.input_version = d.version THEN ?6 ELSE ?2 END,
                        ?3 + ROW_NUMBER() OVER (ORDER BY d.id), ?4, d.version, ?5, ?5
                 FROM documents d
                 LEFT JOIN enrichment e
                   ON e.document_id = d.id AND e.stage = ?1 AND e.vector_set = 0
                 WHERE e.id IS NULL
                    OR ((e.input_version != d.version OR COALESCE(e.fingerprint, '') != ?4)
                        AND e.status != 'in_progress')
                 ON CONFLICT(document_id, stage, vector_set) DO UPDATE SET
                     status = 'pending',
                     priority = CASE WHEN status = 'done' THEN excluded.priority
                                     ELSE max(priority, excluded.priority) END,
                     seq = excluded.seq, attempts = 0, not_before = 0, lease_owner = NULL,
                     lease_expires = NULL, fingerprint = excluded.fingerprint,
                     input_version = excluded.input_version, claimed_at = NULL,
                     claim_seq = NULL, done_at = NULL, enqueued_at = excluded.enqueued_at,
                     updated_at = excluded.updated_at",
                params![
                    stage,
                    priority.level(),
                    base,
                    fingerprint,
                    now,
                    Priority::Backfill.level()
                ],
            )? as i64;
            advance(tx, "enrichment_seq", n)?;
            Ok(n as u64)
        })
    }

    pub(super) fn read_document_text(
        &mut self,
        id: &str,
    ) -> Result<Option<DocumentText>, StoreError> {
        admin::document_text(&mut Sql(&self.conn), id).map_err(|e| self.err(e))
    }

    pub(super) fn write_stage_output(
        &mut self,
        owner: &str,
        key: &WorkKey,
        output: &str,
        keyword: bool,
    ) -> Result<bool, StoreError> {
        self.write(|tx| {
            let mut q = Sql(tx);
            Ok(admin::write_output(
                &mut q,
                owner,
                key,
                output,
                keyword,
                now_ms(),
            )?)
        })
    }

    pub(super) fn read_current_chunks(
        &mut self,
        id: &str,
    ) -> Result<Option<Vec<ChunkText>>, StoreError> {
        admin::current_chunks(&mut Sql(&self.conn), id).map_err(|e| self.err(e))
    }

    pub(super) fn write_sparse_vectors(
        &mut self,
        owner: &str,
        key: &WorkKey,
        chunks: &[ChunkSparse],
    ) -> Result<bool, StoreError> {
        self.write(|tx| {
            Ok(admin::write_sparse(
                &mut Sql(tx),
                owner,
                key,
                chunks,
                now_ms(),
            )?)
        })
    }

    pub(super) fn write_stage_annotations(
        &mut self,
        owner: &str,
        key: &WorkKey,
        annotations: &Annotations,
        prompt_text: &str,
    ) -> Result<bool, StoreError> {
        self.write(|tx| {
            Ok(admin::write_annotations(
                &mut Sql(tx),
                owner,
                key,
                annotations,
                prompt_text,
                now_ms(),
            )?)
        })
    }

    pub(super) fn write_dependencies(
        &mut self,
        edges: &[(String, String)],
    ) -> Result<(), StoreError> {
        self.write(|tx| Ok(Sql(tx).put_dependencies(edges)?))
    }

    pub(super) fn read_sparse_model(&mut self) -> Result<Option<SparseModelRecord>, StoreError> {
        super::sparse::read_model(&self.conn).map_err(|e| self.err(e))
    }

    pub(super) fn put_sparse_model(&mut self, model: &SparseModelRecord) -> Result<(), StoreError> {
        self.write(|tx| Ok(super::sparse::record_model(tx, model)?))
    }
}

impl OutputSql for Sql<'_> {
    type Error = rusqlite::Error;

    fn document_version(
        &mut self,
        id: &str,
    ) -> rusqlite::Result<Option<(Option<String>, Option<String>, String)>> {
        self.0
            .query_row(
                "SELECT title, source, version FROM documents WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
    }

    fn chunk_spans(
        &mut self,
        id: &str,
        version: &str,
    ) -> rusqlite::Result<Vec<(usize, usize, String)>> {
        self.0
            .prepare_cached(
                "SELECT start_byte, end_byte, text FROM chunks
                 WHERE document_id = ?1 AND version = ?2 AND replaced_by IS NULL
                 ORDER BY ordinal",
            )?
            .query_map(params![id, version], |r| {
                Ok((
                    r.get::<_, i64>(0)? as usize,
                    r.get::<_, i64>(1)? as usize,
                    r.get(2)?,
                ))
            })?
            .collect()
    }

    fn held_for_output(&mut self, owner: &str, key: &WorkKey) -> rusqlite::Result<Option<i64>> {
        self.0
            .prepare_cached(
                "SELECT e.id FROM enrichment e JOIN documents d ON d.id = e.document_id
                 WHERE e.document_id = ?1 AND e.stage = ?2 AND e.vector_set = 0
                   AND e.status = 'in_progress' AND e.lease_owner = ?3
                   AND e.input_version = d.version",
            )?
            .query_row(params![key.document_id, key.stage, owner], |r| r.get(0))
            .optional()
    }

    fn put_output(
        &mut self,
        key: &WorkKey,
        output: &str,
        keyword: bool,
        metadata: bool,
        now: i64,
    ) -> rusqlite::Result<bool> {
        let tx = self.0;
        let before: Option<String> = tx
            .prepare_cached(
                "SELECT output FROM stage_outputs WHERE document_id = ?1 AND stage = ?2",
            )?
            .query_row(params![key.document_id, key.stage], |r| r.get(0))
            .optional()?;
        let rowid: i64 = tx
            .prepare_cached(
                "INSERT INTO stage_outputs(document_id, stage, output, keyword, at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(document_id, stage) DO UPDATE SET output = excluded.output,
                     keyword = excluded.keyword, at = excluded.at
                 RETURNING rowid",
            )?
            .query_row(
                params![key.document_id, key.stage, output, keyword, now],
                |r| r.get(0),
            )?;
        tx.prepare_cached("DELETE FROM output_fts WHERE rowid = ?1")?
            .execute([rowid])?;
        if keyword {
            tx.prepare_cached("INSERT INTO output_fts(rowid, output) VALUES (?1, ?2)")?
                .execute(params![rowid, output])?;
        }
        if metadata {
            tx.prepare_cached(
                "UPDATE documents
                 SET metadata = json_set(COALESCE(metadata, '{}'), '$.' || ?2, ?3)
                 WHERE id = ?1",
            )?
            .execute(params![key.document_id, key.stage, output])?;
        }
        Ok(before.as_deref() != Some(output))
    }

    fn outputs_of(&mut self, id: &str) -> rusqlite::Result<Vec<(String, String)>> {
        self.0
            .prepare_cached(
                "SELECT stage, output FROM stage_outputs WHERE document_id = ?1 ORDER BY stage",
            )?
            .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    }

    fn put_annotations(
        &mut self,
        document: &str,
        annotations: &Annotations,
    ) -> rusqlite::Result<()> {
        let tx = self.0;
        match annotations {
            Annotations::Entities(entities) => {
                tx.prepare_cached("DELETE FROM document_entities WHERE document_id = ?1")?
                    .execute([document])?;
                let mut insert = tx.prepare_cached(
                    "INSERT INTO document_entities(document_id, type, norm, text, mentions,
                                                   score, spans)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?;
                for e in entities {
                    let spans = serde_json::to_string(&e.spans).unwrap_or_else(|_| "[]".into());
                    insert.execute(params![
                        document,
                        e.kind,
                        e.norm,
                        e.text,
                        e.mentions,
                        f64::from(e.score),
                        spans
                    ])?;
                }
            }
            Annotations::Labels(labels) => {
                tx.prepare_cached("DELETE FROM document_labels WHERE document_id = ?1")?
                    .execute([document])?;
                let mut insert = tx.prepare_cached(
                    "INSERT INTO document_labels(document_id, label, score) VALUES (?1, ?2, ?3)",
                )?;
                for l in labels {
                    insert.execute(params![document, l.label, f64::from(l.score)])?;
                }
            }
        }
        Ok(())
    }

    fn stale_dependents(&mut self, document: &str, stage: &str, now: i64) -> rusqlite::Result<()> {
        self.0
            .prepare_cached(
                "UPDATE enrichment SET status = 'pending', attempts = 0, not_before = 0,
                     lease_owner = NULL, lease_expires = NULL, claimed_at = NULL,
                     claim_seq = NULL, done_at = NULL, updated_at = ?3
                 WHERE document_id = ?1 AND vector_set = 0
                   AND status IN ('done', 'failed', 'in_progress')
                   AND stage IN (SELECT stage FROM stage_dependencies WHERE depends_on = ?2)",
            )?
            .execute(params![document, stage, now])?;
        Ok(())
    }

    fn put_dependencies(&mut self, edges: &[(String, String)]) -> rusqlite::Result<()> {
        self.0.execute("DELETE FROM stage_dependencies", [])?;
        let mut insert = self.0.prepare_cached(
            "INSERT OR IGNORE INTO stage_dependencies(stage, depends_on) VALUES (?1, ?2)",
        )?;
        for (stage, on) in edges {
            insert.execute(params![stage, on])?;
        }
        Ok(())
    }

    fn chunk_texts(&mut self, id: &str, version: &str) -> rusqlite::Result<Vec<ChunkText>> {
        self.0
            .prepare_cached(
                "SELECT rowid, ordinal, start_byte, text FROM chunks
                 WHERE document_id = ?1 AND version = ?2 AND replaced_by IS NULL
                 ORDER BY ordinal",
            )?
            .query_map(params![id, version], |r| {
                Ok(ChunkText {
                    rowid: r.get(0)?,
                    ordinal: r.get(1)?,
                    start_byte: r.get::<_, i64>(2)?.max(0) as usize,
                    text: r.get(3)?,
                })
            })?
            .collect()
    }

    fn put_sparse(&mut self, document: &str, chunks: &[ChunkSparse]) -> rusqlite::Result<()> {
        let tx = self.0;
        tx.prepare_cached(
            "DELETE FROM sparse_postings WHERE chunk IN
                 (SELECT rowid FROM chunks WHERE document_id = ?1 AND replaced_by IS NULL)",
        )?
        .execute([document])?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO sparse_postings(term, chunk, weight) VALUES (?1, ?2, ?3)
             ON CONFLICT(term, chunk) DO UPDATE SET weight = excluded.weight",
        )?;
        for c in chunks {
            for (t, w) in c.terms.iter().zip(&c.weights) {
                insert.execute(params![*t as i64, c.rowid, *w as f64])?;
            }
        }
        Ok(())
    }

    fn set_done(&mut self, id: i64, now: i64) -> rusqlite::Result<()> {
        self.0
            .prepare_cached(
                "UPDATE enrichment SET status = 'done', lease_owner = NULL, lease_expires = NULL,
                     not_before = 0, done_at = ?2, updated_at = ?2
                 WHERE id = ?1",
            )?
            .execute(params![id, now])?;
        Ok(())
    }
}

/// A document gone from the index: its stage outputs go with it.
pub fn forget_outputs(conn: &rusqlite::Connection, document: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "DELETE FROM output_fts WHERE rowid IN
             (SELECT rowid FROM stage_outputs WHERE document_id = ?1)",
    )?
    .execute([document])?;
    conn.prepare_cached("DELETE FROM stage_outputs WHERE document_id = ?1")?
        .execute([document])?;
    conn.prepare_cached("DELETE FROM document_entities WHERE document_id = ?1")?
        .execute([document])?;
    conn.prepare_cached("DELETE FROM document_labels WHERE document_id = ?1")?
        .execute([document])?;
    Ok(())
}
