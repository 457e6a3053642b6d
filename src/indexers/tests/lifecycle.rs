//! The lifecycle on every store: settle, claims and leases, retries and dead letters,
//! priority, pause, old versions kept for search, vector sets and the switch.

use std::time::Duration;

use super::*;
use crate::lifecycle::{
    ChunkVector, Claim, ClaimRequest, DeliveryFailure, EnrichStore, LifecycleStore, Maintenance,
    Priority, StageSettings, Status, WorkItem, WorkKey, EMBED,
};

fn deferred(parent: &Document, ordinal: u32, text: &str) -> Document {
    let mut c = chunk(parent, ordinal, text, vec![]);
    let ch = c.chunk.as_mut().unwrap();
    ch.vector = None;
    ch.token_ids = text.bytes().map(u32::from).collect();
    c
}

fn request(owner: &str) -> ClaimRequest {
    ClaimRequest {
        owner: owner.into(),
        stages: vec![EMBED.into()],
        vector_sets: vec![],
        max_items: 100,
        max_cost: u64::MAX,
        lease: Duration::from_secs(60),
        retry_limit: 5,
    }
}

fn items(c: Claim) -> Vec<WorkItem> {
    match c {
        Claim::Items(items) => items,
        other => panic!("expected items, got {other:?}"),
    }
}

fn ids(items: &[WorkItem]) -> Vec<&str> {
    items.iter().map(|i| i.key.document_id.as_str()).collect()
}

/// The index `ix` with documents `docs`, each with `n` chunks written without vectors.
fn deferred_index(
    ix: &TestIndex,
    docs: &[&str],
    n: u32,
) -> (Box<dyn BackendFactory>, Box<dyn IndexStore>) {
    let f = ix.open(identity("a", 4));
    let mut b = f.connect().unwrap();
    for d in docs {
        let p = parent(d, "h1", n);
        let mut batch = vec![p.clone()];
        for i in 0..n {
            batch.push(deferred(&p, i, &format!("{d} chunk {i}")));
        }
        all_ok(b.write(&batch));
    }
    (f, ix.store())
}

fn vectors_for(store: &mut dyn IndexStore, key: &WorkKey) -> Vec<ChunkVector> {
    store
        .pending_chunks(key)
        .unwrap()
        .into_iter()
        .map(|c| ChunkVector {
            rowid: c.rowid,
            guard: c.input_key,
            vector: unit(c.rowid as usize, 4),
        })
        .collect()
}

#[test]
fn deferred_chunks_queue_their_embedding_and_a_claim_leases_it() {
    for ix in backends("defe_chun_queu_thei") {
        let (_f, mut store) = deferred_index(&ix, &["a"], 2);
        let status = store.status().unwrap();
        assert_eq!(status.stages["chunk"].done, 1);
        assert_eq!(status.stages["embed"].pending, 1);
        assert_eq!(store.unembedded().unwrap(), (2, 2));

        let mut req = request("A");
        req.lease = Duration::from_millis(1);
        let got = items(store.claim(&req).unwrap());
        assert_eq!(ids(&got), ["a"]);
        assert_eq!(got[0].attempts, 1);
        assert_eq!(got[0].priority, Priority::Fresh);
        // The chunker's ids come with the chunks (the set's tokenizer is the chunker's).
        let chunks = store.pending_chunks(&got[0].key).unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(
            chunks[0].token_ids.as_deref(),
            Some(&b"a chunk 0".map(u32::from)[..])
        );
        // Leased: nobody else gets it until the lease expires.
        std::thread::sleep(Duration::from_millis(5));
        let again = items(store.claim(&request("B")).unwrap());
        assert_eq!(
            ids(&again),
            ["a"],
            "an expired lease makes the work claimable"
        );
        assert!(matches!(
            store.claim(&request("C")).unwrap(),
            Claim::Idle {
                paused: false,
                next_due: None
            }
        ));
        // A's late results are still right (same inputs), but only B's lease completes it.
        let v = vectors_for(store.as_mut(), &again[0].key);
        assert_eq!(store.write_vectors(1, &v, &["a".into()]).unwrap(), 2);
        let status = store.status().unwrap();
        assert_eq!(status.stages["embed"].done, 1);
        assert_eq!(status.vector_sets[0].embedded, 2);
        assert_eq!(store.unembedded().unwrap(), (0, 0));
        let doc = store.document_lifecycle("a").unwrap().unwrap();
        let embed = doc.stages.iter().find(|s| s.stage == "embed").unwrap();
        assert_eq!(embed.attempts, 2);
        assert!(
            embed.errors[0].message.contains("lease of A expired"),
            "{:?}",
            embed.errors
        );
        // Token ids are dropped once every live set has the vector.
        let kept = ix.count(
            "SELECT COUNT(token_ids) FROM chunks",
            "SELECT count(*) FROM {s}.chunk_tokens",
        );
        assert_eq!(kept, 0);
    }
}

