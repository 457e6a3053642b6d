//! What only the SQLite backend has: its file checks and its migrations. The tests every
//! backend passes are in `indexers/tests`.

use super::*;
pub(super) use crate::indexers::tests::{identity, key_of, unit};
pub(super) use schema::SCHEMA_VERSION;

#[test]
fn another_model_or_a_foreign_file_is_refused_without_touching_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    drop(SqliteFactory::open(&path, identity("a", 4)).unwrap());
    let before = std::fs::read(&path).unwrap();
    let err = SqliteFactory::open(&path, identity("b", 4))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("holds vectors of model `test-model`") && err.contains("another --index"),
        "{err}"
    );
    let err = SqliteFactory::open(&path, identity("a", 8))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("4 dimensions"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);

    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        b"this is not a database, just text that is long enough to matter",
    )
    .unwrap();
    let err = SqliteFactory::open(&junk, identity("a", 4))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("not a ragline index") && err.contains("not an SQLite database"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&junk).unwrap(),
        b"this is not a database, just text that is long enough to matter"
    );

    let other = dir.path().join("other.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t(x)")
        .unwrap();
    let err = SqliteFactory::open(&other, identity("a", 4))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("without ragline's tables"), "{err}");
}

mod ann;
mod keyword;
mod migration;
