//! The approximate nearest-neighbour (ANN) index of a vector set: an HNSW graph (usearch)
//! in a file beside the SQLite index, derived from it and never a second source of truth.
//!
//! - **Change log.** While a set has an ANN (table `ann`, state `building` or `ready`), every
//!   insert or delete of one of its vectors appends `(seq, vector_set, chunk)` to `ann_log` in
//!   the same transaction ([`log_change`]). `seq` is AUTOINCREMENT: never reused, so "after
//!   seq S" always means "committed after the file was cut".
//! - **The file records the last change it holds.** `ann.seq` is the log position the file
//!   (`ann.file`, named `set-<id>-<seq>.usearch` in `<index>.ann/`) reflects. Saving writes a
//!   new file, then in one transaction points `ann` at it and drops the log up to its seq; the
//!   old file is deleted after. A `kill -9` at any step leaves either the old file with the
//!   log it lacks or the new one: never a file that claims changes it lacks.
//! - **Replay, state-based.** A reader takes, in one read snapshot, the file's seq and the
//!   chunks changed after it (the *dirty* set): the ANN is searched with the dirty chunks
//!   masked out, and the dirty chunks that still have a vector are scored exactly and merged
//!   in. A writer ([`maintain`]) applies the dirty chunks to the graph (remove, then add the
//!   current vector if there is one) and saves. Either way search equals "the vectors SQLite
//!   holds now", whatever was killed when.
//! - **Quantized graph, exact answers.** The graph holds f16, int8 or binary vectors; the
//!   best candidates are re-scored against f32 vectors before they are returned: those the
//!   graph was built from, in a mapped file beside it (`vectors.rs`, the same snapshot), and
//!   for a chunk changed since, the one SQLite holds now. A candidate SQLite no longer holds
//!   is never returned.

use std::collections::HashSet;

use rustc_hash::FxHashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use super::sets::{self, SetState, VectorSet};
use super::vector_from_bytes;
use crate::distance::Cosine;
pub(super) use crate::indexers::ann::{AnnDtype, AnnMode, AnnSettings, AUTO_MIN_CHUNKS};
use crate::lifecycle::now_ms;

pub mod tune;
mod vectors;
use tune::Tuned;
use vectors::{Vectors, VectorsError, VectorsWriter};

/// How a stored vector kind is held by usearch.
impl AnnDtype {
    pub(super) fn scalar(self) -> ScalarKind {
        match self {
            AnnDtype::F16 => ScalarKind::F16,
            AnnDtype::Int8 => ScalarKind::I8,
            AnnDtype::Binary => ScalarKind::B1,
        }
    }

    /// f16 and int8 graphs hold unit vectors (each normalised as it is added, and the query
    /// too), so the inner product orders them as cosine does at a third of the arithmetic
    /// (no norms per distance): the build's and the walk's main cost. Scores come from the
    /// f32 vectors either way.
    pub(super) fn metric(self) -> MetricKind {
        match self {
            AnnDtype::Binary => MetricKind::Hamming,
            _ => MetricKind::IP,
        }
    }
}

/// Graph degree (HNSW M).
const CONNECTIVITY: usize = 16;
/// Candidate list while building (efConstruction).
const EXPANSION_ADD: usize = 128;
/// Candidate list while searching (HNSW ef_search; usearch searches with max(this, count))
/// where the set's recall was not measured (`tune.rs` measures it after each build):
/// recall@10 0.98 on 1M MiniLM-like vectors, see BENCHMARKS.md.
pub const EXPANSION_SEARCH: usize = 256;
/// The range of ef a search or `--ef` may ask for.
pub const EF_RANGE: std::ops::RangeInclusive<usize> = 16..=4096;

/// `RAGLINE_ANN_EF`, the operator's override of every search's ef (16 to 4096).
fn ef_from_env() -> Option<usize> {
    std::env::var("RAGLINE_ANN_EF")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map(|n| n.clamp(*EF_RANGE.start(), *EF_RANGE.end()))
}
/// Results asked of the graph, at most, whatever k a caller passes.
const MAX_CANDIDATES: usize = 1 << 20;

/// Candidates re-scored exactly, as a multiple of k (and at least k x 10): the graph's nearest
/// by its own quantized distances, which order f16 vectors almost exactly, int8 ones closely
/// and binary ones coarsely. Each is a read from the mapped vectors file (a vec0 point lookup,
/// ~35 us, for a chunk changed since the file was cut).
fn rescored(dtype: AnnDtype, k: usize) -> usize {
    match dtype {
        AnnDtype::F16 => 2 * k.max(10),
        AnnDtype::Int8 => 4 * k.max(10),
        AnnDtype::Binary => 40 * k.max(10),
    }
}
/// A writer rebuilds instead of patching when this fraction of the graph changed (deletes
/// leave tombstones that slow the graph down).
const REBUILD_FRACTION: f64 = 0.25;
/// A reader scores the chunks changed since the file was saved one by one from SQLite (a
/// vec0 point lookup, ~40 us) where the exact scan costs ~0.3 us a vector: past this share of
/// the set (or [`DIRTY_FLOOR`]), scanning is cheaper. It happens when a run is killed before
/// it saves the ANN, until the next writer applies the log.
const DIRTY_FALLBACK_FRACTION: f64 = 1.0 / 128.0;
const DIRTY_FLOOR: usize = 256;
/// A `.tmp` file younger than this may be a save in progress; older ones are deleted.
const TMP_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);
/// Vectors read from SQLite per batch while building.
const BUILD_BATCH: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum AnnError {
    #[error("{0}")]
    Sql(#[from] rusqlite::Error),
    #[error("ANN index `{path}`: {message}")]
    File { path: PathBuf, message: String },
    #[error("ANN index: {0}")]
    Graph(String),
}

fn file_error(path: &Path, message: String) -> AnnError {
    AnnError::File {
        path: path.to_path_buf(),
        message,
    }
}

/// usearch takes paths as UTF-8 strings.
fn utf8(path: &Path) -> Result<&str, AnnError> {
    path.to_str().ok_or_else(|| {
        file_error(
            path,
            "the path is not UTF-8; move the index to a UTF-8 path".into(),
        )
    })
}

fn graph(e: impl std::fmt::Display) -> AnnError {
    AnnError::Graph(e.to_string())
}

fn vectors_error(path: &Path, e: VectorsError) -> AnnError {
    file_error(path, e.to_string())
}

/// The vectors file beside a graph file (`set-S-Q-SUM.vectors` beside `set-S-Q-SUM.usearch`).
fn vectors_path(graph: &Path) -> PathBuf {
    graph.with_extension("vectors")
}

/// The folder of an index's ANN files: `<index>.ann`.
pub fn dir_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(".ann");
    PathBuf::from(name)
}

/// Record in the log that `chunk`'s vector in `vec_table` changed, when that set has an ANN
/// (being built or ready). Runs in the writer's transaction.
pub(super) fn log_change(tx: &Connection, vec_table: &str, chunk: i64) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO ann_log(vector_set, chunk)
         SELECT s.id, ?2 FROM vector_sets s JOIN ann a ON a.vector_set = s.id
         WHERE s.vec_table = ?1",
    )?
    .execute(params![vec_table, chunk])?;
    Ok(())
}

