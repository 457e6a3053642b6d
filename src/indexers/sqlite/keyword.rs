//! Keyword search at scale: a Tantivy index beside the SQLite file (`<db>.keyword/`).
//!
//! FTS5 scores every chunk that holds one of a query's words before it sorts (`ORDER BY
//! bm25()`), so a query with a common word costs the whole posting list: 666 ms at 1M chunks.
//! Tantivy keeps, per block of postings, the best score any document in it can reach, and walks
//! the lists with block-max WAND: blocks that cannot enter the current top k are skipped.
//!
//! The SQLite file stays the truth. The Tantivy index is derived from its current chunks' text
//! and heading path, built once the index holds [`MIN_CHUNKS`] current chunks, and kept by
//! replaying `keyword_log` (every chunk whose full-text entry a write added or removed, logged
//! in the write's transaction once `meta.keyword_index` is set). Each Tantivy commit carries,
//! as its payload, the last log position it holds; the log up to there is then deleted. A
//! crash at any point leaves either the old commit and the log, or the new commit and a log
//! whose replayed rows are skipped by position. A reader answers from Tantivy only when no
//! logged change is newer than the commit it has loaded, and from FTS5 otherwise, so an answer
//! is never missing a committed change (only slower while a writer has yet to replay).
//!
//! Tokens as FTS5's `porter unicode61`: split on what is not alphanumeric, folded to ASCII and
//! lower case, stemmed (Snowball English, where FTS5 has the original Porter: a few words stem
//! differently). BM25 with Tantivy's k1 1.2, b 0.75 over heading path and text as one field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};
use rustc_hash::FxHashSet;
use tantivy::collector::{FilterCollector, TopDocs};
use tantivy::columnar::Column;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{
    AsciiFoldingFilter, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, TextAnalyzer,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

/// Current chunks from which an index gets its Tantivy index (below, FTS5 answers in a few
/// milliseconds); `RAGLINE_KEYWORD_MIN_CHUNKS` sets another threshold (0: always).
pub const MIN_CHUNKS: u64 = 20_000;

fn min_chunks() -> u64 {
    std::env::var("RAGLINE_KEYWORD_MIN_CHUNKS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(MIN_CHUNKS)
}

/// The tokenizer's name in the index.
const TOKENIZER: &str = "ragline";

/// The writer's memory for its in-flight documents, per indexing thread.
const WRITER_MEMORY_PER_THREAD: usize = 64 << 20;

/// Words longer than this are dropped (as FTS5 keeps them, but nobody searches for them).
const LONGEST_WORD: usize = 64;

/// Distinct query words taken (a pasted page is not a query).
const MAX_QUERY_WORDS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeywordError {
    #[error("keyword index of `{db}`: {source}")]
    Sqlite {
        db: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "keyword index `{dir}`: {message}; remove the folder (a writer rebuilds it from the \
         SQLite file)"
    )]
    Tantivy { dir: PathBuf, message: String },
}

/// Where the Tantivy index of the SQLite file `db` lives.
pub fn dir_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".keyword");
    PathBuf::from(name)
}

/// The chunk's key, and its heading path and text as one field: BM25 over the whole row, as
/// FTS5's `bm25()` scores it (a field of its own made every heading word outweigh the text:
/// SciFact keyword nDCG@10 0.649 against FTS5's 0.687).
#[derive(Clone, Copy)]
struct Fields {
    key: Field,
    body: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let key = b.add_u64_field("key", NumericOptions::default().set_indexed().set_fast());
    let words = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let body = b.add_text_field("body", words);
    (b.build(), Fields { key, body })
}

fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(LONGEST_WORD))
        .filter(AsciiFoldingFilter)
        .filter(LowerCaser)
        .filter(Stemmer::default())
        .build()
}

fn fields_of(index: &Index) -> Option<Fields> {
    let s = index.schema();
    Some(Fields {
        key: s.get_field("key").ok()?,
        body: s.get_field("body").ok()?,
    })
}

/// The last log position a commit holds (its payload).
fn committed_seq(index: &Index) -> tantivy::Result<Option<i64>> {
    Ok(index
        .load_metas()?
        .payload
        .and_then(|p| p.strip_prefix("seq:").and_then(|s| s.parse().ok())))
}

/// Log a change of chunk `rowid`'s full-text entry, where the index has a Tantivy index.
pub(super) fn log_change(tx: &Connection, rowid: i64) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO keyword_log(chunk)
         SELECT ?1 WHERE EXISTS (SELECT 1 FROM meta WHERE key = 'keyword_index')",
    )?
    .execute([rowid])?;
    Ok(())
}

