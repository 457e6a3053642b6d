//! The ANN beside the SQLite file: built by the indexers' finish, searched by readers with
//! the changes it lacks replayed, rebuilt after a killed build, dropped by `none`.

use std::collections::HashSet;

use super::*;
use crate::indexers::ann::{AnnChoice, AnnDtype, AnnMode};
use crate::indexers::sqlite::ann;
use crate::indexers::synthetic::{self, Rng};

const DIM: usize = 32;

fn factory(path: &Path, mode: AnnMode, dtype: AnnDtype) -> SqliteFactory {
    let mut id = synthetic::identity(DIM);
    id.ann = AnnChoice {
        mode: Some(mode),
        dtype: Some(dtype),
        // These tests check replay and filters at recall >= 0.95 over 30 queries: the graph
        // is tuned above that, so the sampling of 30 queries does not decide them.
        recall: Some(0.99),
    };
    SqliteFactory::open(path, id).unwrap()
}

/// Documents `from..to` (10 chunks each) written with `seed`'s vectors.
fn write(f: &SqliteFactory, from: usize, to: usize, seed: u64) {
    let mut b = f.connect().unwrap();
    let docs: Vec<_> = (from..to)
        .flat_map(|d| synthetic::document(d, DIM, seed))
        .collect();
    for batch in docs.chunks(500) {
        for r in b.write(batch) {
            r.unwrap();
        }
    }
    b.flush().unwrap();
}

/// The vector synthetic document `d` written with `seed` gives its chunk `i`.
fn vector_of(d: usize, i: usize, seed: u64) -> Vec<f32> {
    // The parent comes first, then the chunks.
    let doc = &synthetic::document(d, DIM, seed)[i + 1];
    doc.chunk.as_ref().and_then(|c| c.vector.clone()).unwrap()
}

fn queries(n: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(7);
    (0..n).map(|_| rng.unit(DIM)).collect()
}

/// Recall@10 of the ANN against the exact scan over `qs`; every ANN hit must be one the
/// exact scan can return (its distance equal to the exact one).
fn recall(path: &Path, qs: &[Vec<f32>]) -> (f64, ann::AnnSearch) {
    let fast = SqliteReader::open(path).unwrap();
    let exact = SqliteReader::open(path).unwrap().with_exact(true);
    let mut hits = 0;
    let mut stats = ann::AnnSearch::default();
    for q in qs {
        let (found, s) = fast
            .nearest_ann(q, 10, None)
            .unwrap()
            .expect("the index has a usable ANN");
        stats = s;
        let truth = exact.nearest(q, 10).unwrap();
        assert_eq!(found.len(), truth.len());
        let top: HashSet<i64> = truth.iter().map(|t| t.0).collect();
        let direct = exact.nearest(q, 4096).unwrap();
        assert!(
            direct.len() < 4096,
            "the test index outgrew its exact check"
        );
        for (id, d) in &found {
            let exact_d = direct.iter().find(|x| x.0 == *id).map(|x| x.1);
            let exact_d = exact_d.unwrap_or_else(|| panic!("chunk {id} is not in the index"));
            assert!((exact_d - d).abs() < 1e-5, "{exact_d} vs {d}");
            hits += top.contains(id) as usize;
        }
    }
    (hits as f64 / (10 * qs.len()) as f64, stats)
}

/// The ANN folder's graph files; each must have its vectors file beside it, and nothing else
/// may be there.
fn files(path: &Path) -> Vec<String> {
    let mut all: Vec<String> = std::fs::read_dir(ann::dir_of(path))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    all.sort();
    let graphs: Vec<String> = all
        .iter()
        .filter(|n| n.ends_with(".usearch"))
        .cloned()
        .collect();
    let companions: Vec<String> = graphs
        .iter()
        .map(|g| g.replace(".usearch", ".vectors"))
        .collect();
    let mut expected: Vec<String> = graphs.iter().chain(&companions).cloned().collect();
    expected.sort();
    assert_eq!(all, expected, "a graph file and its vectors file, each");
    graphs
}