/// A set's ANN as the `ann` table records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnnRow {
    pub vector_set: i64,
    /// `building` (no usable file yet) or `ready`.
    pub state: String,
    pub dtype: AnnDtype,
    pub file: Option<String>,
    /// The last `ann_log` change the file holds.
    pub seq: i64,
    /// Vectors in the file.
    pub size: i64,
}

pub fn row_of(conn: &Connection, set: i64) -> rusqlite::Result<Option<AnnRow>> {
    conn.prepare_cached(
        "SELECT vector_set, state, dtype, file, seq, size FROM ann WHERE vector_set = ?1",
    )?
    .query_row([set], |r| {
        Ok(AnnRow {
            vector_set: r.get(0)?,
            state: r.get(1)?,
            dtype: r.get::<_, String>(2)?.parse().unwrap_or_default(),
            file: r.get(3)?,
            seq: r.get(4)?,
            size: r.get(5)?,
        })
    })
    .optional()
}

/// A set's ANN as `ragline status` shows it.
pub fn status(
    conn: &Connection,
    set: i64,
) -> rusqlite::Result<Option<crate::lifecycle::report::AnnStatus>> {
    let Some(row) = row_of(conn, set)? else {
        return Ok(None);
    };
    let pending: i64 = conn.query_row(
        "SELECT COUNT(DISTINCT chunk) FROM ann_log WHERE vector_set = ?1 AND seq > ?2",
        params![set, row.seq],
        |r| r.get(0),
    )?;
    let tuned = tune::tuned(conn, set)?;
    Ok(Some(crate::lifecycle::report::AnnStatus {
        state: row.state,
        dtype: row.dtype.as_str().to_string(),
        vectors: row.size.max(0) as u64,
        changes_pending: pending.max(0) as u64,
        ef: ef_from_env()
            .or(tuned.as_ref().map(|t| t.ef))
            .unwrap_or(EXPANSION_SEARCH) as u64,
        recall: tuned.as_ref().map(|t| t.recall),
        recall_target: recorded(conn)?.recall,
    }))
}

/// The operator's settings as the index records them (`meta`: `ann`, `ann_dtype`), so every
/// writer (ingest, enrich, backfill) keeps the ANN the same way.
pub fn recorded(conn: &Connection) -> rusqlite::Result<AnnSettings> {
    let get = |k: &str| -> rusqlite::Result<Option<String>> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
            .optional()
    };
    Ok(AnnSettings {
        mode: get("ann")?.and_then(|v| v.parse().ok()).unwrap_or_default(),
        dtype: get("ann_dtype")?
            .and_then(|v| v.parse().ok())
            .unwrap_or_default(),
        recall: get("ann_recall")?
            .and_then(|v| crate::indexers::ann::parse_recall(&v).ok())
            .unwrap_or(crate::indexers::ann::DEFAULT_RECALL),
    })
}

pub fn record(conn: &Connection, settings: AnnSettings) -> rusqlite::Result<()> {
    let recall = settings.recall.to_string();
    for (k, v) in [
        ("ann", settings.mode.as_str()),
        ("ann_dtype", settings.dtype.as_str()),
        ("ann_recall", recall.as_str()),
    ] {
        conn.execute(
            "INSERT INTO meta(key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [k, v],
        )?;
    }
    Ok(())
}

/// What [`maintain`] did to one set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Maintained {
    Untouched,
    Built { vectors: usize, seconds_x100: u64 },
    Updated { changes: usize },
    Dropped,
}

/// The indexes whose ANN a thread of this process is maintaining now: the workers of one
/// run share an index, and one graph is built once, not once per worker.
static BUSY: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// This process's claim on maintaining one index's ANN, released when dropped.
struct Busy(PathBuf);

impl Busy {
    fn busy() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
        BUSY.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The claim, or `None` while another thread holds it.
    fn try_take(db: &Path) -> Option<Busy> {
        let mut busy = Self::busy();
        if busy.iter().any(|p| p == db) {
            return None;
        }
        busy.push(db.to_path_buf());
        Some(Busy(db.to_path_buf()))
    }

    /// The claim, once another thread lets go of it.
    fn take(db: &Path) -> Busy {
        loop {
            if let Some(b) = Self::try_take(db) {
                return b;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        Self::busy().retain(|p| p != &self.0);
    }
}

/// Bring the ANN of every live vector set in line with the recorded settings and the
/// vectors SQLite holds: build what is missing (or was killed while building), apply the
/// log, drop what `none` or a retired set leaves. Notes for the run's summary.
pub fn maintain(db: &Path, conn: &mut Connection) -> Result<Vec<String>, AnnError> {
    let _busy = Busy::take(db);
    let settings = recorded(conn)?;
    let mut notes = Vec::new();
    for set in sets::all(conn)? {
        let what = maintain_set(db, conn, &set, settings)?;
        match what {
            Maintained::Built {
                vectors,
                seconds_x100,
            } => notes.push(format!(
                "ANN ({}, HNSW) of vector set {} built: {vectors} vectors in {:.2}s{}",
                settings.dtype.as_str(),
                set.id,
                seconds_x100 as f64 / 100.0,
                tuned_note(conn, set.id)?
            )),
            Maintained::Updated { changes } => notes.push(format!(
                "ANN of vector set {} updated with {changes} changed chunks",
                set.id
            )),
            Maintained::Dropped => notes.push(format!("ANN of vector set {} dropped", set.id)),
            Maintained::Untouched => {}
        }
    }
    // A retired set's record goes with the set (`sets::drop_retired`); its file goes here.
    remove_stale_files(db, conn)?;
    Ok(notes)
}

/// `; search ef 96 (recall@10 0.953 measured, target 0.95)`, or nothing when unmeasured.
fn tuned_note(conn: &Connection, set: i64) -> rusqlite::Result<String> {
    Ok(match tune::tuned(conn, set)? {
        Some(t) => format!(
            "; search ef {} (recall@10 {:.3} measured on {} stored vectors, target {}{})",
            t.ef,
            t.recall,
            t.queries,
            t.target,
            if t.reached {
                ""
            } else {
                ": not reached at the largest ef"
            }
        ),
        None => String::new(),
    })
}

/// [`maintain_set`] with the recorded settings, unless another thread of this process is
/// maintaining this index's ANN (`None`: it is being done; ask again later).
pub fn maintain_set_exclusive(
    db: &Path,
    conn: &mut Connection,
    set: &VectorSet,
) -> Result<Option<Maintained>, AnnError> {
    let Some(_busy) = Busy::try_take(db) else {
        return Ok(None);
    };
    let settings = recorded(conn)?;
    maintain_set(db, conn, set, settings).map(Some)
}

/// Between runs' ends, a long run (`enrich --follow`) applies the log while it is idle, once
/// it holds half the changes past which readers give up on the graph and scan: the sets
/// whose ANN was brought up to date. Skipped while another thread of this process is at it.
pub fn apply_due(db: &Path, conn: &mut Connection) -> Result<Vec<i64>, AnnError> {
    let Some(_busy) = Busy::try_take(db) else {
        return Ok(Vec::new());
    };
    let mut done = Vec::new();
    let live = sets::all(conn)?
        .into_iter()
        .filter(|s| matches!(s.state, SetState::Active | SetState::Backfill));
    for set in live {
        let Some(row) = row_of(conn, set.id)?.filter(|r| r.state == "ready") else {
            continue;
        };
        let pending: i64 = conn.query_row(
            "SELECT COUNT(*) FROM ann_log WHERE vector_set = ?1 AND seq > ?2",
            params![set.id, row.seq],
            |r| r.get(0),
        )?;
        if pending as usize >= dirty_limit(row.size) / 2 {
            update(db, conn, &set, &row)?;
            done.push(set.id);
        }
    }
    Ok(done)
}

/// Changed chunks past which a reader scans instead of replaying them over the graph.
fn dirty_limit(size: i64) -> usize {
    DIRTY_FLOOR.max((size.max(0) as f64 * DIRTY_FALLBACK_FRACTION) as usize)
}

/// [`maintain`] for one set.
pub fn maintain_set(
    db: &Path,
    conn: &mut Connection,
    set: &VectorSet,
    settings: AnnSettings,
) -> Result<Maintained, AnnError> {
    let row = row_of(conn, set.id)?;
    let live = matches!(set.state, SetState::Active | SetState::Backfill);
    if !live || settings.mode == AnnMode::None {
        if row.is_some() {
            drop_ann(db, conn, set.id)?;
            return Ok(Maintained::Dropped);
        }
        return Ok(Maintained::Untouched);
    }
    match row {
        Some(row) if row.state == "ready" && row.dtype == settings.dtype => {
            update(db, conn, set, &row)
        }
        Some(_) => build(db, conn, set, settings.dtype),
        None => {
            let wanted =
                settings.mode == AnnMode::Hnsw || vectors_in(conn, set)? >= AUTO_MIN_CHUNKS;
            if wanted {
                build(db, conn, set, settings.dtype)
            } else {
                Ok(Maintained::Untouched)
            }
        }
    }
}

/// Vectors a set holds (from the chunks' bits: counting a vec0 table scans it).
fn vectors_in(conn: &Connection, set: &VectorSet) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT COUNT(*) FROM chunks WHERE embedded & ?1 != 0",
        [set.bit()],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as u64)
}

