//! Tables, in the URI's schema (default `ragline`), and their migrations. The same layout as
//! the SQLite index, in PostgreSQL's terms:
//!
//! - `meta(key, value)`: schema version, the active model (name, folder, fingerprint,
//!   dimension), the vector type (`vector` or `halfvec`), the chunker's tokenizer.
//! - `documents`: one row per source document: its content hash and pipeline fingerprint
//!   (incremental runs), `version` (both hashed) and how many chunks that version has.
//! - `chunks`: one row per chunk, `rowid` an identity the search results carry, and `fts`,
//!   the `tsvector` of the heading path and text (made by the writer since version 3, see
//!   `fts.rs`) with a GIN index (keyword search), built after the first bulk load.
//!   `replaced_by`: an old version of a chunk kept for vector search until the new version
//!   has its vector (its `fts` is NULL, so keyword search has only the new text); the chunk
//!   id is unique among current rows only.
//! - `chunk_tokens`: the chunker's token ids of chunks still waiting for vectors (a deferred
//!   ingest), so `enrich` never tokenizes again; a row goes when every live set has the
//!   chunk's vector.
//! - `vector_sets`: the model, dimension and table of each set of vectors; one `active`
//!   (searched), one may be filling by `backfill`, older ones `retired` until dropped. Each
//!   set's vectors are a table `vectors_<id>(rowid, embedding vector(dim))`: a chunk has a
//!   vector in a set when the set's table has its rowid. Its HNSW index (cosine) is built
//!   after the first bulk load, then kept up to date by PostgreSQL.
//! - `enrichment`: per document, stage and vector set: status, priority, FIFO sequence,
//!   attempts, backoff deadline (`not_before`), lease (`lease_owner`, `lease_expires`), the
//!   stage fingerprint, the document version it is for, the work left, and when it was
//!   queued, claimed and done (milliseconds since the epoch, by the server's clock, so that
//!   the machines sharing a queue agree). `enrichment_errors` keeps every failed attempt;
//!   `stage_control` pauses stages; the sequences `enrichment_seq` and `claim_seq` give FIFO
//!   and claim order.
//! - `dead_documents` (version 2): a copy of each document a distributed run could not get
//!   into the index (the broker gave up on it after MaxDeliver deliveries; its `chunk` row is
//!   `dead`): the document as published, its source, the run's settings, for `ragline dlq
//!   requeue`. Removed once the document is in the index. `stage_control.circuit` (also
//!   version 2): a stage whose service keeps failing has its circuit open (the reason, since
//!   when), for `ragline status`. `stage_outputs` (version 2): what a document-level stage (an
//!   LLM stage) made of a document, one row per document and stage, with a `tsvector` (and GIN
//!   index) when it goes in the keyword index.

use postgres::GenericClient;

use super::target::VectorType;

/// The schema this ragline writes. Version 1: the tables above; 2: `dead_documents` and
/// `stage_control.circuit`; 3: `chunks.fts` written by ragline (no longer generated); 4:
/// `sparse_vectors`, the chunks' sparse (SPLADE) vectors as pgvector `sparsevec`; 5:
/// `document_entities`, `document_labels` and `stage_dependencies`, as the SQLite index's
/// version 9 (`indexers/sqlite/schema.rs`).
pub const SCHEMA_VERSION: i64 = 5;

