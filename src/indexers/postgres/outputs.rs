//! Document-level stages (LLM stages) in the Postgres index: the same as the SQLite index's
//! (`indexers/sqlite/outputs.rs`): queueing, the document's text, outputs replaced in one
//! transaction with the status, a `tsvector` when they go in the keyword index.

use postgres::GenericClient;

use super::fts::TsVector;
use super::queue::{PgStore, Sql};
use crate::indexers::admin::{self, OutputSql};
use crate::lifecycle::{DocumentText, Priority, StoreError, WorkKey};

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
                     SELECT d.id, $1, 0, 'pending', $2, nextval('{s}.enrichment_seq'), $3,
                            d.version, $4, $4
                     FROM {s}.documents d
                     LEFT JOIN {s}.enrichment e
                       ON e.document_id = d.id AND e.stage = $1 AND e.vector_set = 0
                     WHERE e.id IS NULL
                        OR ((e.input_version != d.version OR COALESCE(e.fingerprint, '') != $3)
                            AND e.status != 'in_progress')
                     ORDER BY d.id
                     ON CONFLICT (document_id, stage, vector_set) DO UPDATE SET
                         status = 'pending',
                         priority = GREATEST({s}.enrichment.priority, excluded.priority),
                         seq = excluded.seq, attempts = 0, not_before = 0, lease_owner = NULL,
                         lease_expires = NULL, fingerprint = excluded.fingerprint,
                         input_version = excluded.input_version, claimed_at = NULL,
                         claim_seq = NULL, done_at = NULL, enqueued_at = excluded.enqueued_at,
                         updated_at = excluded.updated_at"
                ),
                &[&stage, &(priority.level() as i32), &fingerprint, &now],
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
            Ok(admin::write_output(&mut q, owner, key, output, keyword, now)?)
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
        now: i64,
    ) -> Result<(), postgres::Error> {
        let s = self.s;
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
        self.c.execute(
            &format!(
                "UPDATE {s}.documents
                 SET metadata = jsonb_set(metadata, ARRAY[$2::text], to_jsonb($3::text))
                 WHERE id = $1"
            ),
            &[&key.document_id, &key.stage, &output],
        )?;
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