/// A reader of `path` does not trust its ANN files (search answers exactly), and the next
/// writer `f` rebuilds them.
fn untrusted_until_rebuilt(path: &Path, q: &[f32], f: &SqliteFactory) {
    assert!(SqliteReader::open(path)
        .unwrap()
        .nearest_ann(q, 10, None)
        .unwrap()
        .is_none());
    let notes = f.finish().unwrap();
    assert!(notes.iter().any(|n| n.contains("built")), "{notes:?}");
}

fn log_len(path: &Path) -> i64 {
    connect(path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM ann_log", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn the_ann_answers_as_the_exact_scan_through_updates_deletes_and_a_killed_build() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = factory(&path, AnnMode::Hnsw, AnnDtype::F16);
    write(&f, 0, 300, 1);
    let notes = f.finish().unwrap();
    assert!(
        notes.iter().any(|n| n.contains("built: 3000 vectors")),
        "{notes:?}"
    );
    assert_eq!(files(&path).len(), 1, "{:?}", files(&path));
    assert_eq!(log_len(&path), 0);
    let qs = queries(30);
    let (r, stats) = recall(&path, &qs);
    assert!(r >= 0.95, "recall {r}");
    assert_eq!(stats.dirty, 0);

    // Rewrite 10 documents with other vectors and delete 10, without saving the ANN: a
    // reader replays the log (the changed chunks masked out of the graph, scored exactly).
    write(&f, 0, 10, 2);
    f.delete(&(50..60).map(|d| format!("doc{d}")).collect::<Vec<_>>())
        .unwrap();
    let (r, stats) = recall(&path, &qs);
    assert!(r >= 0.95, "recall {r}");
    assert_eq!(stats.dirty, 200, "{stats:?}");
    // A rewritten chunk is found by its new vector, a deleted one never comes back.
    let reader = SqliteReader::open(&path).unwrap();
    let (found, _) = reader
        .nearest_ann(&vector_of(7, 2, 2), 1, None)
        .unwrap()
        .unwrap();
    assert_eq!(reader.chunk(found[0].0).unwrap().unwrap().id, "doc7#2");
    assert!(found[0].1 < 1e-5);
    let (found, _) = reader
        .nearest_ann(&vector_of(55, 0, 1), 10, None)
        .unwrap()
        .unwrap();
    for (id, _) in found {
        let doc = reader.chunk(id).unwrap().unwrap().document_id;
        assert!(doc != "doc55", "a deleted chunk came back");
    }

    // Past its floor (256 chunks here) the replay costs more than a scan: readers scan.
    write(&f, 10, 40, 2);
    let reader = SqliteReader::open(&path).unwrap();
    assert!(reader.nearest_ann(&qs[0], 10, None).unwrap().is_none());
    let exact = SqliteReader::open(&path).unwrap().with_exact(true);
    assert_eq!(
        reader.nearest(&qs[0], 10).unwrap(),
        exact.nearest(&qs[0], 10).unwrap()
    );

    // The next writer's finish applies the log to the graph and saves it.
    let notes = f.finish().unwrap();
    assert!(
        notes.iter().any(|n| n.contains("updated with")),
        "{notes:?}"
    );
    assert_eq!(log_len(&path), 0);
    assert_eq!(files(&path).len(), 1, "the replaced file is deleted");
    let (r, stats) = recall(&path, &qs);
    assert!(r >= 0.95, "recall {r}");
    assert_eq!(stats.dirty, 0);

    // A build killed half-way leaves its record `building`: readers scan exactly (the
    // answers stay right), writes go on being logged, and the next finish builds it again.
    connect(&path)
        .unwrap()
        .execute("UPDATE ann SET state = 'building', file = NULL", [])
        .unwrap();
    assert!(SqliteReader::open(&path)
        .unwrap()
        .nearest_ann(&qs[0], 10, None)
        .unwrap()
        .is_none());
    write(&f, 100, 110, 3);
    assert!(log_len(&path) >= 100);
    let notes = f.finish().unwrap();
    assert!(notes.iter().any(|n| n.contains("built")), "{notes:?}");
    let (r, _) = recall(&path, &qs);
    assert!(r >= 0.95, "recall {r}");
    assert_eq!(files(&path).len(), 1, "{:?}", files(&path));

    // A missing or altered file is never trusted: exact until a writer rebuilds it. The
    // vectors file is covered by the graph's checksum: one changed f32 is found out.
    let vectors = ann::dir_of(&path).join(files(&path)[0].replace(".usearch", ".vectors"));
    let mut bytes = std::fs::read(&vectors).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&vectors, &bytes).unwrap();
    untrusted_until_rebuilt(&path, &qs[0], &f);
    for name in files(&path) {
        std::fs::write(ann::dir_of(&path).join(name), b"not an index").unwrap();
    }
    untrusted_until_rebuilt(&path, &qs[0], &f);

    // `none` drops it, files and all; search scans again.
    let f = factory(&path, AnnMode::None, AnnDtype::F16);
    let notes = f.finish().unwrap();
    assert!(notes.iter().any(|n| n.contains("dropped")), "{notes:?}");
    assert!(files(&path).is_empty(), "{:?}", files(&path));
    assert_eq!(log_len(&path), 0);
    write(&f, 0, 10, 4);
    assert_eq!(log_len(&path), 0, "no ANN, no log");
}