#[test]
fn a_vector_is_never_written_for_text_that_changed_meanwhile() {
    for ix in backends("a_vect_is_neve") {
        let (f, mut store) = deferred_index(&ix, &["a"], 1);
        let got = items(store.claim(&request("A")).unwrap());
        let stale = vectors_for(store.as_mut(), &got[0].key);
        // The document is edited while its embedding runs.
        let p = parent("a", "h2", 1);
        all_ok(
            f.connect()
                .unwrap()
                .write(&[p.clone(), deferred(&p, 0, "new text")]),
        );
        assert_eq!(store.write_vectors(1, &stale, &["a".into()]).unwrap(), 0);
        let status = store.status().unwrap();
        assert_eq!(
            status.stages["embed"].pending, 1,
            "fresh work for the new text"
        );
        assert_eq!(status.stages["embed"].done, 0);
        // The worker's lease is void: its failure report changes nothing.
        let s = store
            .fail(
                "A",
                &[(got[0].key.clone(), "late".into())],
                &StageSettings::default(),
            )
            .unwrap();
        assert_eq!(s, vec![Status::InProgress]);
        assert_eq!(store.status().unwrap().stages["embed"].pending, 1);
    }
}

#[test]
fn failures_back_off_then_go_dead_with_every_error_and_requeue_resets_attempts() {
    for ix in backends("fail_back_off_then") {
        let (_f, mut store) = deferred_index(&ix, &["a", "b"], 1);
        let settings = StageSettings {
            retry_limit: 3,
            backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(40),
            ..StageSettings::default()
        };
        let key = WorkKey {
            document_id: "a".into(),
            stage: EMBED.into(),
            vector_set: 1,
        };
        let mut req = request("W");
        req.max_items = 1;
        // A claim made while checking the back-off can take the item itself on a slow
        // machine (the back-off is 20 ms): that claim is then the next attempt's.
        let mut claimed: Option<Vec<WorkItem>> = None;
        for attempt in 1..=3u32 {
            let got = match claimed.take() {
                Some(got) => got,
                None => claim_until(store.as_mut(), &req, &key),
            };
            assert_eq!(got[0].attempts, attempt);
            let status = store
                .fail("W", &[(key.clone(), format!("boom {attempt}"))], &settings)
                .unwrap();
            let expected = if attempt < 3 {
                Status::Failed
            } else {
                Status::Dead
            };
            assert_eq!(status, vec![expected]);
            if attempt < 3 {
                // Backing off: not claimable at once, unless the back-off already ran out.
                match store.claim(&req).unwrap() {
                    Claim::Idle { next_due, .. } => {
                        assert!(next_due.is_some(), "the retry is waiting")
                    }
                    Claim::Items(i) if i[0].key == key => claimed = Some(i),
                    Claim::Items(i) => {
                        let v = vectors_for(store.as_mut(), &i[0].key);
                        store.write_vectors(1, &v, &["b".into()]).unwrap();
                    }
                }
            }
        }
        let dead = store.dead_letters(None).unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].document_id, "a");
        assert_eq!(dead[0].attempts, 3);
        assert_eq!(dead[0].last_error.as_deref(), Some("boom 3"));
        assert_eq!(
            embed_errors(store.as_mut(), "a"),
            ["boom 1", "boom 2", "boom 3"]
        );
        // Dead is not claimable (b, if it is still waiting, is embedded on the way).
        loop {
            match store.claim(&req).unwrap() {
                Claim::Items(i) => {
                    assert_ne!(i[0].key, key, "a dead item is not claimable");
                    let v = vectors_for(store.as_mut(), &i[0].key);
                    store.write_vectors(1, &v, &["b".into()]).unwrap();
                }
                Claim::Idle { next_due, .. } => break assert_eq!(next_due, None),
            }
        }
        assert_eq!(store.requeue(None, Some(&["other".into()])).unwrap(), 0);
        assert_eq!(store.requeue(Some("embed"), None).unwrap(), 1);
        let got = items(store.claim(&req).unwrap());
        assert_eq!(got[0].key, key);
        assert_eq!(got[0].attempts, 1, "attempts start again");
        assert_eq!(embed_errors(store.as_mut(), "a").len(), 3, "history kept");
    }
}