fn new_graph(dimension: usize, dtype: AnnDtype) -> Result<Index, AnnError> {
    let options = IndexOptions {
        dimensions: dimension,
        metric: dtype.metric(),
        quantization: dtype.scalar(),
        connectivity: CONNECTIVITY,
        expansion_add: EXPANSION_ADD,
        expansion_search: EXPANSION_SEARCH,
        multi: false,
    };
    Index::new(&options).map_err(graph)
}

/// Add one vector, in the graph's own terms (binary graphs take sign bits).
fn add(index: &Index, dtype: AnnDtype, key: u64, vector: &[f32]) -> Result<(), AnnError> {
    match dtype {
        AnnDtype::Binary => index
            .add::<usearch::b1x8>(key, usearch::b1x8::from_u8s(&sign_bits(vector)))
            .map_err(graph),
        _ => index.add::<f32>(key, &unit(vector)).map_err(graph),
    }
}

/// `v` scaled to length 1 (a zero vector stays zero): what f16 and int8 graphs hold and are
/// searched with.
pub(super) fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 && n.is_finite() {
        v.iter().map(|x| x / n).collect()
    } else {
        v.to_vec()
    }
}

/// A vector's sign bits, most significant bit first (the layout usearch's b1x8 reads).
fn sign_bits(vector: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; vector.len().div_ceil(8)];
    for (i, x) in vector.iter().enumerate() {
        if *x > 0.0 {
            out[i / 8] |= 0x80 >> (i % 8);
        }
    }
    out
}

/// Build a set's ANN from the vectors SQLite holds, save it and record it. Changes committed
/// while it builds stay in the log (the build reads one snapshot and records its position).
fn build(
    db: &Path,
    conn: &mut Connection,
    set: &VectorSet,
    dtype: AnnDtype,
) -> Result<Maintained, AnnError> {
    let started = Instant::now();
    // 1. From now on every writer logs the set's changes. A rebuild of a ready ANN (another
    // dtype, too many changes) leaves it searchable until the new file replaces it.
    let rebuild = row_of(conn, set.id)?.is_some_and(|r| r.state == "ready");
    if !rebuild {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO ann(vector_set, state, dtype, file, seq, size, updated_at)
             VALUES (?1, 'building', ?2, NULL, 0, 0, ?3)
             ON CONFLICT(vector_set) DO UPDATE SET state = 'building', dtype = excluded.dtype,
                 updated_at = excluded.updated_at",
            params![set.id, dtype.as_str(), now_ms()],
        )?;
        tx.commit()?;
    }
    #[cfg(feature = "failpoints")]
    fail::fail_point!("ann::build-started");
    tracing::info!(
        "building the ANN ({}) of vector set {}",
        dtype.as_str(),
        set.id
    );
    // 2. One snapshot: its log position and every vector, into the graph and the vectors file.
    let index = new_graph(set.dimension, dtype)?;
    let filled = fill(db, conn, set, &index, dtype)?;
    // 3. The search's ef for the recall asked for, measured with the held-out vectors.
    let tuned = measure_and_add(conn, &index, dtype, &filled, set.dimension)?;
    let vectors = filled.vectors;
    // 4. The files, then the record that points at them.
    let snapshot = Snapshot {
        index: &index,
        dtype,
        seq: filled.seq,
        vectors: &filled.written,
        tuned,
    };
    save(db, conn, set.id, &snapshot, !rebuild)?;
    let built = Maintained::Built {
        vectors,
        seconds_x100: (started.elapsed().as_secs_f64() * 100.0) as u64,
    };
    // 5. What was written meanwhile.
    if let Some(row) = row_of(conn, set.id)? {
        update_loaded(db, conn, set, &row, Some(index))?;
    }
    Ok(built)
}

/// One snapshot's vectors, in a new graph and a new vectors file.
struct Filled {
    /// The snapshot's log position.
    seq: i64,
    /// Vectors in the snapshot.
    vectors: usize,
    /// The vectors file, written and fsynced.
    written: PathBuf,
    /// The vectors held out of the graph to measure it with (in the file; to be added).
    held: Vec<(u64, Vec<f32>)>,
}

