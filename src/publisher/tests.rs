//! Run completion under any interleaving of events: the heart of the engine.

use proptest::prelude::*;

use super::tracker::{Applied, Counts, RunTracker};
use crate::document::{child_instance, RunId};
use crate::event::{Event, EventKind};

const RUN: RunId = RunId(7);

/// A document of the generated forest: its terminal outcome and its children.
#[derive(Clone, Debug)]
struct Node {
    id: String,
    outcome: u8, // 0 finish, 1 fail, 2 drop
    children: Vec<Node>,
}

fn node(depth: u32) -> BoxedStrategy<Node> {
    // Few distinct ids, so duplicate ids are common among roots and among siblings.
    let leaf = (0u8..3, 0u8..3).prop_map(|(id, outcome)| Node {
        id: format!("d{id}"),
        outcome,
        children: vec![],
    });
    if depth == 0 {
        return leaf.boxed();
    }
    (0u8..3, 0u8..3, prop::collection::vec(node(depth - 1), 0..3))
        .prop_map(|(id, outcome, children)| Node {
            id: format!("d{id}"),
            outcome,
            children,
        })
        .boxed()
}

#[derive(Clone, Debug)]
enum Action {
    Publish(usize),
    /// An event of root `usize`'s subtree, built once root instances are known.
    Event(usize, EventSpec),
    OtherRun,
    Stop,
}

#[derive(Clone, Debug)]
struct EventSpec {
    /// Path of child ordinals from the root.
    path: Vec<usize>,
    create: bool,
}

fn kind(outcome: u8) -> EventKind {
    match outcome {
        0 => EventKind::Finish { unchanged: false },
        1 => EventKind::Fail {
            stage: "s".into(),
            reason: "r".into(),
        },
        _ => EventKind::Drop {
            stage: "s".into(),
            reason: "r".into(),
        },
    }
}

fn collect(root: usize, n: &Node, path: Vec<usize>, out: &mut Vec<Action>) {
    if !path.is_empty() {
        out.push(Action::Event(
            root,
            EventSpec {
                path: path.clone(),
                create: true,
            },
        ));
    }
    out.push(Action::Event(
        root,
        EventSpec {
            path: path.clone(),
            create: false,
        },
    ));
    for (i, c) in n.children.iter().enumerate() {
        let mut p = path.clone();
        p.push(i);
        collect(root, c, p, out);
    }
}

fn expected_counts(roots: &[Node]) -> Counts {
    fn walk(n: &Node, child: bool, c: &mut Counts) {
        match (child, n.outcome) {
            (false, 0) => c.indexed += 1,
            (false, 1) => c.failed += 1,
            (false, _) => c.dropped += 1,
            (true, 0) => c.children_indexed += 1,
            (true, 1) => c.children_failed += 1,
            (true, _) => c.children_dropped += 1,
        }
        if child {
            c.children_created += 1;
        }
        for k in &n.children {
            walk(k, true, c);
        }
    }
    let mut c = Counts {
        published: roots.len() as u64,
        ..Counts::default()
    };
    for r in roots {
        walk(r, false, &mut c);
    }
    c
}

/// Build the event for `spec` once the root's instance is known.
fn build(root: &Node, root_instance: u64, spec: &EventSpec) -> Event {
    let (mut n, mut instance, mut parent) = (root, root_instance, None);
    for &i in &spec.path {
        let child = &n.children[i];
        parent = Some((instance, n.id.clone()));
        // Sibling ids repeat in this generator, so the ordinal goes into the child's id, as
        // the chunker does ("parent#3").
        instance = child_instance(instance, &format!("{}#{i}", child.id));
        n = child;
    }
    Event {
        run_id: RUN,
        instance,
        doc_id: n.id.clone(),
        parent_instance: parent.as_ref().map(|p| p.0),
        parent_id: parent.map(|p| p.1),
        children: if spec.create {
            0
        } else {
            n.children.len() as u32
        },
        kind: if spec.create {
            EventKind::Create
        } else {
            kind(n.outcome)
        },
        redelivered: false,
        tokens: 0,
    }
}