/// Claim one item at a time with `req` until the work of `key` comes up: the work of
/// document `b` met first is embedded, and a wait for a retry is slept out.
fn claim_until(store: &mut dyn IndexStore, req: &ClaimRequest, key: &WorkKey) -> Vec<WorkItem> {
    // Claim until `a` comes up (b may come first).
    loop {
        match store.claim(req).unwrap() {
            Claim::Items(i) if i[0].key == *key => break i,
            Claim::Items(i) => {
                let v = vectors_for(store, &i[0].key);
                store.write_vectors(1, &v, &["b".into()]).unwrap();
            }
            Claim::Idle { next_due, .. } => {
                let due = next_due.expect("a retry is waiting");
                assert!(due > crate::lifecycle::now_ms() - 1000);
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The messages of the errors the embed stage of document `id` recorded, oldest first.
fn embed_errors(store: &mut dyn IndexStore, id: &str) -> Vec<String> {
    let doc = store.document_lifecycle(id).unwrap().unwrap();
    doc.stages
        .iter()
        .find(|s| s.stage == "embed")
        .unwrap()
        .errors
        .iter()
        .map(|e| e.message.clone())
        .collect()
}

/// Work a broker carries (`enrich --queue`): a failed delivery keeps the work held by the
/// queue's owner (nobody else claims it while the broker retries), records the error with the
/// broker's attempt number and the worker that made it; the last one dead-letters it; a
/// failure reported by someone who does not hold the work is void.
#[test]
fn failed_deliveries_keep_the_work_held_then_dead_letter_it() {
    for ix in backends("failed_deliveries") {
        let (_f, mut store) = deferred_index(&ix, &["a", "b"], 1);
        let mut req = request("nats:q");
        req.max_items = 2;
        let got = items(store.claim(&req).unwrap());
        assert_eq!(ids(&got), ["a", "b"]);
        let key = got[0].key.clone();
        let failure = |attempt: u32, dead: bool| DeliveryFailure {
            key: key.clone(),
            attempt,
            message: format!("boom {attempt}"),
            dead,
            worker: format!("host:1:2:enrich-{attempt}"),
        };
        let lease = Duration::from_secs(600);
        for attempt in 1..=2 {
            let s = store
                .fail_deliveries("nats:q", &[failure(attempt, false)], lease)
                .unwrap();
            assert_eq!(s, vec![Status::Failed]);
            // Still the queue's: another worker finds nothing to claim.
            assert!(matches!(
                store.claim(&request("other")).unwrap(),
                Claim::Idle { .. }
            ));
        }
        // Not held by this owner: void, nothing recorded.
        assert_eq!(
            store
                .fail_deliveries("other", &[failure(9, true)], lease)
                .unwrap(),
            vec![Status::InProgress]
        );
        let s = store
            .fail_deliveries("nats:q", &[failure(3, true)], lease)
            .unwrap();
        assert_eq!(s, vec![Status::Dead]);
        let dead = store.dead_letters(None).unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].document_id, "a");
        assert_eq!(dead[0].attempts, 3, "the attempts the broker reported");
        let doc = store.document_lifecycle("a").unwrap().unwrap();
        let stage = doc.stages.iter().find(|s| s.stage == "embed").unwrap();
        let errors: Vec<(u32, &str, &str)> = stage
            .errors
            .iter()
            .map(|e| (e.attempt, e.message.as_str(), e.worker.as_str()))
            .collect();
        assert_eq!(
            errors,
            [
                (1, "boom 1", "host:1:2:enrich-1"),
                (2, "boom 2", "host:1:2:enrich-2"),
                (3, "boom 3", "host:1:2:enrich-3")
            ]
        );
        // `b` is untouched: still the queue's, completed by it.
        store.complete("nats:q", &[got[1].key.clone()]).unwrap();
        assert_eq!(store.requeue(Some("embed"), None).unwrap(), 1);
        let again = items(store.claim(&request("other")).unwrap());
        assert_eq!(ids(&again), ["a"]);
    }
}

#[test]
fn a_document_that_changes_while_dead_is_fresh_work_again() {
    for ix in backends("a_docu_that_chan") {
        let (f, mut store) = deferred_index(&ix, &["a"], 1);
        let settings = StageSettings {
            retry_limit: 1,
            ..StageSettings::default()
        };
        let got = items(store.claim(&request("W")).unwrap());
        store
            .fail("W", &[(got[0].key.clone(), "poison".into())], &settings)
            .unwrap();
        assert_eq!(store.status().unwrap().stages["embed"].dead, 1);
        // The same content written again stays dead...
        let p = parent("a", "h1", 1);
        all_ok(
            f.connect()
                .unwrap()
                .write(&[p.clone(), deferred(&p, 0, "a chunk 0")]),
        );
        assert_eq!(store.status().unwrap().stages["embed"].dead, 1);
        // ...new content is fresh work.
        let p = parent("a", "h2", 1);
        all_ok(
            f.connect()
                .unwrap()
                .write(&[p.clone(), deferred(&p, 0, "cured text")]),
        );
        let s = store.status().unwrap();
        assert_eq!((s.stages["embed"].dead, s.stages["embed"].pending), (0, 1));
        let got = items(store.claim(&request("W")).unwrap());
        assert_eq!(got[0].attempts, 1);
    }
}

#[test]
fn interactive_goes_before_fresh_before_backfill_each_fifo() {
    for ix in backends("inte_goes_befo_fres") {
        let (_f, mut store) = deferred_index(&ix, &["d1", "d2", "d3", "d4"], 1);
        assert_eq!(store.promote(&["d3".into(), "nope".into()]).unwrap(), 1);
        let mut req = request("W");
        req.max_items = 1;
        let mut order = Vec::new();
        let mut seqs = Vec::new();
        while let Claim::Items(got) = store.claim(&req).unwrap() {
            order.push(got[0].key.document_id.clone());
            seqs.push(got[0].claim_seq);
            assert_eq!(
                got[0].priority,
                if got[0].key.document_id == "d3" {
                    Priority::Interactive
                } else {
                    Priority::Fresh
                }
            );
        }
        assert_eq!(order, ["d3", "d1", "d2", "d4"]);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
}

#[test]
fn a_claim_takes_the_first_item_always_then_as_many_as_fit() {
    for ix in backends("a_clai_take_the") {
        let (_f, mut store) = deferred_index(&ix, &["x", "y", "z"], 2);
        let mut req = request("W");
        req.max_cost = 12; // each document: 2 chunks of 3 tokens
        assert_eq!(ids(&items(store.claim(&req).unwrap())), ["x", "y"]);
        req.max_cost = 1;
        assert_eq!(ids(&items(store.claim(&req).unwrap())), ["z"]);
    }
}

#[test]
fn a_paused_stage_hands_out_nothing_until_resumed() {
    for ix in backends("a_paus_stag_hand") {
        let (_f, mut store) = deferred_index(&ix, &["a"], 1);
        store.set_paused("embed", true).unwrap();
        assert_eq!(
            store.claim(&request("W")).unwrap(),
            Claim::Idle {
                paused: true,
                next_due: None
            }
        );
        assert!(store.status().unwrap().stages["embed"].paused);
        assert!(
            store.set_paused("chunk", true).is_err(),
            "only enrich stages pause"
        );
        store.set_paused("embed", false).unwrap();
        assert_eq!(ids(&items(store.claim(&request("W")).unwrap())), ["a"]);
    }
}

#[test]
fn the_leases_of_a_process_that_is_gone_are_taken_at_once() {
    for ix in backends("the_leas_of_a") {
        let (_f, mut store) = deferred_index(&ix, &["a"], 1);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().replace(':', "_"))
            .unwrap_or_else(|_| "localhost".into());
        let ghost = format!("{host}:{pid}:12345:enrich-0");
        let mut req = request(&ghost);
        req.lease = Duration::from_secs(3600);
        items(store.claim(&req).unwrap());
        assert!(matches!(
            store.claim(&request("W")).unwrap(),
            Claim::Idle { .. }
        ));
        if std::path::Path::new("/proc/self/stat").exists() {
            assert_eq!(store.reap_dead_owners().unwrap(), 1);
            let got = items(store.claim(&request("W")).unwrap());
            assert_eq!(got[0].attempts, 2, "the dead worker's attempt counts");
            let doc = store.document_lifecycle("a").unwrap().unwrap();
            let errors = &doc
                .stages
                .iter()
                .find(|s| s.stage == "embed")
                .unwrap()
                .errors;
            assert!(errors[0].message.contains("process ended"), "{errors:?}");
        }
    }
}

#[test]
fn an_edited_chunk_keeps_its_old_version_for_vector_search_until_the_new_one_is_embedded() {
    for ix in backends("an_edit_chun_keep") {
        let f = ix.open(identity("a", 4));
        let mut b = f.connect().unwrap();
        let p = parent("doc", "h1", 3);
        all_ok(b.write(&[
            p.clone(),
            chunk(&p, 0, "same text", unit(0, 4)),
            chunk(&p, 1, "old words", unit(1, 4)),
            chunk(&p, 2, "dropped later", unit(2, 4)),
        ]));
        // A deferred re-ingest: chunk 0 unchanged (its vector reused), chunk 1 new text without a
        // vector, chunk 2 gone.
        let p2 = parent("doc", "h2", 2);
        all_ok(b.write(&[
            p2.clone(),
            chunk(&p2, 0, "same text", unit(0, 4)),
            deferred(&p2, 1, "new words"),
        ]));
        let r = ix.reader();
        assert_eq!(
            r.counts().unwrap(),
            (1, 2, 1),
            "old versions are not counted"
        );
        assert!(
            r.keyword("old", 5).unwrap().is_empty(),
            "keyword search has the new text"
        );
        assert_eq!(r.keyword("new", 5).unwrap().len(), 1);
        // Vector search still finds the old versions, with their own text.
        let near = r.nearest(&unit(1, 4), 1).unwrap();
        let row = r.chunk(near[0].0).unwrap().unwrap();
        assert_eq!((row.text.as_str(), row.superseded), ("old words", true));
        let near = r.nearest(&unit(2, 4), 1).unwrap();
        assert_eq!(r.chunk(near[0].0).unwrap().unwrap().text, "dropped later");

        // The new chunk gets its vector: every old version goes, in that transaction.
        let mut store = ix.store();
        let got = items(store.claim(&request("W")).unwrap());
        let pending = store.pending_chunks(&got[0].key).unwrap();
        assert_eq!(pending.len(), 1);
        let v = vec![ChunkVector {
            rowid: pending[0].rowid,
            guard: pending[0].input_key,
            vector: unit(3, 4),
        }];
        assert_eq!(store.write_vectors(1, &v, &["doc".into()]).unwrap(), 1);
        let r = ix.reader();
        let near = r.nearest(&unit(1, 4), 5).unwrap();
        let texts: Vec<String> = near
            .iter()
            .map(|(id, _)| r.chunk(*id).unwrap().unwrap().text)
            .collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(
            texts.contains(&"new words".to_string()) && texts.contains(&"same text".to_string())
        );
        assert_eq!(store.status().unwrap().stages["embed"].done, 1);
    }
}

#[test]
fn a_backfill_fills_a_second_set_at_backfill_priority_and_switches_when_complete() {
    for ix in backends("a_back_fill_a") {
        let f = ix.open(identity("a", 4));
        let mut b = f.connect().unwrap();
        for d in ["d1", "d2"] {
            let p = parent(d, "h", 1);
            all_ok(b.write(&[p.clone(), chunk(&p, 0, &format!("{d} text"), unit(0, 4))]));
        }
        let mut store = ix.store();
        let new_model = model_b();
        let set = store.start_backfill(&new_model).unwrap();
        assert_eq!((set.id, set.dimension), (2, 3));
        assert_eq!(store.start_backfill(&new_model).unwrap().id, 2, "resumes");
        assert!(store
            .start_backfill(&identity("c", 4).model.unwrap())
            .is_err());
        // Nothing queued until the queue runs dry; then a page, from the watermark.
        assert!(matches!(
            store.claim(&request("W")).unwrap(),
            Claim::Idle { .. }
        ));
        assert_eq!(
            store.maintain().unwrap(),
            Maintenance::Queued {
                set: 2,
                documents: 2
            }
        );
        // A fresh document arriving meanwhile gets a vector in both sets, and goes first.
        let p = parent("d0", "h", 1);
        all_ok(b.write(&[p.clone(), chunk(&p, 0, "d0 text", unit(0, 4))]));
        let mut req = request("W");
        req.max_items = 1;
        let first = items(store.claim(&req).unwrap());
        assert_eq!(
            (first[0].key.document_id.as_str(), first[0].priority),
            ("d0", Priority::Fresh)
        );
        let status = store.status().unwrap();
        let bf = status.backfill.as_ref().unwrap();
        assert_eq!(bf.watermark.as_deref(), Some("d2"));
        assert!(bf.all_queued, "a short page is the last");
        assert_eq!(bf.chunks_total, 3);
        // Search still uses set 1 while set 2 fills.
        assert_eq!(ix.reader().meta().dimension, Some(4));
        let mut keys = vec![first[0].key.clone()];
        while let Claim::Items(got) = store.claim(&req).unwrap() {
            assert_eq!(got[0].priority, Priority::Backfill);
            keys.push(got[0].key.clone());
        }
        assert_eq!(keys.len(), 3);
        for key in &keys {
            embed_in_set_2(store.as_mut(), key);
        }
        assert_eq!(
            store.maintain().unwrap(),
            Maintenance::Switched {
                set: 2,
                model: "model-b".into()
            }
        );
        assert_searches_set_2(&ix, store.as_mut());
        assert_eq!(store.drop_retired().unwrap(), ["test-model"]);
        assert_eq!(store.sets().unwrap().len(), 1);
        // The index now takes the new model's runs, and refuses the old one's.
        assert!(ix.try_open(identity("a", 4)).is_err());
    }
}

/// The model a backfill moves the index to: fingerprint `b`, 3 dimensions.
fn model_b() -> ModelIdentity {
    ModelIdentity {
        name: "model-b".into(),
        dir: "/nowhere".into(),
        fingerprint: "b".into(),
        dimension: 3,
        tokenizer: Some("tok".into()),
    }
}

/// Write the vector [0, 1, 0] of set 2 for each chunk of `key`'s work.
fn embed_in_set_2(store: &mut dyn IndexStore, key: &WorkKey) {
    let v: Vec<ChunkVector> = store
        .pending_chunks(key)
        .unwrap()
        .into_iter()
        .map(|c| ChunkVector {
            rowid: c.rowid,
            guard: c.input_key,
            vector: vec![0.0, 1.0, 0.0],
        })
        .collect();
    store
        .write_vectors(2, &v, std::slice::from_ref(&key.document_id))
        .unwrap();
}

/// After the switch: search uses set 2 (model-b, 3 dimensions, every chunk), and both sets
/// hold all three vectors with only set 2 active.
fn assert_searches_set_2(ix: &TestIndex, store: &mut dyn IndexStore) {
    let r = ix.reader();
    assert_eq!(r.meta().dimension, Some(3));
    assert_eq!(r.meta().model.as_deref(), Some("model-b"));
    assert_eq!(r.nearest(&[0.0, 1.0, 0.0], 5).unwrap().len(), 3);
    let status = store.status().unwrap();
    assert!(status.backfill.is_none());
    assert_eq!(
        status
            .vector_sets
            .iter()
            .map(|s| (s.id, s.active, s.embedded))
            .collect::<Vec<_>>(),
        [(1, false, 3), (2, true, 3)]
    );
}

#[test]
fn pruning_a_document_removes_its_queue_entries() {
    for ix in backends("prun_a_docu_remo") {
        let (f, mut store) = deferred_index(&ix, &["a", "b"], 1);
        assert_eq!(store.status().unwrap().stages["embed"].pending, 2);
        f.delete_documents(&["a".into()]).unwrap();
        let s = store.status().unwrap();
        assert_eq!(
            (s.documents, s.chunks, s.stages["embed"].pending),
            (1, 1, 1)
        );
        assert!(store.document_lifecycle("a").unwrap().is_none());
    }
}

#[test]
fn concurrent_claims_never_hand_out_one_item_twice() {
    for ix in backends("concurrent") {
        let docs: Vec<String> = (0..120).map(|i| format!("d{i:03}")).collect();
        let names: Vec<&str> = docs.iter().map(String::as_str).collect();
        let (_f, _store) = deferred_index(&ix, &names, 1);
        let claimed = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for w in 0..4 {
                let (ix, claimed) = (&ix, &claimed);
                scope.spawn(move || {
                    let mut store = ix.store();
                    let owner = format!("worker-{w}");
                    let mut req = request(&owner);
                    req.max_items = 3;
                    loop {
                        match store.claim(&req).unwrap() {
                            Claim::Items(got) => {
                                let keys: Vec<WorkKey> =
                                    got.iter().map(|i| i.key.clone()).collect();
                                store.complete(&owner, &keys).unwrap();
                                claimed.lock().unwrap().extend(
                                    got.into_iter().map(|i| (i.key.document_id, owner.clone())),
                                );
                            }
                            Claim::Idle {
                                next_due: Some(_), ..
                            } => std::thread::sleep(Duration::from_millis(5)),
                            Claim::Idle { next_due: None, .. } => break,
                        }
                    }
                });
            }
        });
        let claimed = claimed.into_inner().unwrap();
        let mut ids: Vec<&str> = claimed.iter().map(|c| c.0.as_str()).collect();
        ids.sort_unstable();
        let before = ids.len();
        ids.dedup();
        assert_eq!(
            before,
            ids.len(),
            "{}: an item was claimed twice",
            ix.name()
        );
        assert_eq!(ids.len(), docs.len(), "{}: every item claimed", ix.name());
        let workers: std::collections::HashSet<&str> =
            claimed.iter().map(|c| c.1.as_str()).collect();
        eprintln!("{}: {} workers took part", ix.name(), workers.len());
        assert_eq!(ix.store().status().unwrap().stages["embed"].done, 120);
    }
}