/// Every vector of one snapshot added to `index` (but a held-out sample, see `tune.rs`), in
/// parallel batches, and written to a new vectors file.
fn fill(
    db: &Path,
    conn: &mut Connection,
    set: &VectorSet,
    index: &usearch::Index,
    dtype: AnnDtype,
) -> Result<Filled, AnnError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let seq: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM ann_log", [], |r| {
        r.get(0)
    })?;
    let written = tmp_path(db, set.id, seq, "vectors")?;
    let mut out =
        VectorsWriter::create(&written, set.dimension).map_err(|e| vectors_error(&written, e))?;
    let n = vectors_in(&tx, set)? as usize;
    index
        .reserve_capacity_and_threads(n.max(16), rayon::current_num_threads().max(1))
        .map_err(graph)?;
    let mut stmt = tx.prepare(&format!("SELECT rowid, embedding FROM {}", set.vec_table))?;
    let mut rows = stmt.query([])?;
    let mut batch: Vec<(u64, Vec<f32>)> = Vec::with_capacity(BUILD_BATCH);
    let mut held = Vec::new();
    let mut added = 0usize;
    loop {
        let row = rows.next()?;
        let done = row.is_none();
        if let Some(r) = row {
            let rowid: i64 = r.get(0)?;
            let bytes: Vec<u8> = r.get(1)?;
            if bytes.len() == set.dimension * 4 {
                batch.push((rowid as u64, vector_from_bytes(&bytes)));
            }
        }
        if batch.len() >= BUILD_BATCH || (done && !batch.is_empty()) {
            if index.size() + batch.len() > index.capacity() {
                index
                    .reserve((index.size() + batch.len()).next_power_of_two())
                    .map_err(graph)?;
            }
            use rayon::prelude::*;
            for (key, v) in &batch {
                out.push(*key, v).map_err(|e| vectors_error(&written, e))?;
            }
            added += batch.len();
            // The held-out sample is added after the graph is measured with it.
            held.extend(batch.extract_if(.., |(key, _)| tune::held_out(*key, n)));
            batch
                .par_iter()
                .try_for_each(|(key, v)| add(index, dtype, *key, v))?;
            batch.clear();
            #[cfg(feature = "failpoints")]
            fail::fail_point!("ann::build-batch");
        }
        if done {
            break;
        }
    }
    drop(rows);
    drop(stmt);
    tx.commit()?;
    out.finish().map_err(|e| vectors_error(&written, e))?;
    Ok(Filled {
        seq,
        vectors: added,
        written,
        held,
    })
}

/// Measure the graph with the vectors held out of it as queries, then add them.
fn measure_and_add(
    conn: &Connection,
    index: &Index,
    dtype: AnnDtype,
    filled: &Filled,
    dimension: usize,
) -> Result<Option<Tuned>, AnnError> {
    let tuned = measure(conn, index, dtype, &filled.written, &filled.held, dimension)?;
    index
        .reserve(index.size() + filled.held.len() + 16)
        .map_err(graph)?;
    for (key, v) in &filled.held {
        add(index, dtype, *key, v)?;
    }
    Ok(tuned)
}

/// A new file's name while it is written: this process's, so that two writers never share
/// one.
fn tmp_path(db: &Path, set: i64, seq: i64, kind: &str) -> Result<PathBuf, AnnError> {
    let dir = dir_of(db);
    std::fs::create_dir_all(&dir).map_err(|e| file_error(&dir, e.to_string()))?;
    Ok(dir.join(format!("set-{set}-{seq}-{}.{kind}.tmp", std::process::id())))
}

/// Apply the log past the file to the graph and save it (rebuilding when much changed).
fn update(
    db: &Path,
    conn: &mut Connection,
    set: &VectorSet,
    row: &AnnRow,
) -> Result<Maintained, AnnError> {
    let pending: i64 = conn.query_row(
        "SELECT COUNT(DISTINCT chunk) FROM ann_log WHERE vector_set = ?1 AND seq > ?2",
        params![set.id, row.seq],
        |r| r.get(0),
    )?;
    if pending == 0 {
        // The file may be gone or altered, or from before graphs had a vectors file: then
        // build it again.
        return match check_file(db, row, set.dimension) {
            Ok((path, _)) if vectors_path(&path).is_file() => Ok(Maintained::Untouched),
            Ok(_) => build(db, conn, set, row.dtype),
            Err(e) => {
                tracing::warn!("{e}; rebuilding it");
                build(db, conn, set, row.dtype)
            }
        };
    }
    if pending as f64 > REBUILD_FRACTION * row.size.max(1) as f64 {
        return build(db, conn, set, row.dtype);
    }
    update_loaded(db, conn, set, row, None)
}

/// [`update`] on a graph already in memory (just built) or loaded from the file.
fn update_loaded(
    db: &Path,
    conn: &mut Connection,
    set: &VectorSet,
    row: &AnnRow,
    loaded: Option<Index>,
) -> Result<Maintained, AnnError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let (seq, dirty) = dirty_since(&tx, set.id, row.seq)?;
    if dirty.is_empty() {
        return Ok(Maintained::Untouched);
    }
    let Some((index, old)) = graph_to_update(db, row, set, loaded) else {
        drop(tx);
        return build(db, conn, set, row.dtype);
    };
    let written = tmp_path(db, set.id, seq, "vectors")?;
    let mut out =
        VectorsWriter::create(&written, set.dimension).map_err(|e| vectors_error(&written, e))?;
    let changed: HashSet<u64> = dirty.iter().copied().collect();
    copy_unchanged(&old, set.dimension, &changed, &mut out)?;
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT embedding FROM {} WHERE rowid = ?1",
        set.vec_table
    ))?;
    index
        .reserve(index.size() + dirty.len() + 16)
        .map_err(graph)?;
    // When the set has grown enough to measure its ef again, a sample of the new vectors is
    // held out of the graph to measure it with.
    let target = recorded(&tx)?.recall;
    let grown = index.size() + dirty.len();
    let remeasure = tune::due(tune::tuned(&tx, set.id)?.as_ref(), grown as u64, target);
    let mut held = Vec::new();
    for &chunk in &dirty {
        if index.contains(chunk) {
            index.remove(chunk).map_err(graph)?;
        }
        let bytes: Option<Vec<u8>> = stmt.query_row([chunk as i64], |r| r.get(0)).optional()?;
        if let Some(b) = bytes.filter(|b| b.len() == set.dimension * 4) {
            let v = vector_from_bytes(&b);
            out.push(chunk, &v)
                .map_err(|e| vectors_error(&written, e))?;
            if remeasure && tune::held_out(chunk, dirty.len()) {
                held.push((chunk, v));
            } else {
                add(&index, row.dtype, chunk, &v)?;
            }
        }
    }
    drop(stmt);
    tx.commit()?;
    out.finish().map_err(|e| vectors_error(&written, e))?;
    #[cfg(feature = "failpoints")]
    fail::fail_point!("ann::update-applied");
    let filled = Filled {
        seq,
        vectors: 0,
        written,
        held,
    };
    let tuned = measure_and_add(conn, &index, row.dtype, &filled, set.dimension)?;
    let snapshot = Snapshot {
        index: &index,
        dtype: row.dtype,
        seq,
        vectors: &filled.written,
        tuned,
    };
    save(db, conn, set.id, &snapshot, false)?;
    Ok(Maintained::Updated {
        changes: dirty.len(),
    })
}