#[test]
fn quantized_graphs_are_rescored_to_exact_answers() {
    for dtype in [AnnDtype::Int8, AnnDtype::Binary] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.db");
        let f = factory(&path, AnnMode::Hnsw, dtype);
        write(&f, 0, 200, 1);
        f.finish().unwrap();
        let (r, _) = recall(&path, &queries(20));
        assert!(r >= 0.9, "{dtype:?}: recall {r}");
    }
}

#[test]
fn auto_waits_for_its_threshold_and_the_recorded_mode_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = factory(&path, AnnMode::Auto, AnnDtype::F16);
    write(&f, 0, 20, 1);
    assert!(f.finish().unwrap().is_empty());
    assert!(files(&path).is_empty());
    // The recorded mode holds for a writer that names none.
    let recorded = ann::recorded(&connect(&path).unwrap()).unwrap();
    assert_eq!(recorded.mode, AnnMode::Auto);
    let f = SqliteFactory::open(&path, synthetic::identity(DIM)).unwrap();
    let mut conn = connect(&path).unwrap();
    let set = sets::active(&conn).unwrap().unwrap();
    // Switched to hnsw in the record, the next maintenance builds it.
    conn.execute("UPDATE meta SET value = 'hnsw' WHERE key = 'ann'", [])
        .unwrap();
    let settings = ann::recorded(&conn).unwrap();
    let done = ann::maintain_set(&path, &mut conn, &set, settings).unwrap();
    assert!(
        matches!(done, ann::Maintained::Built { vectors: 200, .. }),
        "{done:?}"
    );
    drop(f);
}

/// Documents whose metadata says `lang` (every third "fr", else "en") and `tags` (a list).
fn write_with_metadata(f: &SqliteFactory, docs: usize) {
    let mut b = f.connect().unwrap();
    let mut all = Vec::new();
    for d in 0..docs {
        let mut group = synthetic::document(d, DIM, 1);
        let lang = if d % 3 == 0 { "fr" } else { "en" };
        for doc in &mut group {
            doc.fields.metadata.insert("lang".into(), lang.into());
            doc.fields.metadata.insert(
                "tags".into(),
                serde_json::json!(["guide", format!("t{}", d % 50)]),
            );
        }
        all.extend(group);
    }
    for batch in all.chunks(500) {
        for r in b.write(batch) {
            r.unwrap();
        }
    }
    b.flush().unwrap();
}