/// A worker limited to some vector sets finds their work even when more of another set's
/// work ranks first (SQLite once read a page of candidates, then dropped the other sets'
/// rows from it, and found nothing).
#[test]
fn a_claim_limited_to_a_vector_set_finds_its_work_behind_another_sets() {
    for ix in backends("a_clai_limi_to_a_vect") {
        let (_f, mut store) = deferred_index(&ix, &["a1", "a2", "a3", "a4", "a5"], 1);
        let new_model = ModelIdentity {
            name: "model-b".into(),
            dir: "/nowhere".into(),
            fingerprint: "b".into(),
            dimension: 3,
            tokenizer: Some("tok".into()),
        };
        let set = store.start_backfill(&new_model).unwrap();
        assert!(matches!(
            store.maintain().unwrap(),
            Maintenance::Queued { documents: 5, .. }
        ));
        let mut req = request("W");
        req.max_items = 2;
        req.vector_sets = vec![set.id];
        let got = items(store.claim(&req).unwrap());
        assert_eq!(got.len(), 2, "{}", ix.name());
        assert!(got.iter().all(|i| i.key.vector_set == set.id));
        assert!(got.iter().all(|i| i.priority == Priority::Backfill));
        // The active set's work, ranked first, is still there for the others.
        req.vector_sets = vec![1];
        let got = items(store.claim(&req).unwrap());
        assert_eq!(
            (got.len(), got[0].key.vector_set, got[0].priority),
            (2, 1, Priority::Fresh)
        );
    }
}