/// The graph an update starts from (`loaded`, or the file's) and the vectors file saved with
/// it, both checked; `None` where either is unusable (the caller rebuilds).
fn graph_to_update(
    db: &Path,
    row: &AnnRow,
    set: &VectorSet,
    loaded: Option<Index>,
) -> Option<(Index, PathBuf)> {
    let old = check_file(db, row, set.dimension)
        .and_then(|(path, _)| Ok(open_vectors(&path, set.dimension)?.map(|_| vectors_path(&path))));
    let old = match old {
        Ok(Some(old)) => old,
        Ok(None) | Err(_) => {
            tracing::warn!(
                "the ANN of vector set {} has no usable vectors file; rebuilding it",
                set.id
            );
            return None;
        }
    };
    match loaded {
        Some(index) => Some((index, old)),
        None => match load(db, row, set.dimension) {
            Ok(index) => Some((index, old)),
            Err(e) => {
                tracing::warn!("{e}; rebuilding it");
                None
            }
        },
    }
}

/// The rows of the vectors file `old` whose keys are not in `changed`, into `out`.
fn copy_unchanged(
    old: &Path,
    dimension: usize,
    changed: &HashSet<u64>,
    out: &mut VectorsWriter,
) -> Result<(), AnnError> {
    let mut copied = Ok(());
    vectors::scan(old, dimension, 8192, |keys, rows| {
        for (key, v) in keys.iter().zip(rows.chunks(dimension)) {
            if copied.is_ok() && !changed.contains(key) {
                copied = out.push(*key, v);
            }
        }
    })
    .and(copied)
    .map_err(|e| vectors_error(old, e))
}

/// The chunks of `set` changed after log position `after`, and the last position.
pub(super) fn dirty_since(
    conn: &Connection,
    set: i64,
    after: i64,
) -> rusqlite::Result<(i64, Vec<u64>)> {
    let mut seq = after;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut stmt = conn.prepare_cached(
        "SELECT seq, chunk FROM ann_log WHERE vector_set = ?1 AND seq > ?2 ORDER BY seq",
    )?;
    let mut rows = stmt.query(params![set, after])?;
    while let Some(r) = rows.next()? {
        seq = seq.max(r.get(0)?);
        let chunk = r.get::<_, i64>(1)? as u64;
        if seen.insert(chunk) {
            out.push(chunk);
        }
    }
    Ok((seq, out))
}

/// The search's ef measured for the recorded recall target on `index`, with `held` (vectors
/// of the file at `vectors`, left out of the graph) as queries; None with too few of them.
fn measure(
    conn: &Connection,
    index: &Index,
    dtype: AnnDtype,
    vectors: &Path,
    held: &[(u64, Vec<f32>)],
    dimension: usize,
) -> Result<Option<Tuned>, AnnError> {
    if held.len() < tune::MIN_SAMPLE {
        return Ok(None);
    }
    let target = recorded(conn)?.recall;
    let started = Instant::now();
    let file = Vectors::open(vectors, dimension).map_err(|e| vectors_error(vectors, e))?;
    let tuned = tune::measure(index, vectors, &file, held, dtype, target)?;
    if let Some(t) = &tuned {
        tracing::info!(
            "ANN search ef {} reaches recall@10 {:.3} (target {target}) on {} vectors; measured in {:.1}s",
            t.ef,
            t.recall,
            t.size,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(tuned)
}

/// What [`save`] writes: a graph, its vectors file (written and fsynced, not yet named), the
/// log position they hold and, when measured again, the search's ef.
struct Snapshot<'a> {
    index: &'a Index,
    dtype: AnnDtype,
    seq: i64,
    vectors: &'a Path,
    tuned: Option<Tuned>,
}

/// Write the graph to a new file, fsync it, name it and its vectors file after their
/// checksum, point the set's record at them (and record a new measurement of its ef) and drop
/// the log they hold, in one transaction; then delete the files nothing points at.
/// `building`: the record is expected in state `building` (a build); otherwise `ready` at an
/// older seq.
fn save(
    db: &Path,
    conn: &mut Connection,
    set: i64,
    snapshot: &Snapshot<'_>,
    building: bool,
) -> Result<(), AnnError> {
    let Snapshot {
        index,
        dtype,
        seq,
        vectors: vectors_tmp,
        ..
    } = *snapshot;
    let dir = dir_of(db);
    let io = |p: &Path, e: std::io::Error| file_error(p, e.to_string());
    let tmp = tmp_path(db, set, seq, "usearch")?;
    let tmp_str = utf8(&tmp)?;
    index.save(tmp_str).map_err(graph)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(&tmp, e))?;
    // The files' checksum goes into their names, which the record keeps: a file altered
    // after this point is found out when it is loaded.
    let name = format!(
        "set-{set}-{seq}-{}.usearch",
        checksum(&[&tmp, vectors_tmp])?
    );
    let path = dir.join(&name);
    let vectors = vectors_path(&path);
    std::fs::rename(vectors_tmp, &vectors).map_err(|e| io(&vectors, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    #[cfg(feature = "failpoints")]
    fail::fail_point!("ann::saved-unrecorded");
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current = row_of(&tx, set)?;
    let ours = match &current {
        Some(r) if building => r.state == "building",
        Some(r) => r.state == "ready" && r.seq <= seq,
        None => false,
    };
    if !ours {
        // Dropped, rebuilt or moved on by another writer meanwhile: theirs stands.
        drop(tx);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&vectors);
        return Ok(());
    }
    tx.execute(
        "UPDATE ann SET state = 'ready', dtype = ?2, file = ?3, seq = ?4, size = ?5,
             updated_at = ?6 WHERE vector_set = ?1",
        params![
            set,
            dtype.as_str(),
            name,
            seq,
            index.size() as i64,
            now_ms()
        ],
    )?;
    tx.execute(
        "DELETE FROM ann_log WHERE vector_set = ?1 AND seq <= ?2",
        params![set, seq],
    )?;
    match &snapshot.tuned {
        Some(t) => tune::record(&tx, set, t)?,
        None if building => tune::forget(&tx, set)?,
        None => {}
    }
    tx.commit()?;
    remove_stale_files(db, conn)?;
    Ok(())
}

/// Delete the files in the ANN folder no record points at (a killed save's, replaced ones).
/// A reader that has one mapped keeps its pages until it lets go.
fn remove_stale_files(db: &Path, conn: &Connection) -> Result<(), AnnError> {
    let keep: HashSet<String> = conn
        .prepare("SELECT file FROM ann WHERE file IS NOT NULL")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let Ok(entries) = std::fs::read_dir(dir_of(db)) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let graph = name
            .strip_suffix(".vectors")
            .map(|stem| format!("{stem}.usearch"));
        if !name.starts_with("set-") || keep.contains(graph.as_ref().unwrap_or(&name)) {
            continue;
        }
        // A `.tmp` file may be another writer's save in progress: only an old one is a
        // killed save's leftover.
        let in_progress = name.ends_with(".tmp")
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().map_or(true, |age| age < TMP_GRACE));
        if !in_progress {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Drop a set's ANN: its record, its log and its files.
pub fn drop_ann(db: &Path, conn: &mut Connection, set: i64) -> Result<(), AnnError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute("DELETE FROM ann WHERE vector_set = ?1", [set])?;
    tx.execute("DELETE FROM ann_log WHERE vector_set = ?1", [set])?;
    tune::forget(&tx, set)?;
    tx.commit()?;
    remove_stale_files(db, conn)
}

fn file_path(db: &Path, row: &AnnRow) -> Option<PathBuf> {
    let name = row.file.as_deref()?;
    // Names come from the file: only ours are followed (no `../x`).
    let ok = name.starts_with("set-")
        && name.ends_with(".usearch")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    ok.then(|| dir_of(db).join(name))
}

/// Open a set's ANN file: mapped read-only (`view`) for readers, copied in for writers. Its
/// header must agree with the record (dimensions, dtype, size) before the graph is touched.
fn load(db: &Path, row: &AnnRow, dimension: usize) -> Result<Index, AnnError> {
    let (path, len) = check_file(db, row, dimension)?;
    let bad = |message: String| file_error(&path, message);
    let index = new_graph(dimension, row.dtype)?;
    index.load(utf8(&path)?).map_err(|e| bad(e.to_string()))?;
    if index.serialized_length() as u64 != len {
        return Err(bad("its length does not match its header".into()));
    }
    Ok(index)
}

/// A graph file mapped for searching, every page mapped up front: a walk touches a few
/// thousand nodes spread over the whole file, and a page faulted in on first touch costs
/// about what the walk's distances do (usearch's own `view` maps lazily: 2-6x slower per
/// query until the whole file has been touched). The pages are the page cache's, shared by
/// every reader of the file.
struct MappedGraph {
    /// Declared first: dropped before the mapping it points into.
    index: Index,
    _map: memmap2::Mmap,
    path: PathBuf,
}

fn view(db: &Path, row: &AnnRow, dimension: usize) -> Result<MappedGraph, AnnError> {
    let (path, len) = check_file(db, row, dimension)?;
    let bad = |message: String| file_error(&path, message);
    let file = std::fs::File::open(&path).map_err(|e| bad(e.to_string()))?;
    // SAFETY: a saved graph file is never written again (a new snapshot is a new file), and
    // its bytes were checked against the checksum in its name just now.
    let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) }
        .map_err(|e| bad(e.to_string()))?;
    if map.len() as u64 != len {
        return Err(bad("it changed while it was opened".into()));
    }
    let index = new_graph(dimension, row.dtype)?;
    // SAFETY: `index` points into `map`, which `MappedGraph` keeps alive (and read-only)
    // for as long as `index`, and drops after it.
    unsafe { index.view_from_buffer(&map) }.map_err(|e| bad(e.to_string()))?;
    if index.serialized_length() as u64 != len {
        return Err(bad("its length does not match its header".into()));
    }
    Ok(MappedGraph {
        index,
        _map: map,
        path,
    })
}