/// Bring the Tantivy index up to date with the SQLite file: build it (once the file holds
/// [`MIN_CHUNKS`] current chunks, or `min_chunks` where given), or replay the log into it.
/// Returns what it did, for the run's notes.
pub fn maintain(
    db: &Path,
    conn: &mut Connection,
    min_chunks: Option<u64>,
) -> Result<Option<String>, KeywordError> {
    let sql = |source| KeywordError::Sqlite {
        db: db.to_path_buf(),
        source,
    };
    if !has_log(conn).map_err(sql)? {
        return Ok(None);
    }
    let dir = dir_of(db);
    let recorded: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'keyword_index'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql)?;
    if recorded.as_deref() == Some("ready") {
        match replay(db, conn, &dir) {
            Ok(changes) => {
                return Ok((changes > 0).then(|| {
                    format!("keyword index (Tantivy) updated with {changes} changed chunks")
                }))
            }
            Err(KeywordError::Tantivy { message, .. }) if message.contains("LockBusy") => {
                return Ok(None)
            }
            Err(e) => tracing::warn!("{e}; rebuilding it"),
        }
    }
    let current: u64 = conn
        .query_row(
            "SELECT COUNT(*) FROM chunks WHERE replaced_by IS NULL",
            [],
            |r| r.get(0),
        )
        .map_err(sql)?;
    if recorded.is_none() && current < min_chunks.unwrap_or_else(self::min_chunks) {
        return Ok(None);
    }
    let t = std::time::Instant::now();
    let built = build(db, conn, &dir)?;
    Ok(Some(format!(
        "keyword index (Tantivy) built: {built} chunks in {:.2}s",
        t.elapsed().as_secs_f64()
    )))
}

/// [`maintain`] for the end of a run: a failure is a note (and a warning), never the run's
/// failure; FTS5 answers meanwhile and the next writer tries again.
pub fn maintain_noted(db: &Path, conn: &mut Connection) -> Option<String> {
    maintain(db, conn, None).unwrap_or_else(|e| {
        tracing::warn!("{e}; FTS5 answers keyword searches until the next run");
        Some(format!("keyword index not updated: {e}"))
    })
}

fn has_log(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'keyword_log')",
        [],
        |r| r.get(0),
    )
}

fn tantivy_error(dir: &Path) -> impl Fn(tantivy::TantivyError) -> KeywordError + '_ {
    move |e| KeywordError::Tantivy {
        dir: dir.to_path_buf(),
        message: format!("{e:?}"),
    }
}

/// Build the index from every current chunk into a new folder, then put it in place.
fn build(db: &Path, conn: &mut Connection, dir: &Path) -> Result<u64, KeywordError> {
    let sql = |source| KeywordError::Sqlite {
        db: db.to_path_buf(),
        source,
    };
    let terr = tantivy_error(dir);
    // From here on every change is logged; the snapshot below holds those before it.
    conn.execute(
        "INSERT INTO meta(key, value) VALUES ('keyword_index', 'building')
         ON CONFLICT(key) DO UPDATE SET value = 'building'",
        [],
    )
    .map_err(sql)?;
    let tmp = {
        let mut name = dir.as_os_str().to_owned();
        name.push(format!(".tmp-{}", std::process::id()));
        PathBuf::from(name)
    };
    let io = |e: std::io::Error| KeywordError::Tantivy {
        dir: dir.to_path_buf(),
        message: e.to_string(),
    };
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io)?;
    let (schema, f) = schema();
    let index = Index::create_in_dir(&tmp, schema).map_err(&terr)?;
    index.tokenizers().register(TOKENIZER, analyzer());
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8);
    let mut writer: IndexWriter<TantivyDocument> = index
        .writer_with_num_threads(threads, threads * WRITER_MEMORY_PER_THREAD)
        .map_err(&terr)?;
    let tx = conn.transaction().map_err(sql)?;
    let seq: i64 = tx
        .query_row("SELECT COALESCE(MAX(seq), 0) FROM keyword_log", [], |r| {
            r.get(0)
        })
        .map_err(sql)?;
    let mut count = 0u64;
    {
        let mut stmt = tx
            .prepare("SELECT rowid, text, heading_path FROM chunks WHERE replaced_by IS NULL")
            .map_err(sql)?;
        let mut rows = stmt.query([]).map_err(sql)?;
        while let Some(r) = rows.next().map_err(sql)? {
            let rowid: i64 = r.get(0).map_err(sql)?;
            let text: String = r.get(1).map_err(sql)?;
            let heading: String = r.get(2).map_err(sql)?;
            writer
                .add_document(document(f, rowid, &text, &heading))
                .map_err(&terr)?;
            count += 1;
        }
    }
    drop(tx);
    commit(&mut writer, seq).map_err(&terr)?;
    writer.wait_merging_threads().map_err(&terr)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io)?;
    }
    std::fs::rename(&tmp, dir).map_err(io)?;
    if let Ok(parent) = std::fs::File::open(dir.parent().unwrap_or(Path::new("."))) {
        let _ = parent.sync_all();
    }
    settle(conn, seq).map_err(sql)?;
    Ok(count)
}