/// What a run could not get into the index is buried with its error and a copy: the
/// dead-letter queue and `dlq show` list it on every backend, its copies come back sorted, a
/// requeue by id takes only those named, and unburying forgets the copies.
#[test]
fn buried_documents_are_listed_requeued_by_id_and_unburied() {
    for ix in backends("buried_list_requ") {
        let (_f, mut store) = deferred_index(&ix, &["a"], 1);
        let burial = |id: &str, copy: bool| crate::indexers::Burial {
            document_id: id.into(),
            stage: "chunk".into(),
            attempts: 5,
            worker: "W".into(),
            error: format!("{id} cannot be read"),
            copy: copy.then(|| crate::indexers::StoredCopy {
                document_id: id.into(),
                payload: Some(vec![1, 2, 3]),
                source: Some(format!("docs/{id}.md")),
                config: None,
            }),
        };
        store
            .bury(&[burial("z", true), burial("y", true), burial("x", false)])
            .unwrap();
        let dead = store.dead_letters(Some("chunk")).unwrap();
        let mut listed: Vec<(&str, u32, Option<&str>)> = dead
            .iter()
            .map(|d| (d.document_id.as_str(), d.attempts, d.last_error.as_deref()))
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [
                ("x", 5, Some("x cannot be read")),
                ("y", 5, Some("y cannot be read")),
                ("z", 5, Some("z cannot be read"))
            ],
            "{}",
            ix.name()
        );
        assert!(store.dead_letters(Some("embed")).unwrap().is_empty());
        // Never in the index: its lifecycle comes from its burial.
        let z = store.document_lifecycle("z").unwrap().unwrap();
        assert_eq!(z.source.as_deref(), Some("docs/z.md"));
        assert_eq!((z.chunks, z.stages.len()), (0, 1));
        assert_eq!(z.stages[0].errors[0].message, "z cannot be read");
        assert!(store.document_lifecycle("nobody").unwrap().is_none());
        let ids = |c: Vec<crate::indexers::StoredCopy>| -> Vec<String> {
            c.into_iter().map(|c| c.document_id).collect()
        };
        let all: Vec<String> = ["z", "x", "y", "w"].map(String::from).into();
        assert_eq!(
            ids(store.buried(&all).unwrap()),
            ["y", "z"],
            "{}",
            ix.name()
        );
        // Burying again replaces the row and the copy.
        store.bury(&[burial("z", true)]).unwrap();
        assert_eq!(store.dead_letters(None).unwrap().len(), 3);
        assert_eq!(
            store
                .requeue(None, Some(&["y".into(), "x".into()]))
                .unwrap(),
            2
        );
        let left: Vec<String> = store
            .dead_letters(None)
            .unwrap()
            .into_iter()
            .map(|d| d.document_id)
            .collect();
        assert_eq!(left, ["z"], "{}", ix.name());
        let y = store.document_lifecycle("y").unwrap().unwrap();
        assert_eq!(
            (y.stages[0].status.as_str(), y.stages[0].attempts),
            ("pending", 0)
        );
        store.unbury(&["y".into(), "z".into()]).unwrap();
        assert!(store.buried(&all).unwrap().is_empty());
    }
}