/// The vectors file beside the graph file at `graph`, mapped; None for a graph saved before
/// graphs had one.
fn open_vectors(graph: &Path, dimension: usize) -> Result<Option<Vectors>, AnnError> {
    let path = vectors_path(graph);
    if !path.is_file() {
        return Ok(None);
    }
    Vectors::open(&path, dimension)
        .map(Some)
        .map_err(|e| vectors_error(&path, e))
}

/// Hex digits of the checksum an ANN file's name carries (128 bits of BLAKE3).
const CHECKSUM_HEX: usize = 32;

/// The checksum of the files at `paths` (a graph, then its vectors file), as the graph's name
/// carries it.
fn checksum(paths: &[&Path]) -> Result<String, AnnError> {
    let mut hasher = blake3::Hasher::new();
    for path in paths {
        hasher
            .update_mmap_rayon(path)
            .map_err(|e| file_error(path, e.to_string()))?;
    }
    Ok(hasher.finalize().to_hex()[..CHECKSUM_HEX].to_string())
}

/// The checksum in a file's name (`set-S-Q-CHECKSUM.usearch`); None for a name from before
/// names carried one.
fn named_checksum(name: &str) -> Option<&str> {
    let stem = name.strip_suffix(".usearch")?;
    let (_, sum) = stem.rsplit_once('-')?;
    (sum.len() == CHECKSUM_HEX && sum.bytes().all(|b| b.is_ascii_hexdigit())).then_some(sum)
}

/// Whether the file at `path` (of `len` bytes) has the checksum its name gives. A file this
/// process has checked is not read again while its length and time stay the same.
fn verify_checksum(path: &Path, len: u64) -> Result<(), AnnError> {
    use std::sync::Mutex;
    type Stamp = (
        PathBuf,
        u64,
        Option<std::time::SystemTime>,
        Option<(u64, Option<std::time::SystemTime>)>,
    );
    static CHECKED: Mutex<Vec<Stamp>> = Mutex::new(Vec::new());
    let Some(want) = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(named_checksum)
    else {
        return Ok(());
    };
    let vectors = vectors_path(path);
    let vectors = vectors.is_file().then_some(vectors);
    let stamp_of = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let stamp = (
        path.to_path_buf(),
        len,
        stamp_of(path).and_then(|s| s.1),
        vectors.as_deref().and_then(stamp_of),
    );
    if CHECKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&stamp)
    {
        return Ok(());
    }
    let got = match &vectors {
        Some(v) => checksum(&[path, v])?,
        None => checksum(&[path])?,
    };
    if got != want {
        return Err(file_error(
            path,
            format!(
                "its checksum is {got}, not the {want} it was saved with: the file was altered \
                 or damaged since (with its `.vectors` file)"
            ),
        ));
    }
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if checked.len() >= 64 {
        checked.remove(0);
    }
    checked.push(stamp);
    Ok(())
}

/// A set's ANN file, if its header agrees with the record and its bytes with the checksum its
/// name carries: its path and length.
fn check_file(db: &Path, row: &AnnRow, dimension: usize) -> Result<(PathBuf, u64), AnnError> {
    let path = file_path(db, row).ok_or_else(|| {
        AnnError::Graph(format!(
            "the index records no usable ANN file for vector set {}",
            row.vector_set
        ))
    })?;
    let bad = |message: String| file_error(&path, message);
    let p = utf8(&path)?;
    let len = std::fs::metadata(&path)
        .map_err(|e| bad(e.to_string()))?
        .len();
    // The bytes first: a file altered anywhere, its header included, is told apart from one
    // that is whole but does not fit the record.
    verify_checksum(&path, len)?;
    let meta = Index::metadata(p).map_err(|e| bad(e.to_string()))?;
    if meta.dimensions != dimension as u64
        || meta.quantization != row.dtype.scalar()
        || meta.count_present as i64 != row.size
    {
        return Err(bad(format!(
            "its header ({} dimensions, {} vectors) does not match the index ({dimension} \
             dimensions, {} vectors); delete the file and it is rebuilt",
            meta.dimensions, meta.count_present, row.size
        )));
    }
    Ok((path, len))
}

/// A reader's view of a set's ANN, reloaded when a writer saves a new file.
pub struct AnnView {
    file: String,
    set: i64,
    dtype: AnnDtype,
    size: i64,
    graph: MappedGraph,
    /// The f32 vectors the graph was built from (None for a graph saved before graphs had
    /// them: candidates are then read from SQLite).
    vectors: Option<Vectors>,
    /// The ef measured for the recall target when this file was saved (or the default).
    tuned_ef: usize,
    /// The rows of the last filter's chunks in the vectors file, in file order, with a
    /// fingerprint of the chunks: a service answering many queries under one filter finds
    /// them once.
    filter_rows: Mutex<Option<FilterRows>>,
}