fn scenario() -> impl Strategy<Value = (Vec<Node>, Vec<Action>, Vec<(usize, prop::sample::Index)>)>
{
    prop::collection::vec(node(2), 0..5).prop_flat_map(|roots| {
        let mut actions = Vec::new();
        for (r, n) in roots.iter().enumerate() {
            actions.push(Action::Publish(r));
            collect(r, n, vec![], &mut actions);
        }
        actions.push(Action::OtherRun);
        actions.push(Action::OtherRun);
        let len = actions.len();
        (
            Just(roots),
            Just(actions).prop_shuffle(),
            // Events to deliver a second time (at-least-once delivery), and where the copy
            // arrives: anywhere after the original, before or after completion.
            prop::collection::vec((0..len, any::<prop::sample::Index>()), 0..4),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Completion is reported exactly when the last publish, event and connector stop have
    /// all been seen: never early (the event queue is taken as empty at every step, the worst
    /// case), never late, and the counts are exact, duplicates delivered or not.
    #[test]
    fn completes_exactly_when_everything_is_accounted_for(
        (roots, mut actions, dups) in scenario()
    ) {
        // The connector stops after its last publish, at any point after it.
        let last_publish = actions.iter().rposition(|a| matches!(a, Action::Publish(_)));
        let stop_at = last_publish.map_or(0, |p| p + 1);
        actions.insert(stop_at, Action::Stop);
        // A redelivered event arrives again anywhere after its first delivery.
        let mut seq: Vec<(Action, bool)> = actions.into_iter().map(|a| (a, false)).collect();
        for (d, at) in dups {
            if let Some((a @ Action::Event(..), false)) = seq.get(d).cloned() {
                let p = d + 1 + at.index(seq.len() - d);
                seq.insert(p, (a, true));
            }
        }

        let mut tracker = RunTracker::new(RUN);
        let mut instances = vec![0u64; roots.len()];
        // Instances are numbered in publish order; events of a root may come before it.
        let mut next = 1;
        for (a, _) in &seq {
            if let Action::Publish(r) = a {
                instances[*r] = next;
                next += 1;
            }
        }
        // Events of other runs change nothing: completion comes with the last action that
        // is not one of them.
        let last_relevant = seq
            .iter()
            .rposition(|(a, dup)| !dup && !matches!(a, Action::OtherRun))
            .expect("the connector stop is always there");
        for (step, (a, dup)) in seq.iter().enumerate() {
            match a {
                Action::Publish(r) => {
                    let got = tracker.publish();
                    prop_assert_eq!(got, instances[*r]);
                }
                Action::Event(r, spec) => {
                    let ev = build(&roots[*r], instances[*r], spec);
                    let applied = tracker.apply(&ev);
                    prop_assert_eq!(applied, if *dup { Applied::Duplicate } else { Applied::Counted });
                }
                Action::OtherRun => {
                    let ev = Event {
                        run_id: RunId(99),
                        instance: 1,
                        doc_id: "d0".into(),
                        parent_instance: None,
                        parent_id: None,
                        children: 0,
                        kind: EventKind::Finish { unchanged: false },
                        redelivered: false,
                        tokens: 0,
                    };
                    prop_assert_eq!(tracker.apply(&ev), Applied::OtherRun);
                }
                Action::Stop => tracker.connector_stopped(),
            }
            let everything_seen = step >= last_relevant;
            prop_assert_eq!(
                tracker.is_complete(true),
                everything_seen,
                "step {} of {} ({:?}): pending {}",
                step, seq.len(), a, tracker.pending()
            );
            // A non-empty event queue always holds completion back.
            prop_assert!(!tracker.is_complete(false));
        }
        prop_assert_eq!(tracker.counts(), &expected_counts(&roots));
        prop_assert_eq!(tracker.pending(), 0);
    }
}

#[test]
fn same_id_published_twice_needs_two_terminal_events() {
    let mut t = RunTracker::new(RUN);
    let a = t.publish();
    let b = t.publish();
    t.connector_stopped();
    let finish = |instance| Event {
        run_id: RUN,
        instance,
        doc_id: "same".into(),
        parent_instance: None,
        parent_id: None,
        children: 0,
        kind: EventKind::Finish { unchanged: false },
        redelivered: false,
        tokens: 0,
    };
    assert_eq!(t.apply(&finish(a)), Applied::Counted);
    assert!(!t.is_complete(true));
    assert_eq!(t.apply(&finish(a)), Applied::Duplicate);
    assert!(
        !t.is_complete(true),
        "a redelivered event must not stand in for the other instance"
    );
    assert_eq!(t.apply(&finish(b)), Applied::Counted);
    assert!(t.is_complete(true));
    assert_eq!(t.counts().indexed, 2);
}

#[test]
fn parent_finishing_before_its_children_are_created_holds_completion() {
    let mut t = RunTracker::new(RUN);
    let p = t.publish();
    t.connector_stopped();
    let c = child_instance(p, "p#0");
    t.apply(&Event {
        run_id: RUN,
        instance: p,
        doc_id: "p".into(),
        parent_instance: None,
        parent_id: None,
        children: 1,
        kind: EventKind::Finish { unchanged: false },
        redelivered: false,
        tokens: 0,
    });
    assert!(
        !t.is_complete(true),
        "one child announced and not yet created"
    );
    let child = |kind| Event {
        run_id: RUN,
        instance: c,
        doc_id: "p#0".into(),
        parent_instance: Some(p),
        parent_id: Some("p".into()),
        children: 0,
        kind,
        redelivered: false,
        tokens: 0,
    };
    t.apply(&child(EventKind::Create));
    assert!(!t.is_complete(true));
    assert_eq!(t.pending(), 1);
    t.apply(&child(EventKind::Drop {
        stage: "filter".into(),
        reason: "too short".into(),
    }));
    assert!(t.is_complete(true));
    assert_eq!(t.counts().children_dropped, 1);
    assert_eq!(t.drops()[0].reason, "too short");
}
