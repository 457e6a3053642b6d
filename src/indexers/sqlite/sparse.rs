//! Sparse (SPLADE) vectors in the SQLite index: a postings table `sparse_postings(term,
//! chunk, weight)` keyed by term (WITHOUT ROWID, so a term's postings are one range of the
//! B-tree), written by the `sparse` stage; a query is scored by one pass over the postings of
//! its own terms, summed per chunk (the dot product of the two vectors). The index records
//! the model its vectors come from in `meta` (`sparse_model`, `sparse_model_dir`,
//! `sparse_fingerprint`, `sparse_dimension`); a chunk's postings go with its row (a trigger).

use rusqlite::{params, Connection, OptionalExtension};

use crate::lifecycle::SparseModelRecord;

/// The model the index's sparse vectors come from.
pub(super) fn read_model(conn: &Connection) -> rusqlite::Result<Option<SparseModelRecord>> {
    let get = |key: &str| -> rusqlite::Result<Option<String>> {
        conn.prepare_cached("SELECT value FROM meta WHERE key = ?1")?
            .query_row([key], |r| r.get(0))
            .optional()
    };
    let (Some(name), Some(fingerprint)) = (get("sparse_model")?, get("sparse_fingerprint")?) else {
        return Ok(None);
    };
    Ok(Some(SparseModelRecord {
        name,
        dir: get("sparse_model_dir")?.unwrap_or_default(),
        fingerprint,
        dimension: get("sparse_dimension")?
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
    }))
}

pub(super) fn record_model(conn: &Connection, m: &SparseModelRecord) -> rusqlite::Result<()> {
    let mut put = conn.prepare_cached(
        "INSERT INTO meta(key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?;
    put.execute(params!["sparse_model", m.name])?;
    put.execute(params!["sparse_model_dir", m.dir])?;
    put.execute(params!["sparse_fingerprint", m.fingerprint])?;
    put.execute(params!["sparse_dimension", m.dimension.to_string()])?;
    Ok(())
}

/// The query as SQL reads it: a JSON object of term -> weight (the terms' postings are
/// looked up one by one through the primary key).
pub(super) fn query_json(terms: &[u32], weights: &[f32]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = terms
        .iter()
        .zip(weights)
        .filter(|(_, w)| w.is_finite() && **w != 0.0)
        .map(|(t, w)| (t.to_string(), serde_json::Value::from(*w as f64)))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// The scoring: the query's terms (`?q`, [`query_json`]) each joined to its postings, summed
/// per chunk.
pub(super) fn scored_sql(q: usize) -> String {
    format!(
        "SELECT p.chunk AS chunk, SUM(p.weight * q.weight) AS score
         FROM (SELECT CAST(key AS INTEGER) AS term, value AS weight FROM json_each(?{q})) q
              CROSS JOIN sparse_postings p ON p.term = q.term
         GROUP BY p.chunk"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The postings of three chunks; the query's score of each is its dot product with the
    /// query, chunks sharing no term are not found, and a deleted chunk takes its postings.
    #[test]
    fn queries_score_the_dot_product_and_postings_go_with_their_chunk() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE chunks (rowid INTEGER PRIMARY KEY, text TEXT);")
            .unwrap();
        conn.execute_batch(super::super::schema::V8).unwrap();
        let chunks: [(i64, &[(u32, f32)]); 3] = [
            (1, &[(5, 1.0), (9, 0.5)]),
            (2, &[(5, 0.25), (7, 2.0)]),
            (3, &[(11, 3.0)]),
        ];
        for (rowid, terms) in chunks {
            conn.execute("INSERT INTO chunks(rowid, text) VALUES (?1, 'x')", [rowid])
                .unwrap();
            for (t, w) in terms {
                conn.execute(
                    "INSERT INTO sparse_postings(term, chunk, weight) VALUES (?1, ?2, ?3)",
                    params![*t as i64, rowid, *w as f64],
                )
                .unwrap();
            }
        }
        let search = |terms: &[u32], weights: &[f32]| -> Vec<(i64, f64)> {
            conn.prepare(&format!("{} ORDER BY score DESC, chunk", scored_sql(1)))
                .unwrap()
                .query_map([query_json(terms, weights)], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };
        // Chunk 1: 2*1 + 4*0.5 = 4; chunk 2: 2*0.25 + 1*2 = 2.5; chunk 3 shares nothing.
        assert_eq!(
            search(&[5, 9, 7, 100], &[2.0, 4.0, 1.0, 9.0]),
            [(1, 4.0), (2, 2.5)]
        );
        // Zero and non-finite weights are left out of the query.
        assert_eq!(search(&[11, 5], &[0.0, f32::NAN]), []);
        conn.execute("DELETE FROM chunks WHERE rowid = 1", [])
            .unwrap();
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM sparse_postings", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 3);
        assert_eq!(search(&[5], &[1.0]), [(2, 0.25)]);
    }
}