/// A filter's chunks as rows of the vectors file: (fingerprint, count, (slot, key) rows).
type FilterRows = (u64, usize, std::sync::Arc<Vec<(u32, u64)>>);

/// An order-free fingerprint of a set of keys (a sum of mixed keys).
fn fingerprint(keys: &FxHashSet<u64>) -> u64 {
    keys.iter().fold(0u64, |acc, &k| {
        let mut x = k.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        acc.wrapping_add(x ^ (x >> 31))
    })
}

impl AnnView {
    /// `allowed`'s rows in `vectors` (this view's file), in file order.
    fn rows_of(
        &self,
        vectors: &Vectors,
        allowed: &FxHashSet<u64>,
    ) -> std::sync::Arc<Vec<(u32, u64)>> {
        let print = fingerprint(allowed);
        let mut cache = self.filter_rows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((p, n, rows)) = cache.as_ref() {
            if *p == print && *n == allowed.len() {
                return rows.clone();
            }
        }
        let rows = std::sync::Arc::new(vectors.slots_of(allowed.iter().copied()));
        *cache = Some((print, allowed.len(), rows.clone()));
        rows
    }
}

/// Which chunks a search may return: `None` lets every chunk through.
pub type Allowed<'a> = Option<&'a FxHashSet<u64>>;

/// One search of a set's ANN.
#[derive(Clone, Copy, Debug)]
pub struct AnnQuery<'a> {
    pub vector: &'a [f32],
    pub k: usize,
    pub allowed: Allowed<'a>,
    /// The graph's candidate list for this search (`search --ef`), over the measured one.
    pub ef: Option<usize>,
}

/// Chunks and their exact cosine distances, nearest first, with how the search went.
pub type AnnHits = (Vec<(i64, f64)>, AnnSearch);

/// How a search over the ANN went (for tests and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnnSearch {
    pub candidates: usize,
    pub dirty: usize,
    /// The filter was selective enough to score what it lets through.
    pub scanned: bool,
    /// The ef the graph was searched with (0 when it was not walked).
    pub ef: usize,
    /// The chunks a filter let through (0 without a filter).
    pub allowed: usize,
    /// The candidates' f32 vectors came from the vectors file beside the graph (not SQLite).
    pub mapped_vectors: bool,
    /// Vectors in the graph.
    pub graph_size: usize,
}

impl AnnSearch {
    /// How the search went, as `search --explain` shows it.
    pub fn plan(&self) -> crate::indexers::ann::VectorPlan {
        let filtered = self.allowed > 0 || self.scanned;
        let walk = walk_cost(self.allowed, self.graph_size, self.ef.max(1));
        let why = match (filtered, self.scanned) {
            (false, _) => "no filter: the graph's nearest, re-scored exactly".to_string(),
            (true, true) => format!(
                "the filter lets {} of {} chunks through: scoring them all costs less than a                  filtered walk (about {walk:.0} visits)",
                self.allowed, self.graph_size
            ),
            (true, false) => format!(
                "the filter lets {} of {} chunks through: a walk that skips the rest (about                  {walk:.0} visits at ef {}) costs less than scoring them all",
                self.allowed, self.graph_size, self.ef
            ),
        };
        crate::indexers::ann::VectorPlan {
            index: "ann",
            path: match (filtered, self.scanned) {
                (false, _) => "graph",
                (true, true) => "filter-scan",
                (true, false) => "graph+filter",
            },
            why,
            ef: (!self.scanned).then_some(self.ef),
            candidates: self.candidates,
            filtered_to: filtered.then_some(self.allowed),
            changed_since_saved: self.dirty,
            rescored_from: if self.mapped_vectors {
                "vectors-file"
            } else {
                "index"
            },
        }
    }
}

/// Search `set` through its ANN: the `k` nearest (rowid, cosine distance), exact distances,
/// or `None` when the set has no usable ANN (the caller scans). `conn` must be in a read
/// transaction, so the record, the log and the vectors are one snapshot.
pub fn search(
    db: &Path,
    conn: &Connection,
    cache: &mut Option<AnnView>,
    set: &VectorSet,
    ask: &AnnQuery<'_>,
) -> Result<Option<AnnHits>, AnnError> {
    let AnnQuery {
        vector: query,
        k,
        allowed,
        ef,
    } = *ask;
    let Some(row) = row_of(conn, set.id)? else {
        *cache = None;
        return Ok(None);
    };
    if row.state != "ready" || query.len() != set.dimension {
        return Ok(None);
    }
    let Some(view) = loaded(db, conn, cache, &row, set)? else {
        return Ok(None);
    };
    let (_, dirty) = dirty_since(conn, set.id, row.seq)?;
    if dirty.len() > dirty_limit(row.size) {
        tracing::debug!(
            "{} chunks changed since the ANN was saved: scanning exactly",
            dirty.len()
        );
        return Ok(None);
    }
    let dirty: FxHashSet<u64> = dirty.into_iter().collect();
    let ef = ef
        .map(|n| n.clamp(*EF_RANGE.start(), *EF_RANGE.end()))
        .or_else(ef_from_env)
        .unwrap_or(view.tuned_ef);
    let mut stats = AnnSearch {
        dirty: dirty.len(),
        allowed: allowed.map_or(0, |a| a.len()),
        mapped_vectors: view.vectors.is_some(),
        graph_size: view.graph.index.size(),
        ..AnnSearch::default()
    };
    // Never more candidates than the graph holds (a huge k would size usearch's buffers).
    let rescore = rescored(view.dtype, k.min(MAX_CANDIDATES)).min(view.graph.index.size().max(1));
    // Candidates from the graph: every chunk whose vector changed since the file was cut is
    // masked out (it is scored from SQLite below).
    let mut candidates: Vec<u64> = match allowed {
        Some(allowed) if scan_is_cheaper(allowed.len(), view.graph.index.size(), ef) => {
            stats.scanned = true;
            scan_allowed(view, query, allowed, &dirty, rescore)?
        }
        _ => {
            stats.ef = ef;
            view.graph.index.change_expansion_search(ef);
            walk(view, query, rescore, allowed, &dirty)?
        }
    };
    stats.candidates = candidates.len();
    candidates.extend(
        dirty
            .iter()
            .copied()
            .filter(|c| allowed.is_none_or(|a| a.contains(c))),
    );
    Ok(Some((
        exact_scores(conn, set, view, &dirty, query, candidates, k)?,
        stats,
    )))
}

/// Whether scoring the `allowed` chunks one by one costs less than a walk of a graph of
/// `size` that skips what the filter leaves out: a filtered walk visits about ef x M nodes
/// per match it needs, so its cost grows as the filter narrows (x size / allowed), while the
/// scan's is the allowed count (a mapped f32 read and a SIMD distance each, about as dear as
/// a graph visit).
fn scan_is_cheaper(allowed: usize, size: usize, ef: usize) -> bool {
    (allowed as f64) < walk_cost(allowed, size, ef)
}

