//! The Tantivy index beside the SQLite file: built from the current chunks, replayed from the
//! log through rewrites and deletions, never answering with a change it lacks, rebuilt when
//! broken; it finds what FTS5 finds.

use std::collections::HashSet;

use super::*;
use crate::indexers::ann::{AnnChoice, AnnMode};
use crate::indexers::sqlite::keyword;
use crate::indexers::synthetic;

const DIM: usize = 8;

fn factory(path: &Path) -> SqliteFactory {
    let mut id = synthetic::identity(DIM);
    id.ann = AnnChoice {
        mode: Some(AnnMode::None),
        ..AnnChoice::default()
    };
    SqliteFactory::open(path, id).unwrap()
}

/// Documents `from..to` (10 chunks each), their chunks' text tagged with `tag`: each chunk
/// holds `unique{d}x{i}`, `marker{d % 7}` and `tag{tag}` among the synthetic words.
fn write(f: &SqliteFactory, from: usize, to: usize, tag: u64) {
    let mut b = f.connect().unwrap();
    let docs: Vec<_> = (from..to)
        .flat_map(|d| {
            let mut doc = synthetic::document(d, DIM, tag);
            for (i, c) in doc.iter_mut().skip(1).enumerate() {
                c.fields.text = format!(
                    "{} unique{d}x{i} marker{} tag{tag}",
                    &c.fields.text[..60],
                    d % 7
                );
            }
            doc
        })
        .collect();
    for r in b.write(&docs) {
        r.unwrap();
    }
    b.flush().unwrap();
}

fn maintain(path: &Path) -> Option<String> {
    let mut conn = rusqlite::Connection::open(path).unwrap();
    keyword::maintain(path, &mut conn, Some(1)).unwrap()
}

fn ids(found: &[(i64, f64)]) -> HashSet<i64> {
    found.iter().map(|f| f.0).collect()
}

const QUERIES: [&str; 6] = [
    "marker3",
    "unique5x2",
    "marker1 marker2",
    "tag1 marker4",
    "Unique12X0 nothing",
    "render",
];

/// Tantivy answers (it is up to date) and finds the chunks FTS5 finds, best first.
fn agrees_with_fts5(r: &SqliteReader, extra: &[&str]) {
    for q in QUERIES.iter().chain(extra) {
        let tantivy = r
            .keyword_tantivy(q, 2000, None)
            .unwrap()
            .unwrap_or_else(|| panic!("`{q}`: Tantivy did not answer"));
        let fts5 = r.keyword_fts5(q, 2000).unwrap();
        assert_eq!(ids(&tantivy), ids(&fts5), "`{q}`");
        assert!(tantivy.windows(2).all(|w| w[0].1 >= w[1].1), "`{q}`");
        assert_eq!(r.keyword(q, 2000).unwrap(), tantivy, "`{q}`");
    }
}

#[test]
fn the_keyword_index_finds_what_fts5_finds_through_rewrites_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    let f = factory(&path);
    write(&f, 0, 60, 1);
    // Below its threshold the writers' finish builds none; FTS5 answers.
    f.finish().unwrap();
    assert!(!keyword::dir_of(&path).exists());
    let early = SqliteReader::open(&path).unwrap();
    assert!(early
        .keyword_tantivy("marker3", 10, None)
        .unwrap()
        .is_none());

    let note = maintain(&path).unwrap();
    assert!(note.contains("built: 600 chunks"), "{note}");
    let r = SqliteReader::open(&path).unwrap();
    agrees_with_fts5(&r, &[]);
    let top = r.keyword("unique5x2", 3).unwrap();
    assert_eq!(r.chunk(top[0].0).unwrap().unwrap().id, "doc5#2");
    // A reader opened before the build finds it too.
    agrees_with_fts5(&early, &[]);

    // Rewritten documents (new text) and deleted ones: until a writer replays the log, FTS5
    // answers, with the change.
    write(&f, 0, 10, 2);
    f.delete(&["doc50".into(), "doc51".into()]).unwrap();
    assert!(r.keyword_tantivy("tag2", 10, None).unwrap().is_none());
    assert_eq!(r.keyword("tag2", 1000).unwrap().len(), 100);
    assert!(r.keyword("unique50x1", 10).unwrap().is_empty());

    let note = maintain(&path).unwrap();
    assert!(note.contains("updated with"), "{note}");
    // The same reader takes the new commit in.
    agrees_with_fts5(&r, &["tag2", "tag1", "unique50x1"]);
    assert_eq!(r.keyword("tag2", 1000).unwrap().len(), 100);
    assert!(r.keyword("unique50x1", 10).unwrap().is_empty());
    assert_eq!(maintain(&path), None, "nothing left to replay");
    let log: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM keyword_log", [], |r| r.get(0))
        .unwrap();
    assert_eq!(log, 0);

    // Filters apply inside the search.
    let w = crate::indexers::filter::Where::parse(&["source=doc1*"]).unwrap();
    let found = r.keyword_where("marker3 marker4", 1000, &w).unwrap();
    assert!(!found.is_empty());
    let mut fts5: Vec<i64> = r
        .keyword_fts5("marker3 marker4", 2000)
        .unwrap()
        .into_iter()
        .map(|f| f.0)
        .filter(|id| {
            r.chunk(*id)
                .unwrap()
                .unwrap()
                .document_id
                .starts_with("doc1")
        })
        .collect();
    fts5.sort();
    let mut got: Vec<i64> = found.iter().map(|f| f.0).collect();
    got.sort();
    assert_eq!(got, fts5);
}

#[test]
fn a_broken_keyword_index_is_not_trusted_and_the_next_writer_rebuilds_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    let f = factory(&path);
    write(&f, 0, 20, 1);
    assert!(maintain(&path).unwrap().contains("built"));
    std::fs::write(keyword::dir_of(&path).join("meta.json"), b"{ not json").unwrap();
    let r = SqliteReader::open(&path).unwrap();
    assert!(r.keyword_tantivy("marker3", 10, None).unwrap().is_none());
    assert_eq!(
        ids(&r.keyword("marker3", 1000).unwrap()),
        ids(&r.keyword_fts5("marker3", 1000).unwrap())
    );
    let note = maintain(&path).unwrap();
    assert!(note.contains("built: 200 chunks"), "{note}");
    agrees_with_fts5(&SqliteReader::open(&path).unwrap(), &[]);
}
