//! Vector sets: each model's vectors live in a vec0 table of their own. One set is `active`
//! (what search reads, and what `ingest` writes); during a model migration a second set is
//! filled by `backfill`; when it holds a vector for every chunk it becomes active and the old
//! one `retired`, in one transaction, and a retired set is dropped by `backfill --drop-old` or
//! `ingest --prune`.

use rusqlite::{params, Connection, OptionalExtension};

use super::schema;
pub use crate::indexers::store::{SetState, VectorSet};
use crate::indexers::ModelIdentity;
use crate::lifecycle::now_ms;

/// Sets an index may hold: the `embedded` bits of a chunk are an i64.
pub const MAX_SETS: i64 = 62;

const COLUMNS: &str = "id, model, model_dir, fingerprint, tokenizer, dimension, vec_table, \
                       state, watermark, backfill_done";

/// A vectors table's name as this backend makes them (`chunk_vectors`, `chunk_vectors_N`):
/// names read from the file are pasted into SQL, so anything else is refused (a file from
/// elsewhere could name `x; DROP TABLE documents`).
fn valid_table(name: &str) -> bool {
    match name.strip_prefix("chunk_vectors") {
        Some("") => true,
        Some(rest) => rest.strip_prefix('_').is_some_and(|n| {
            !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit())
        }),
        None => false,
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<VectorSet> {
    let vec_table: String = r.get(6)?;
    if !valid_table(&vec_table) {
        return Err(rusqlite::Error::FromSqlConversionFailure(
            6,
            rusqlite::types::Type::Text,
            format!(
                "vector_sets names the table `{}`, which ragline never makes: the index file \
                 was altered; rebuild it",
                vec_table.chars().take(64).collect::<String>()
            )
            .into(),
        ));
    }
    Ok(VectorSet {
        id: r.get(0)?,
        model: r.get(1)?,
        model_dir: r.get(2)?,
        fingerprint: r.get(3)?,
        tokenizer: r.get(4)?,
        dimension: r.get::<_, i64>(5)? as usize,
        vec_table,
        state: SetState::parse(&r.get::<_, String>(7)?),
        watermark: r.get(8)?,
        backfill_done: r.get::<_, i64>(9)? != 0,
    })
}

/// Every set, by id.
pub fn all(conn: &Connection) -> rusqlite::Result<Vec<VectorSet>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM vector_sets ORDER BY id"))?
        .query_map([], row)?
        .collect()
}

pub fn by_id(conn: &Connection, id: i64) -> rusqlite::Result<Option<VectorSet>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM vector_sets WHERE id = ?1"))?
        .query_row([id], row)
        .optional()
}

pub fn active(conn: &Connection) -> rusqlite::Result<Option<VectorSet>> {
    Ok(all(conn)?.into_iter().find(|s| s.state == SetState::Active))
}

/// The set being filled by a backfill, if any.
pub fn backfilling(conn: &Connection) -> rusqlite::Result<Option<VectorSet>> {
    Ok(all(conn)?
        .into_iter()
        .find(|s| s.state == SetState::Backfill))
}

/// A new set for `model` in `state`, with its vec0 table (the first set's table keeps the
/// name versions 1 and 2 gave it).
pub fn create(
    conn: &Connection,
    model: &ModelIdentity,
    state: SetState,
) -> rusqlite::Result<VectorSet> {
    let id: i64 = conn.query_row(
        "SELECT COALESCE(MAX(id), 0) + 1 FROM vector_sets",
        [],
        |r| r.get(0),
    )?;
    if id > MAX_SETS {
        return Err(rusqlite::Error::ToSqlConversionFailure(
            format!("an index holds at most {MAX_SETS} vector sets over its life").into(),
        ));
    }
    let vec_table = if id == 1 {
        "chunk_vectors".to_string()
    } else {
        format!("chunk_vectors_{id}")
    };
    schema::create_vectors(conn, &vec_table, model.dimension)?;
    conn.execute(
        "INSERT INTO vector_sets(id, model, model_dir, fingerprint, tokenizer, dimension,
                                 vec_table, state, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            id,
            model.name,
            model.dir,
            model.fingerprint,
            model.tokenizer,
            model.dimension as i64,
            vec_table,
            state.as_str(),
            now_ms()
        ],
    )?;
    if state == SetState::Active {
        mirror_in_meta(conn, model)?;
    }
    Ok(by_id(conn, id)?.expect("just inserted"))
}

/// The active model, in `meta` too, where versions 1 and 2 (and their readers) look for it.
pub fn mirror_in_meta(conn: &Connection, model: &ModelIdentity) -> rusqlite::Result<()> {
    for (k, v) in [
        ("model", model.name.clone()),
        ("model_dir", model.dir.clone()),
        ("model_fingerprint", model.fingerprint.clone()),
        ("dimension", model.dimension.to_string()),
    ] {
        conn.execute(
            "INSERT INTO meta(key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![k, v],
        )?;
    }
    Ok(())
}

/// Make `set` the active one and retire the active one, in the caller's transaction.
pub fn switch_to(conn: &Connection, set: &VectorSet) -> rusqlite::Result<()> {
    let now = now_ms();
    conn.execute(
        "UPDATE vector_sets SET state = 'retired', switched_at = ?1 WHERE state = 'active'",
        [now],
    )?;
    conn.execute(
        "UPDATE vector_sets SET state = 'active', switched_at = ?1 WHERE id = ?2",
        params![now, set.id],
    )?;
    mirror_in_meta(conn, &set.identity())?;
    // The lifecycle rows of retired sets say nothing any more.
    conn.execute(
        "DELETE FROM enrichment WHERE stage = 'embed' AND vector_set IN
             (SELECT id FROM vector_sets WHERE state = 'retired')",
        [],
    )?;
    Ok(())
}

/// Drop every retired set: its vectors and its record. Returns the models dropped.
pub fn drop_retired(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let retired: Vec<VectorSet> = all(conn)?
        .into_iter()
        .filter(|s| s.state == SetState::Retired)
        .collect();
    for set in &retired {
        conn.execute_batch(&format!("DROP TABLE IF EXISTS {}", set.vec_table))?;
        conn.execute(
            "UPDATE chunks SET embedded = embedded & ~?1 WHERE embedded & ?1 != 0",
            [set.bit()],
        )?;
        conn.execute("DELETE FROM vector_sets WHERE id = ?1", [set.id])?;
        conn.execute(
            "DELETE FROM enrichment WHERE stage = 'embed' AND vector_set = ?1",
            [set.id],
        )?;
        // Its ANN goes with it (the file is deleted by the next ANN save or `maintain`).
        conn.execute("DELETE FROM ann WHERE vector_set = ?1", [set.id])?;
        conn.execute("DELETE FROM ann_log WHERE vector_set = ?1", [set.id])?;
    }
    Ok(retired.into_iter().map(|s| s.model).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_ragline_makes_are_table_names() {
        for ok in ["chunk_vectors", "chunk_vectors_2", "chunk_vectors_62"] {
            assert!(valid_table(ok), "{ok}");
        }
        for bad in [
            "chunk_vectors_",
            "chunk_vectors_2; DROP TABLE documents",
            "documents",
            "chunk_vectors_x",
            "chunk_vectors_123456",
            "\"chunk_vectors\"",
        ] {
            assert!(!valid_table(bad), "{bad}");
        }
    }
}