/// About how many nodes a walk at `ef` visits to find its candidates among `allowed` of
/// `size` (0 allowed: no filter).
fn walk_cost(allowed: usize, size: usize, ef: usize) -> f64 {
    let selectivity = match allowed {
        0 => 1.0,
        n => (n as f64 / size.max(1) as f64).min(1.0),
    };
    (ef * CONNECTIVITY) as f64 / selectivity
}

/// The set's ANN as `cache` holds it, loaded again when the file on record changed; None
/// (and a warning) when it cannot be loaded.
fn loaded<'a>(
    db: &Path,
    conn: &Connection,
    cache: &'a mut Option<AnnView>,
    row: &AnnRow,
    set: &VectorSet,
) -> rusqlite::Result<Option<&'a AnnView>> {
    let fresh = cache.as_ref().is_some_and(|v| {
        Some(&v.file) == row.file.as_ref() && v.set == set.id && v.size == row.size
    });
    if !fresh {
        *cache = None;
        let opened = view(db, row, set.dimension).and_then(|graph| {
            let vectors = open_vectors(&graph.path, set.dimension)?;
            Ok((graph, vectors))
        });
        let tuned_ef = tune::tuned(conn, set.id)?.map_or(EXPANSION_SEARCH, |t| t.ef);
        match opened {
            Ok((graph, vectors)) => {
                *cache = Some(AnnView {
                    file: row.file.clone().unwrap_or_default(),
                    set: set.id,
                    dtype: row.dtype,
                    size: row.size,
                    graph,
                    vectors,
                    tuned_ef,
                    filter_rows: Mutex::new(None),
                })
            }
            Err(e) => {
                tracing::warn!("{e}; searching exactly until a writer rebuilds it");
                return Ok(None);
            }
        }
    }
    Ok(cache.as_ref())
}

/// Candidates from a walk of the graph, the chunks changed since the file was cut (`dirty`)
/// and those `allowed` leaves out masked.
fn walk(
    view: &AnnView,
    query: &[f32],
    rescore: usize,
    allowed: Allowed<'_>,
    dirty: &FxHashSet<u64>,
) -> Result<Vec<u64>, AnnError> {
    let query_bits;
    let keep = |key: u64| !dirty.contains(&key) && allowed.is_none_or(|a| a.contains(&key));
    let matches = match (view.dtype, dirty.is_empty() && allowed.is_none()) {
        (AnnDtype::Binary, plain) => {
            query_bits = sign_bits(query);
            let q = usearch::b1x8::from_u8s(&query_bits);
            if plain {
                view.graph.index.search::<usearch::b1x8>(q, rescore)
            } else {
                view.graph
                    .index
                    .filtered_search::<usearch::b1x8, _>(q, rescore, keep)
            }
        }
        (_, true) => view.graph.index.search::<f32>(&unit(query), rescore),
        (_, false) => view
            .graph
            .index
            .filtered_search::<f32, _>(&unit(query), rescore, keep),
    }
    .map_err(graph)?;
    Ok(matches.keys)
}

/// The `k` nearest of `candidates` by their exact scores, from the f32 vectors SQLite holds
/// now: the graph's own snapshot (`view.vectors`) for a chunk unchanged since it was cut, a
/// point lookup for one changed since (`dirty`); a candidate SQLite no longer holds is gone.
fn exact_scores(
    conn: &Connection,
    set: &VectorSet,
    view: &AnnView,
    dirty: &FxHashSet<u64>,
    query: &[f32],
    candidates: Vec<u64>,
    k: usize,
) -> Result<Vec<(i64, f64)>, AnnError> {
    let cosine = Cosine::new(query);
    let mut scored = Vec::with_capacity(candidates.len());
    let mut lookups = Vec::new();
    match &view.vectors {
        Some(vectors) => {
            for &c in candidates.iter().filter(|c| !dirty.contains(c)) {
                vectors.prefetch(c);
            }
            for c in candidates {
                match vectors.get(c).filter(|_| !dirty.contains(&c)) {
                    Some(v) => scored.push((c as i64, cosine.exact(v))),
                    None => lookups.push(c),
                }
            }
        }
        None => lookups = candidates,
    }
    if !lookups.is_empty() {
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT embedding FROM {} WHERE rowid = ?1",
            set.vec_table
        ))?;
        for c in lookups {
            let bytes: Option<Vec<u8>> = stmt.query_row([c as i64], |r| r.get(0)).optional()?;
            if let Some(b) = bytes.filter(|b| b.len() == set.dimension * 4) {
                scored.push((c as i64, cosine.exact(&vector_from_bytes(&b))));
            }
        }
    }
    scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    scored.truncate(k);
    Ok(scored)
}

/// The `keep` chunks among `allowed` nearest to `query` by the graph's own (quantized)
/// vectors: a selective filter's candidates, found without walking the graph.
fn scan_allowed(
    view: &AnnView,
    query: &[f32],
    allowed: &FxHashSet<u64>,
    dirty: &FxHashSet<u64>,
    keep: usize,
) -> Result<Vec<u64>, AnnError> {
    let dim = view.graph.index.dimensions();
    let cosine = Cosine::new(query);
    let query_bits = sign_bits(query);
    let mut buf = vec![0f32; dim];
    let mut bits = vec![0u8; dim.div_ceil(8)];
    let mut scored: Vec<(f64, u64)> = Vec::with_capacity(allowed.len());
    if let Some(vectors) = &view.vectors {
        // One pass over the mapped f32 vectors in file order, in f32 lanes, a few rows
        // prefetched ahead: the exact scores of the best are taken again in f64 by the caller.
        const AHEAD: usize = 4;
        let rows = view.rows_of(vectors, allowed);
        for (i, &(slot, key)) in rows.iter().enumerate() {
            if let Some(&(next, _)) = rows.get(i + AHEAD) {
                vectors.prefetch_slot(next);
            }
            if dirty.is_empty() || !dirty.contains(&key) {
                if let Some(v) = vectors.at(slot) {
                    scored.push((cosine.rank(v) as f64, key));
                }
            }
        }
        return Ok(best_keys(scored, keep));
    }
    let unchanged = allowed.iter().filter(|k| !dirty.contains(k));
    for &key in unchanged {
        let d = match view.dtype {
            AnnDtype::Binary => {
                let found = view
                    .graph
                    .index
                    .get::<usearch::b1x8>(key, usearch::b1x8::from_mut_u8s(&mut bits))
                    .map_err(graph)?;
                if found == 0 {
                    continue;
                }
                bits.iter()
                    .zip(&query_bits)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum::<u32>() as f64
            }
            _ => {
                if view.graph.index.get::<f32>(key, &mut buf).map_err(graph)? == 0 {
                    continue;
                }
                cosine.rank(&buf) as f64
            }
        };
        scored.push((d, key));
    }
    Ok(best_keys(scored, keep))
}

/// The keys of the `keep` smallest distances, in no order.
fn best_keys(mut scored: Vec<(f64, u64)>, keep: usize) -> Vec<u64> {
    if scored.len() > keep {
        scored.select_nth_unstable_by(keep, |a, b| a.0.total_cmp(&b.0));
        scored.truncate(keep);
    }
    scored.into_iter().map(|(_, k)| k).collect()
}