fn document(f: Fields, rowid: i64, text: &str, heading: &str) -> TantivyDocument {
    let mut d = TantivyDocument::default();
    d.add_u64(f.key, rowid as u64);
    d.add_text(f.body, format!("{heading}\n{text}"));
    d
}

fn commit(writer: &mut IndexWriter<TantivyDocument>, seq: i64) -> tantivy::Result<()> {
    let mut prepared = writer.prepare_commit()?;
    prepared.set_payload(&format!("seq:{seq}"));
    prepared.commit()?;
    Ok(())
}

/// The log up to `seq` is in the Tantivy index: forget it.
fn settle(conn: &Connection, seq: i64) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    tx.execute("DELETE FROM keyword_log WHERE seq <= ?1", [seq])?;
    tx.execute(
        "INSERT INTO meta(key, value) VALUES ('keyword_index', 'ready'), ('keyword_seq', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [seq.to_string()],
    )?;
    tx.commit()
}

/// Apply the log to the index; the number of chunks changed.
fn replay(db: &Path, conn: &mut Connection, dir: &Path) -> Result<usize, KeywordError> {
    let sql = |source| KeywordError::Sqlite {
        db: db.to_path_buf(),
        source,
    };
    let terr = tantivy_error(dir);
    let index = Index::open_in_dir(dir).map_err(&terr)?;
    index.tokenizers().register(TOKENIZER, analyzer());
    let f = fields_of(&index).ok_or_else(|| KeywordError::Tantivy {
        dir: dir.to_path_buf(),
        message: "not ragline's schema".into(),
    })?;
    let Some(applied) = committed_seq(&index).map_err(&terr)? else {
        return Err(KeywordError::Tantivy {
            dir: dir.to_path_buf(),
            message: "its last commit has no log position".into(),
        });
    };
    let tx = conn.transaction().map_err(sql)?;
    let mut seq = applied;
    let mut chunks = Vec::new();
    let mut seen = FxHashSet::default();
    {
        let mut stmt = tx
            .prepare("SELECT seq, chunk FROM keyword_log WHERE seq > ?1 ORDER BY seq")
            .map_err(sql)?;
        let mut rows = stmt.query([applied]).map_err(sql)?;
        while let Some(r) = rows.next().map_err(sql)? {
            seq = seq.max(r.get(0).map_err(sql)?);
            let chunk: i64 = r.get(1).map_err(sql)?;
            if seen.insert(chunk) {
                chunks.push(chunk);
            }
        }
    }
    if chunks.is_empty() {
        drop(tx);
        return Ok(0);
    }
    let mut writer: IndexWriter<TantivyDocument> = index
        .writer_with_num_threads(1, WRITER_MEMORY_PER_THREAD)
        .map_err(&terr)?;
    {
        let mut stmt = tx
            .prepare_cached(
                "SELECT text, heading_path FROM chunks WHERE rowid = ?1 AND replaced_by IS NULL",
            )
            .map_err(sql)?;
        for &chunk in &chunks {
            writer.delete_term(Term::from_field_u64(f.key, chunk as u64));
            let row: Option<(String, String)> = stmt
                .query_row([chunk], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .map_err(sql)?;
            if let Some((text, heading)) = row {
                writer
                    .add_document(document(f, chunk, &text, &heading))
                    .map_err(&terr)?;
            }
        }
    }
    drop(tx);
    commit(&mut writer, seq).map_err(&terr)?;
    writer.wait_merging_threads().map_err(&terr)?;
    settle(conn, seq).map_err(sql)?;
    Ok(chunks.len())
}

/// A reader's view of the Tantivy index.
pub struct KeywordView {
    index: Index,
    reader: IndexReader,
    fields: Fields,
    /// The log position the loaded commit holds (at least).
    seq: i64,
    /// Each segment's chunk keys.
    keys: Vec<Column<u64>>,
}

impl KeywordView {
    /// The view of `db`'s Tantivy index, or `None` where it has none (or one that cannot be
    /// opened: FTS5 answers, and a writer rebuilds it).
    pub fn open(db: &Path) -> Option<KeywordView> {
        let dir = dir_of(db);
        if !dir.is_dir() {
            return None;
        }
        let opened = (|| {
            let index = Index::open_in_dir(&dir)?;
            index.tokenizers().register(TOKENIZER, analyzer());
            let fields = fields_of(&index)
                .ok_or_else(|| tantivy::TantivyError::SchemaError("not ragline's".into()))?;
            let reader = index
                .reader_builder()
                .reload_policy(ReloadPolicy::Manual)
                .try_into()?;
            let mut view = KeywordView {
                index,
                reader,
                fields,
                seq: -1,
                keys: Vec::new(),
            };
            view.reload()?;
            Ok::<_, tantivy::TantivyError>(view)
        })();
        match opened {
            Ok(view) => Some(view),
            Err(e) => {
                tracing::warn!(
                    "keyword index `{}` cannot be read ({e}); FTS5 answers until a writer \
                     rebuilds it",
                    dir.display()
                );
                None
            }
        }
    }

    /// Load the last commit. Its log position is read first, so the searcher loaded after
    /// holds at least as much as the position says.
    pub fn reload(&mut self) -> tantivy::Result<()> {
        let seq = committed_seq(&self.index)?.unwrap_or(-1);
        self.reader.reload()?;
        let searcher = self.reader.searcher();
        self.keys = searcher
            .segment_readers()
            .iter()
            .map(|s| s.fast_fields().u64("key"))
            .collect::<tantivy::Result<_>>()?;
        self.seq = seq;
        Ok(())
    }

    /// The log position the loaded commit holds.
    pub fn seq(&self) -> i64 {
        self.seq
    }

    /// The `k` best chunks for the words of `query` (any of them), among `allowed` where
    /// given: (rowid, BM25 score), best first.
    pub fn search(
        &self,
        query: &str,
        k: usize,
        allowed: Option<&Arc<FxHashSet<u64>>>,
    ) -> tantivy::Result<Vec<(i64, f64)>> {
        let words = self.words(query);
        if words.is_empty() || k == 0 {
            return Ok(Vec::new());
        }
        let clauses: Vec<(Occur, Box<dyn Query>)> = words
            .iter()
            .map(|w| {
                let q: Box<dyn Query> = Box::new(TermQuery::new(
                    Term::from_field_text(self.fields.body, w),
                    IndexRecordOption::WithFreqs,
                ));
                (Occur::Should, q)
            })
            .collect();
        let query = BooleanQuery::new(clauses);
        let searcher = self.reader.searcher();
        let top = match allowed {
            None => searcher.search(&query, &TopDocs::with_limit(k).order_by_score())?,
            Some(allowed) => {
                let allowed = Arc::clone(allowed);
                searcher.search(
                    &query,
                    &FilterCollector::new(
                        "key".to_string(),
                        move |key: u64| allowed.contains(&key),
                        TopDocs::with_limit(k).order_by_score(),
                    ),
                )?
            }
        };
        Ok(top
            .into_iter()
            .filter_map(|(score, at)| {
                let key = self.keys.get(at.segment_ord as usize)?.first(at.doc_id)?;
                Some((key as i64, score as f64))
            })
            .collect())
    }

    /// The distinct indexed words of `query`, as the index tokenized its chunks.
    fn words(&self, query: &str) -> Vec<String> {
        let mut analyzer = analyzer();
        let mut stream = analyzer.token_stream(query);
        let mut out: Vec<String> = Vec::new();
        while stream.advance() {
            let t = &stream.token().text;
            if !out.iter().any(|w| w == t) {
                out.push(t.clone());
                if out.len() == MAX_QUERY_WORDS {
                    break;
                }
            }
        }
        out
    }
}

/// Where the index stands against a view that holds log position `seq`: the position of the
/// last commit a writer recorded, and whether a change newer than `seq` waits in the log.
pub(super) fn standing(conn: &Connection, seq: i64) -> rusqlite::Result<(i64, bool)> {
    conn.prepare_cached(
        "SELECT (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'keyword_seq'),
                EXISTS (SELECT 1 FROM keyword_log WHERE seq > ?1)",
    )?
    .query_row(params![seq], |r| {
        Ok((r.get::<_, Option<i64>>(0)?.unwrap_or(-1), r.get(1)?))
    })
}
