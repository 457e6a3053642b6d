//! Indexes written by earlier versions open, keep their rows and get their lifecycle.

use super::*;

/// An index as schema version `v` (1 or 2) wrote it: one document with two chunks, both
/// embedded (4 dimensions).
fn old_index(path: &std::path::Path, v: i64) {
    register_sqlite_vec();
    let conn = rusqlite::Connection::open(path).unwrap();
    schema::migrate_to(&conn, 0, v).unwrap();
    schema::create_vectors(&conn, "chunk_vectors", 4).unwrap();
    for (k, val) in [
        ("model", "test-model"),
        ("model_dir", "/nonexistent"),
        ("model_fingerprint", "a"),
        ("dimension", "4"),
    ] {
        conn.execute("INSERT INTO meta(key, value) VALUES (?1, ?2)", [k, val])
            .unwrap();
    }
    conn.execute(
        "INSERT INTO documents(id, content_hash, fingerprint, version, chunk_count, updated_at)
         VALUES ('doc', 'h1', 'pipe-old', 'v1', 2, 0)",
        [],
    )
    .unwrap();
    for (rowid, text) in [(1i64, "alpha one"), (2, "beta two")] {
        conn.execute(
            "INSERT INTO chunks(rowid, id, document_id, ordinal, version, text, heading_path,
                                start_byte, end_byte, token_count)
             VALUES (?1, ?2, 'doc', ?3, 'v1', ?4, 'Top', 0, 9, 3)",
            rusqlite::params![rowid, format!("doc#{}", rowid - 1), rowid - 1, text],
        )
        .unwrap();
        if v >= 2 {
            conn.execute(
                "UPDATE chunks SET input_key = ?2 WHERE rowid = ?1",
                rusqlite::params![rowid, key_of(text).to_vec()],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO chunk_fts(rowid, text, heading_path) VALUES (?1, ?2, 'Top')",
            rusqlite::params![rowid, text],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO chunk_vectors(rowid, embedding) VALUES (?1, ?2)",
            rusqlite::params![rowid, vector_bytes(&unit(rowid as usize, 4))],
        )
        .unwrap();
    }
}

#[test]
fn version_1_and_2_indexes_are_migrated_keep_their_rows_and_get_their_lifecycle() {
    for v in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.db");
        old_index(&path, v);
        let r = SqliteReader::open(&path).unwrap();
        assert_eq!(r.meta().schema_version, v);
        assert_eq!(
            r.counts().unwrap(),
            (1, 2, 2),
            "an old index reads as it is"
        );
        drop(r);

        let f = SqliteFactory::open(&path, identity("a", 4)).unwrap();
        let r = SqliteReader::open(&path).unwrap();
        assert_eq!(r.meta().schema_version, SCHEMA_VERSION);
        assert_eq!(r.counts().unwrap(), (1, 2, 2));
        assert_eq!(
            r.keyword("beta", 5).unwrap().len(),
            1,
            "full text survives the rebuild"
        );
        let near = r.nearest(&unit(2, 4), 1).unwrap();
        assert_eq!(r.chunk(near[0].0).unwrap().unwrap().text, "beta two");
        // The vectors it held are its first, active, vector set; the document is done.
        let store = SqliteStore::open(&path).unwrap();
        let sets = store.sets().unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(
            (sets[0].id, sets[0].state, sets[0].dimension),
            (1, SetState::Active, 4)
        );
        assert_eq!(
            sets[0].tokenizer.as_deref(),
            Some("tok"),
            "filled in by the run"
        );
        let s = store.status().unwrap();
        assert_eq!((s.stages["chunk"].done, s.stages["embed"].done), (1, 1));
        // Version 1 rows have no input key: never reused. Version 2 rows are.
        let mut stored = f.stored_vectors().unwrap().unwrap();
        let found = stored.vector_for(&key_of("alpha one")).unwrap();
        assert_eq!(found.is_some(), v >= 2, "version {v}");
    }
}