/// The steps from version `n - 1` to `n`, at index `n - 1`: each runs in the transaction
/// that records the new version, so a migration is all or nothing. A new version appends
/// its step; an index made by an older ragline is brought up to date when it is opened.
const MIGRATIONS: &[&str] = &[
    // 1: the layout above.
    "CREATE TABLE {s}.documents (
         id text PRIMARY KEY,
         source text,
         title text,
         metadata jsonb NOT NULL DEFAULT '{}',
         content_hash text NOT NULL,
         fingerprint text NOT NULL,
         version text NOT NULL,
         chunk_count integer NOT NULL,
         updated_at timestamptz NOT NULL DEFAULT now());
     CREATE TABLE {s}.chunks (
         rowid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         id text NOT NULL,
         document_id text NOT NULL,
         ordinal integer NOT NULL,
         version text NOT NULL,
         text text NOT NULL,
         heading_path text NOT NULL,
         start_byte bigint NOT NULL,
         end_byte bigint NOT NULL,
         token_count integer NOT NULL,
         input_key bytea,
         page_start integer,
         page_end integer,
         replaced_by text,
         fts tsvector GENERATED ALWAYS AS (CASE WHEN replaced_by IS NULL
             THEN to_tsvector('english', heading_path || ' ' || text) END) STORED);
     CREATE UNIQUE INDEX chunks_current_id ON {s}.chunks (id) WHERE replaced_by IS NULL;
     CREATE INDEX chunks_document ON {s}.chunks (document_id, replaced_by, ordinal);
     CREATE INDEX chunks_fts ON {s}.chunks USING gin (fts);
     CREATE INDEX chunks_input_key ON {s}.chunks (input_key);
     CREATE TABLE {s}.chunk_tokens (
         rowid bigint PRIMARY KEY,
         token_ids bytea NOT NULL);
     CREATE TABLE {s}.vector_sets (
         id integer PRIMARY KEY,
         model text NOT NULL,
         model_dir text NOT NULL,
         fingerprint text NOT NULL,
         tokenizer text,
         dimension integer NOT NULL,
         vec_table text NOT NULL,
         state text NOT NULL,
         watermark text,
         backfill_done boolean NOT NULL DEFAULT false,
         created_at bigint NOT NULL,
         switched_at bigint);
     CREATE TABLE {s}.enrichment (
         id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         document_id text NOT NULL,
         stage text NOT NULL,
         vector_set integer NOT NULL DEFAULT 0,
         status text NOT NULL,
         priority integer NOT NULL,
         seq bigint NOT NULL,
         attempts integer NOT NULL DEFAULT 0,
         not_before bigint NOT NULL DEFAULT 0,
         lease_owner text,
         lease_expires bigint,
         fingerprint text,
         input_version text NOT NULL,
         todo_chunks bigint NOT NULL DEFAULT 0,
         todo_tokens bigint NOT NULL DEFAULT 0,
         enqueued_at bigint NOT NULL,
         claimed_at bigint,
         claim_seq bigint,
         done_at bigint,
         updated_at bigint NOT NULL,
         UNIQUE (document_id, stage, vector_set));
     CREATE INDEX enrichment_ready ON {s}.enrichment (stage, priority DESC, seq)
         WHERE status IN ('pending', 'failed', 'in_progress');
     CREATE INDEX enrichment_by_status ON {s}.enrichment (stage, vector_set, status);
     CREATE TABLE {s}.enrichment_errors (
         id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         document_id text NOT NULL,
         stage text NOT NULL,
         vector_set integer NOT NULL,
         attempt integer NOT NULL,
         at bigint NOT NULL,
         worker text NOT NULL,
         message text NOT NULL);
     CREATE INDEX enrichment_errors_by_document
         ON {s}.enrichment_errors (document_id, stage, vector_set);
     CREATE TABLE {s}.stage_control (
         stage text PRIMARY KEY,
         paused boolean NOT NULL,
         changed_at bigint NOT NULL);
     CREATE SEQUENCE {s}.enrichment_seq;
     CREATE SEQUENCE {s}.claim_seq;",
    // 2: copies of documents dead-lettered before they reached the index.
    "CREATE TABLE {s}.dead_documents (
         document_id text PRIMARY KEY,
         payload bytea,
         source text,
         config text,
         buried_at bigint NOT NULL);
     ALTER TABLE {s}.stage_control ADD COLUMN circuit text;
     ALTER TABLE {s}.stage_control ADD COLUMN circuit_since bigint;
     CREATE TABLE {s}.stage_outputs (
         document_id text NOT NULL,
         stage text NOT NULL,
         output text NOT NULL,
         keyword boolean NOT NULL,
         at bigint NOT NULL,
         fts tsvector GENERATED ALWAYS AS (CASE WHEN keyword
             THEN to_tsvector('english', output) END) STORED,
         PRIMARY KEY (document_id, stage));
     CREATE INDEX stage_outputs_fts ON {s}.stage_outputs USING gin (fts);",
    // 3: the `tsvector` of a chunk or a stage's output is made by the writer (`fts.rs`), no
    // longer by the server; the values already there stay. The GIN index of an empty index goes: it is built after
    // the first bulk load (`ensure_indexes`), as the HNSW index is.
    "ALTER TABLE {s}.chunks ALTER COLUMN fts DROP EXPRESSION;
     ALTER TABLE {s}.stage_outputs ALTER COLUMN fts DROP EXPRESSION;
     DO $$ BEGIN
         IF NOT EXISTS (SELECT 1 FROM {s}.chunks) THEN DROP INDEX {s}.chunks_fts; END IF;
     END $$;",
    // 4: sparse vectors, one per chunk that has one (the `sparse` stage writes them), going
    // with the chunk. Searched by an exact scan with `<#>` (pgvector's HNSW on `sparsevec`
    // takes at most 1,000 non-zero entries a vector).
    // A chunk whose text an upsert changes (under its rowid) loses its sparse vector, as the
    // SQLite index's chunk does: the document's `sparse` row is stale until enrich redoes it.
    "CREATE TABLE {s}.sparse_vectors (
         chunk bigint PRIMARY KEY REFERENCES {s}.chunks(rowid) ON DELETE CASCADE,
         embedding sparsevec NOT NULL);
     CREATE FUNCTION {s}.chunks_lose_sparse() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         DELETE FROM {s}.sparse_vectors WHERE chunk = NEW.rowid;
         RETURN NULL;
     END $$;
     CREATE TRIGGER chunks_lose_sparse AFTER UPDATE OF text ON {s}.chunks
         FOR EACH ROW WHEN (OLD.text IS DISTINCT FROM NEW.text)
         EXECUTE FUNCTION {s}.chunks_lose_sparse();",
    // 5: entities and labels of documents, looked up by entity and by label; the stage graph.
    "CREATE TABLE {s}.document_entities (
         document_id text NOT NULL,
         type text NOT NULL,
         norm text NOT NULL,
         text text NOT NULL,
         mentions integer NOT NULL,
         score real NOT NULL,
         spans text NOT NULL,
         PRIMARY KEY (document_id, type, norm));
     CREATE INDEX document_entities_by_entity ON {s}.document_entities(type, norm);
     CREATE INDEX document_entities_by_norm ON {s}.document_entities(norm);
     CREATE TABLE {s}.document_labels (
         document_id text NOT NULL,
         label text NOT NULL,
         score real NOT NULL,
         PRIMARY KEY (document_id, label));
     CREATE INDEX document_labels_by_label ON {s}.document_labels(label);
     CREATE TABLE {s}.stage_dependencies (
         stage text NOT NULL,
         depends_on text NOT NULL,
         PRIMARY KEY (stage, depends_on));",
];

