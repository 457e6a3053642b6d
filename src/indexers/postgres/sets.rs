//! Vector sets in a Postgres index: each model's vectors in a table of their own
//! (`vectors_<id>`). One set is `active` (searched, written by `ingest`); a `backfill` fills
//! a second one; when it holds a vector for every chunk it becomes active and the old one
//! `retired`, in one transaction; a retired set is dropped by `backfill --drop-old` or
//! `ingest --prune`.

use postgres::GenericClient;

use super::schema;
use super::target::VectorType;
use crate::indexers::{ModelIdentity, SetState, VectorSet};

const COLUMNS: &str = "id, model, model_dir, fingerprint, tokenizer, dimension, vec_table, \
                       state, watermark, backfill_done";

/// The vectors table of set `id`: always the name this backend makes (`vectors_N`), never a
/// name read from the database pasted into SQL (whoever can write the schema could name
/// `x; DROP ...`).
fn table_of(id: i64, stored: String) -> String {
    let made = format!("vectors_{id}");
    if stored != made {
        tracing::warn!(
            "vector set {id} names the table {:?}, not {made}: the schema was altered; using \
             {made}",
            stored.chars().take(64).collect::<String>()
        );
    }
    made
}

fn row(r: &postgres::Row) -> VectorSet {
    let id = r.get::<_, i32>(0) as i64;
    VectorSet {
        id,
        model: r.get(1),
        model_dir: r.get(2),
        fingerprint: r.get(3),
        tokenizer: r.get(4),
        dimension: r.get::<_, i32>(5) as usize,
        vec_table: table_of(id, r.get(6)),
        state: SetState::parse(r.get(7)),
        watermark: r.get(8),
        backfill_done: r.get(9),
    }
}

/// Every set, by id.
pub fn all(c: &mut impl GenericClient, s: &str) -> Result<Vec<VectorSet>, postgres::Error> {
    Ok(c.query(
        &format!("SELECT {COLUMNS} FROM {s}.vector_sets ORDER BY id"),
        &[],
    )?
    .iter()
    .map(row)
    .collect())
}

pub fn active(c: &mut impl GenericClient, s: &str) -> Result<Option<VectorSet>, postgres::Error> {
    Ok(all(c, s)?.into_iter().find(|x| x.state == SetState::Active))
}

/// A new set for `model` in `state`, with its table, in the caller's transaction.
pub fn create(
    c: &mut impl GenericClient,
    s: &str,
    ty: VectorType,
    model: &ModelIdentity,
    state: SetState,
    now: i64,
) -> Result<VectorSet, postgres::Error> {
    let id: i32 = c
        .query_one(
            &format!("SELECT COALESCE(MAX(id), 0) + 1 FROM {s}.vector_sets"),
            &[],
        )?
        .get(0);
    let table = format!("vectors_{id}");
    schema::create_vectors(c, s, &table, ty, model.dimension)?;
    c.execute(
        &format!(
            "INSERT INTO {s}.vector_sets(id, model, model_dir, fingerprint, tokenizer,
                                          dimension, vec_table, state, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ),
        &[
            &id,
            &model.name,
            &model.dir,
            &model.fingerprint,
            &model.tokenizer,
            &(model.dimension as i32),
            &table,
            &state.as_str(),
            &now,
        ],
    )?;
    if state == SetState::Active {
        mirror_in_meta(c, s, model)?;
    }
    Ok(all(c, s)?
        .into_iter()
        .find(|x| x.id == id as i64)
        .expect("the set was just inserted; this is a bug"))
}

/// The active model, in `meta` too: what a reader checks first.
pub fn mirror_in_meta(
    c: &mut impl GenericClient,
    s: &str,
    model: &ModelIdentity,
) -> Result<(), postgres::Error> {
    for (k, v) in [
        ("model", model.name.clone()),
        ("model_dir", model.dir.clone()),
        ("model_fingerprint", model.fingerprint.clone()),
        ("dimension", model.dimension.to_string()),
    ] {
        c.execute(
            &format!(
                "INSERT INTO {s}.meta(key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value"
            ),
            &[&k, &v],
        )?;
    }
    Ok(())
}

/// Make `set` the active one and retire the active one, in the caller's transaction.
pub fn switch_to(
    c: &mut impl GenericClient,
    s: &str,
    set: &VectorSet,
    now: i64,
) -> Result<(), postgres::Error> {
    c.execute(
        &format!(
            "UPDATE {s}.vector_sets SET state = 'retired', switched_at = $1
             WHERE state = 'active'"
        ),
        &[&now],
    )?;
    c.execute(
        &format!("UPDATE {s}.vector_sets SET state = 'active', switched_at = $1 WHERE id = $2"),
        &[&now, &(set.id as i32)],
    )?;
    mirror_in_meta(c, s, &set.identity())?;
    // The lifecycle rows of retired sets say nothing any more.
    c.execute(
        &format!(
            "DELETE FROM {s}.enrichment WHERE stage = 'embed' AND vector_set IN
                 (SELECT id FROM {s}.vector_sets WHERE state = 'retired')"
        ),
        &[],
    )?;
    Ok(())
}

/// Drop every retired set: its table and its record. Returns the models dropped.
pub fn drop_retired(c: &mut impl GenericClient, s: &str) -> Result<Vec<String>, postgres::Error> {
    let retired: Vec<VectorSet> = all(c, s)?
        .into_iter()
        .filter(|x| x.state == SetState::Retired)
        .collect();
    for set in &retired {
        c.batch_execute(&format!("DROP TABLE IF EXISTS {s}.{}", set.vec_table))?;
        c.execute(
            &format!("DELETE FROM {s}.vector_sets WHERE id = $1"),
            &[&(set.id as i32)],
        )?;
        c.execute(
            &format!("DELETE FROM {s}.enrichment WHERE stage = 'embed' AND vector_set = $1"),
            &[&(set.id as i32)],
        )?;
    }
    Ok(retired.into_iter().map(|x| x.model).collect())
}

/// `chunks c` has a vector in every live set (SQL over the alias `c`).
pub fn in_every_live_set(s: &str, sets: &[VectorSet]) -> String {
    let live: Vec<String> = sets
        .iter()
        .filter(|x| x.is_live())
        .map(|x| has_vector(s, x))
        .collect();
    if live.is_empty() {
        "true".into()
    } else {
        live.join(" AND ")
    }
}

/// `chunks c` has a vector in `set`.
pub fn has_vector(s: &str, set: &VectorSet) -> String {
    format!(
        "EXISTS (SELECT 1 FROM {s}.{} v WHERE v.rowid = c.rowid)",
        set.vec_table
    )
}

/// Delete the chunk rows `predicate` selects (over `chunks c`, `using` the tables named),
/// with their vectors in every set and their pending token ids, in one statement. Returns
/// the SQL; it yields the number of rows deleted.
pub fn delete_chunks(s: &str, sets: &[VectorSet], using: &str, predicate: &str) -> String {
    let using = if using.is_empty() {
        String::new()
    } else {
        format!("USING {using}")
    };
    let mut sql = format!(
        "WITH gone AS (DELETE FROM {s}.chunks c {using} WHERE {predicate} RETURNING c.rowid),
              tokens AS (DELETE FROM {s}.chunk_tokens WHERE rowid IN (SELECT rowid FROM gone))"
    );
    for set in sets {
        sql.push_str(&format!(
            ", v{} AS (DELETE FROM {s}.{} WHERE rowid IN (SELECT rowid FROM gone))",
            set.id, set.vec_table
        ));
    }
    sql.push_str(" SELECT count(*) FROM gone");
    sql
}