#[test]
fn filters_apply_inside_the_search_so_k_results_come_back() {
    use crate::indexers::filter::Where;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = factory(&path, AnnMode::Hnsw, AnnDtype::F16);
    write_with_metadata(&f, 300);
    f.finish().unwrap();
    let fast = SqliteReader::open(&path).unwrap().with_ef(Some(16));
    let exact = SqliteReader::open(&path).unwrap().with_exact(true);
    let doc_of = |id: i64| fast.chunk(id).unwrap().unwrap().document_id;
    // (filter, matching documents, scanned): one document (a scan of what matches); a third
    // of them (the graph searched with a mask at ef 16: a walk visits about 16 x 16 x 3 =
    // 768 nodes, fewer than the 1,000 chunks a scan would score); a glob over a quarter (750
    // chunks to score against a walk of 16 x 16 x 4 = 1,024: a scan); a list member (60).
    let cases: [(&[&str], usize, bool); 4] = [
        (&["source=doc7"], 1, true),
        (&["lang=fr"], 100, false),
        (&["source=doc1*", "lang=en"], 75, true),
        (&["tags=t7"], 6, true),
    ];
    for (clauses, docs, scan) in cases {
        let w = Where::parse(clauses).unwrap();
        let allowed = fast.allowed(&w).unwrap();
        assert_eq!(allowed.len(), docs * 10, "{clauses:?}");
        let (mut hits, mut total) = (0, 0);
        let mut scanned = false;
        for q in queries(20) {
            let (found, stats) = fast
                .nearest_ann(&q, 10, Some(allowed.as_ref()))
                .unwrap()
                .unwrap();
            scanned = stats.scanned;
            let truth = exact.nearest_where(&q, 10, &w).unwrap();
            assert_eq!(found.len(), 10.min(docs * 10), "{clauses:?}: k results");
            assert_eq!(truth.len(), found.len());
            for (id, _) in &found {
                assert!(
                    allowed.contains(&(*id as u64)),
                    "{clauses:?}: {} slipped through",
                    doc_of(*id)
                );
            }
            let top: HashSet<i64> = truth.iter().map(|t| t.0).collect();
            hits += found.iter().filter(|f| top.contains(&f.0)).count();
            total += truth.len();
            // Through the reader's own entry point too.
            assert_eq!(fast.nearest_where(&q, 10, &w).unwrap(), found);
        }
        let recall = hits as f64 / total as f64;
        assert!(recall >= 0.95, "{clauses:?}: recall {recall}");
        assert_eq!(scanned, scan, "{clauses:?}");
    }
    // Keyword search takes the same filter; no filter, no restriction.
    let w = Where::parse(&["lang=fr"]).unwrap();
    let found = fast.keyword_where("render state", 50, &w).unwrap();
    assert!(!found.is_empty());
    for (id, _) in found {
        let d: usize = doc_of(id)["doc".len()..].parse().unwrap();
        assert_eq!(d % 3, 0);
    }
    assert_eq!(fast.allowed(&Where::default()).unwrap().len(), 3000);
    // What a filter lets through is kept until another connection changes the index.
    let w = Where::parse(&["source=doc30*"]).unwrap();
    assert_eq!(fast.allowed(&w).unwrap().len(), 10);
    write(&f, 300, 310, 1);
    assert_eq!(fast.allowed(&w).unwrap().len(), 110);
}