/// Create the schema or bring it from version `from` (0: nothing there) to
/// [`SCHEMA_VERSION`], in the caller's transaction.
pub fn migrate(
    tx: &mut impl GenericClient,
    schema: &str,
    from: i64,
) -> Result<(), postgres::Error> {
    migrate_to(tx, schema, from, SCHEMA_VERSION)
}

/// [`migrate`] to version `to` (tests make older indexes with it).
fn migrate_to(
    tx: &mut impl GenericClient,
    schema: &str,
    from: i64,
    to: i64,
) -> Result<(), postgres::Error> {
    if from >= to {
        return Ok(());
    }
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.meta (
             key text PRIMARY KEY,
             value text NOT NULL);"
    ))?;
    for step in &MIGRATIONS[from.max(0) as usize..to as usize] {
        tx.batch_execute(&step.replace("{s}", schema))?;
    }
    tx.execute(
        &format!(
            "INSERT INTO {schema}.meta(key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        ),
        &[&to.to_string()],
    )?;
    Ok(())
}

/// A set's vector table, in the caller's transaction.
pub fn create_vectors(
    tx: &mut impl GenericClient,
    schema: &str,
    table: &str,
    ty: VectorType,
    dimension: usize,
) -> Result<(), postgres::Error> {
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.{table} (
             rowid bigint PRIMARY KEY,
             embedding {} NOT NULL)",
        ty.sql(dimension)
    ))
}

/// The name of a set table's HNSW index.
pub fn hnsw_index(table: &str) -> String {
    format!("{table}_hnsw")
}

/// The name of the chunks' GIN index (keyword search).
pub const FTS_INDEX: &str = "chunks_fts";

/// Whether the schema has the index `name`.
pub fn has_index(
    client: &mut impl GenericClient,
    schema: &str,
    name: &str,
) -> Result<bool, postgres::Error> {
    let row = client.query_opt(
        "SELECT 1 FROM pg_indexes WHERE schemaname = $1 AND indexname = $2",
        &[&schema, &name],
    )?;
    Ok(row.is_some())
}

/// Whether a set's table has its HNSW index.
pub fn has_hnsw(
    client: &mut impl GenericClient,
    schema: &str,
    table: &str,
) -> Result<bool, postgres::Error> {
    has_index(client, schema, &hnsw_index(table))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 3 on a version-2 index (skipped without `RAGLINE_TEST_POSTGRES`): the server's
    /// tsvectors stay, the column is no longer generated (ragline writes it), and the GIN
    /// index stays where there are chunks and goes where there are none (built after the
    /// first load).
    #[test]
    fn version_3_keeps_the_tsvectors_and_the_gin_index_of_a_loaded_index() {
        let Some(mut c) = crate::indexers::postgres::test_server() else {
            return;
        };
        let pid = std::process::id();
        for (schema, loaded) in [
            (format!("u_v3_loaded_{pid}"), true),
            (format!("u_v3_empty_{pid}"), false),
        ] {
            c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .unwrap();
            let mut tx = c.transaction().unwrap();
            migrate_to(&mut tx, &schema, 0, 2).unwrap();
            if loaded {
                tx.batch_execute(&format!(
                    "INSERT INTO {schema}.chunks (id, document_id, ordinal, version, text,
                         heading_path, start_byte, end_byte, token_count)
                     VALUES ('a#0', 'a', 0, 'v', 'Effects run after rendering', 'Hooks', 0, 27, 5)"
                ))
                .unwrap();
            }
            migrate(&mut tx, &schema, 2).unwrap();
            tx.commit().unwrap();
            let generated: String = c
                .query_one(
                    "SELECT attgenerated::text FROM pg_attribute
                     WHERE attrelid = $1::text::regclass AND attname = 'fts'",
                    &[&format!("{schema}.chunks")],
                )
                .unwrap()
                .get(0);
            assert_eq!(generated, "", "fts is a plain column now");
            assert_eq!(has_index(&mut c, &schema, FTS_INDEX).unwrap(), loaded);
            if loaded {
                let kept: String = c
                    .query_one(&format!("SELECT fts::text FROM {schema}.chunks"), &[])
                    .unwrap()
                    .get(0);
                assert_eq!(kept, "'effect':2 'hook':1 'render':5 'run':3");
            }
            let version: String = c
                .query_one(
                    &format!("SELECT value FROM {schema}.meta WHERE key = 'schema_version'"),
                    &[],
                )
                .unwrap()
                .get(0);
            assert_eq!(version, SCHEMA_VERSION.to_string());
            c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .unwrap();
        }
    }
}