/// Claim and embed (random vectors of `DIM`) every piece of work the store hands out, running
/// its maintenance whenever it is idle, until maintenance does something other than queue.
fn drain(store: &mut SqliteStore, set: i64) -> crate::lifecycle::Maintenance {
    use crate::lifecycle::{
        ChunkVector, Claim, ClaimRequest, EnrichStore, LifecycleStore, Maintenance,
    };
    let req = ClaimRequest {
        owner: "W".into(),
        stages: vec![crate::lifecycle::EMBED.into()],
        vector_sets: vec![],
        max_items: 50,
        max_cost: u64::MAX,
        lease: Duration::from_secs(60),
        retry_limit: 5,
    };
    let mut rng = Rng(3);
    loop {
        match store.claim(&req).unwrap() {
            Claim::Items(items) => {
                for item in items {
                    let v: Vec<ChunkVector> = store
                        .pending_chunks(&item.key)
                        .unwrap()
                        .into_iter()
                        .map(|c| ChunkVector {
                            rowid: c.rowid,
                            guard: c.input_key,
                            vector: rng.unit(DIM),
                        })
                        .collect();
                    let doc = std::slice::from_ref(&item.key.document_id);
                    store.write_vectors(set, &v, doc).unwrap();
                }
            }
            Claim::Idle { .. } => match LifecycleStore::maintain(store).unwrap() {
                Maintenance::Queued { .. } => {}
                done => return done,
            },
        }
    }
}

#[test]
fn a_backfilled_set_has_its_ann_when_search_switches_to_it() {
    use crate::indexers::store::IndexStore;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = factory(&path, AnnMode::Hnsw, AnnDtype::Int8);
    write(&f, 0, 40, 1);
    f.finish().unwrap();
    drop(f);
    let mut store = SqliteStore::open(&path).unwrap();
    let model = crate::indexers::ModelIdentity {
        name: "model-b".into(),
        dir: "/nowhere".into(),
        fingerprint: "b".into(),
        dimension: DIM,
        tokenizer: Some("tok".into()),
    };
    let set = store.start_backfill(&model).unwrap();
    assert_eq!(set.id, 2);
    let done = drain(&mut store, set.id);
    assert_eq!(
        done,
        crate::lifecycle::Maintenance::Switched {
            set: 2,
            model: "model-b".into()
        }
    );
    // The run has not finished: the graph was built before the switch, in the recorded dtype.
    let conn = connect(&path).unwrap();
    let row = ann::row_of(&conn, 2).unwrap().expect("set 2 has an ANN");
    assert_eq!(
        (row.state.as_str(), row.dtype, row.size),
        ("ready", AnnDtype::Int8, 400)
    );
    let (r, stats) = recall(&path, &queries(30));
    assert!(r >= 0.95, "recall {r}");
    assert_eq!(stats.dirty, 0);
    // The retired set's graph goes with it at the run's end.
    assert_eq!(store.drop_retired().unwrap(), ["synthetic-32"]);
    store.finish_run().unwrap();
    assert!(ann::row_of(&conn, 1).unwrap().is_none());
    assert!(
        files(&path).iter().all(|f| f.starts_with("set-2-")),
        "{:?}",
        files(&path)
    );
}

#[test]
fn an_idle_long_run_applies_the_log_before_readers_give_up_on_the_graph() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = factory(&path, AnnMode::Hnsw, AnnDtype::F16);
    write(&f, 0, 100, 1);
    f.finish().unwrap();
    let mut store = SqliteStore::open(&path).unwrap();
    // A few changes stay in the log (readers replay them cheaply)...
    write(&f, 0, 5, 2);
    assert_eq!(drain(&mut store, 1), crate::lifecycle::Maintenance::Nothing);
    let few = log_len(&path);
    assert!((50..128).contains(&few), "{few}");
    // ...half of what readers would replay before scanning is applied while idle.
    write(&f, 5, 20, 2);
    assert!(log_len(&path) >= 200);
    assert_eq!(drain(&mut store, 1), crate::lifecycle::Maintenance::Nothing);
    assert_eq!(log_len(&path), 0);
    let (r, stats) = recall(&path, &queries(30));
    assert!(r >= 0.95, "recall {r}");
    assert_eq!(stats.dirty, 0);
}
