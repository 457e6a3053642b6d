//! The lifecycle's rules, written once for every backend: how a claim picks and leases work
//! (paused stages, priority, the cost budget, dead-lettering what was claimed too often), how
//! a failed attempt backs off or goes dead, how a failed broker delivery is recorded, how the
//! leases of dead processes are reaped, and how a stage's rows are counted for `status`.
//!
//! A backend runs a rule inside one of its write transactions, through [`QueueSql`]: the
//! statements alone (SQLite's `?1` and Postgres' `$1`, `FOR UPDATE SKIP LOCKED` or a file
//! lock), never a decision.

use super::backoff::{jitter_unit, retry_delay};
use super::owner::is_dead_here;
use super::report::StageCounts;
use super::store::{Claim, ClaimRequest, DeliveryFailure, WorkItem, WorkKey};
use super::{Priority, StageSettings, Status, EMBED};

/// A claimable row, as [`QueueSql::candidates`] reads it.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The row's id in the backend's `enrichment` table.
    pub id: i64,
    pub key: WorkKey,
    /// Attempts made so far.
    pub attempts: u32,
    /// The priority's level ([`Priority::from_level`]).
    pub priority: i64,
    /// Queue order within a priority.
    pub seq: i64,
    pub input_version: String,
    pub cost: u64,
    /// Set when the row's lease expired: whose it was.
    pub expired_owner: Option<String>,
}

/// The statements of the work queue, run in the transaction a backend opened for a rule.
/// Rows are the backend's `enrichment` rows, named by their id.
pub trait QueueSql {
    type Error;

    /// Whether a claim must lock the rows it takes: the backend's transactions run side by
    /// side (Postgres), so the rows chosen by a first read without locks are read again with
    /// `lock`, skipping those another claim holds. False where a write transaction excludes
    /// every other (SQLite): the first read is the claim.
    const ROW_LOCKS: bool;

    /// The stages an operator paused.
    fn paused_stages(&mut self) -> Result<Vec<String>, Self::Error>;

    /// Claimable rows of `stage`, best first (priority, then queue order), at most `limit`:
    /// pending, or failed and due at `now`, or in progress with an expired lease; of the
    /// vector sets `sets` (all when empty); whose document's `chunk` stage is done for the
    /// version the row is for. With `lock`, locked by this transaction, skipping rows
    /// another holds.
    fn candidates(
        &mut self,
        stage: &str,
        now: i64,
        sets: &[i64],
        limit: usize,
        lock: bool,
    ) -> Result<Vec<Candidate>, Self::Error>;

    /// When the first failed row waiting out its backoff becomes due, if any.
    fn next_due(&mut self, now: i64) -> Result<Option<i64>, Self::Error>;

    /// Whether a paused stage has work waiting.
    fn paused_with_work(&mut self) -> Result<bool, Self::Error>;

    /// `n` claim numbers, increasing (the order claims were made in).
    fn claim_seqs(&mut self, n: usize) -> Result<Vec<i64>, Self::Error>;

    /// Lease the rows `(id, claim number)` to `owner` until `expires`, counting an attempt.
    fn lease(
        &mut self,
        rows: &[(i64, i64)],
        owner: &str,
        expires: i64,
        now: i64,
    ) -> Result<(), Self::Error>;

    /// The row of `key` if `owner` holds its lease, locked: (id, attempts).
    fn held(&mut self, owner: &str, key: &WorkKey) -> Result<Option<(i64, u32)>, Self::Error>;

    /// Keep an attempt's error with the time and the worker that made it.
    fn record_error(
        &mut self,
        key: &WorkKey,
        attempt: u32,
        worker: &str,
        message: &str,
        now: i64,
    ) -> Result<(), Self::Error>;

    /// Move a row to the dead-letter queue (its lease dropped).
    fn set_dead(&mut self, id: i64, now: i64) -> Result<(), Self::Error>;

    /// Mark a row failed, due again at `not_before` (its lease dropped).
    fn set_failed(&mut self, id: i64, not_before: i64, now: i64) -> Result<(), Self::Error>;

    /// Record a failed broker delivery of a held row: its attempts at least `attempt`, its
    /// lease extended to `lease_expires`.
    fn note_delivery(
        &mut self,
        id: i64,
        attempt: u32,
        lease_expires: i64,
        now: i64,
    ) -> Result<(), Self::Error>;

    /// Who holds leases now.
    fn lease_owners(&mut self) -> Result<Vec<String>, Self::Error>;

    /// The rows `owner` holds under a lease, locked: (id, key, attempts).
    fn leases_of(&mut self, owner: &str) -> Result<Vec<(i64, WorkKey, u32)>, Self::Error>;
}

/// One claim transaction (the store retries an empty one: [`super::store::claim_with_retries`]).
/// The best candidates of the stages asked for (an unpaused stage's first row of the highest
/// priority, oldest first, wins), then as many of that stage and vector set as the cost and
/// item budgets allow (the first whatever its cost); a row claimed `retry_limit` times
/// already goes dead instead, and an expired lease's error is recorded against its holder.
pub fn claim<Q: QueueSql>(q: &mut Q, req: &ClaimRequest, now: i64) -> Result<Claim, Q::Error> {
    let wanted: Vec<String> = if req.stages.is_empty() {
        vec![EMBED.to_string()]
    } else {
        req.stages.clone()
    };
    let paused = q.paused_stages()?;
    let mut best: Vec<Candidate> = Vec::new();
    let mut any_paused = false;
    for stage in &wanted {
        if paused.contains(stage) {
            any_paused = true;
            continue;
        }
        let rows = q.candidates(stage, now, &req.vector_sets, req.max_items.max(1), false)?;
        let better = match (best.first(), rows.first()) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(b), Some(r)) => (r.priority, -r.seq) > (b.priority, -b.seq),
        };
        if better {
            best = rows;
        }
    }
    let Some(first) = best.first() else {
        let next_due = q.next_due(now)?;
        let paused = any_paused && q.paused_with_work()?;
        return Ok(Claim::Idle { paused, next_due });
    };
    let group = (first.key.stage.clone(), first.key.vector_set);
    let mut picked = pick(best, &group, req);
    if Q::ROW_LOCKS {
        // Lock what a claim of this size takes, skipping rows another claim is taking right
        // now (read without locks above, so that a claim locks no more than it takes and a
        // second worker finds the rest).
        let locked = q.candidates(&group.0, now, &[group.1], picked.len(), true)?;
        picked = pick(locked, &group, req);
    }
    let mut claimed = Vec::with_capacity(picked.len());
    for c in picked {
        if let Some(holder) = &c.expired_owner {
            let message =
                format!("lease of {holder} expired before it finished (worker killed or stalled)");
            q.record_error(&c.key, c.attempts, holder, &message, now)?;
        }
        if c.attempts >= req.retry_limit {
            // It was claimed as often as the stage allows and never finished.
            q.set_dead(c.id, now)?;
            continue;
        }
        claimed.push(c);
    }
    if claimed.is_empty() {
        return Ok(Claim::Items(Vec::new()));
    }
    let seqs = q.claim_seqs(claimed.len())?;
    let rows: Vec<(i64, i64)> = claimed.iter().map(|c| c.id).zip(seqs).collect();
    q.lease(&rows, &req.owner, now + req.lease.as_millis() as i64, now)?;
    Ok(Claim::Items(
        claimed
            .into_iter()
            .zip(rows)
            .map(|(c, (_, claim_seq))| WorkItem {
                key: c.key,
                attempts: c.attempts + 1,
                priority: Priority::from_level(c.priority),
                input_version: c.input_version,
                claim_seq,
                cost: c.cost,
            })
            .collect(),
    ))
}

/// The first candidates of `group` that fit a claim: the first whatever its cost, then as many
/// as `max_cost` and `max_items` allow.
fn pick(rows: Vec<Candidate>, group: &(String, i64), req: &ClaimRequest) -> Vec<Candidate> {
    let mut picked: Vec<Candidate> = Vec::new();
    let mut cost = 0u64;
    for c in rows {
        if (&c.key.stage, c.key.vector_set) != (&group.0, group.1) {
            continue;
        }
        if !picked.is_empty() && cost + c.cost > req.max_cost {
            break;
        }
        cost += c.cost;
        picked.push(c);
        if picked.len() >= req.max_items {
            break;
        }
    }
    picked
}

/// A failed attempt at each item `owner` holds: the error kept, then `failed` with a backoff
/// (exponential, jittered by document), or `dead` once the stage's retry limit is reached.
/// Work whose lease was lost is left alone (`InProgress`: the attempt's result is void, and
/// so is its failure).
pub fn fail<Q: QueueSql>(
    q: &mut Q,
    owner: &str,
    failures: &[(WorkKey, String)],
    settings: &StageSettings,
    now: i64,
) -> Result<Vec<Status>, Q::Error> {
    let mut out = Vec::with_capacity(failures.len());
    for (key, message) in failures {
        let Some((id, attempts)) = q.held(owner, key)? else {
            out.push(Status::InProgress);
            continue;
        };
        q.record_error(key, attempts, owner, message, now)?;
        if attempts >= settings.retry_limit {
            q.set_dead(id, now)?;
            out.push(Status::Dead);
        } else {
            let wait = retry_delay(
                attempts,
                settings.backoff,
                settings.max_backoff,
                jitter_unit(&key.document_id),
            );
            q.set_failed(id, now + wait.as_millis() as i64, now)?;
            out.push(Status::Failed);
        }
    }
    Ok(out)
}

/// Failed deliveries of work a broker carries: the error kept with the broker's attempt, the
/// work still held (its lease extended by `lease_ms`) while the broker retries, or dead when
/// the broker gives up. Work `owner` no longer holds is left alone (`InProgress`).
pub fn fail_deliveries<Q: QueueSql>(
    q: &mut Q,
    owner: &str,
    failures: &[DeliveryFailure],
    lease_ms: i64,
    now: i64,
) -> Result<Vec<Status>, Q::Error> {
    let mut out = Vec::with_capacity(failures.len());
    for f in failures {
        let Some((id, _)) = q.held(owner, &f.key)? else {
            out.push(Status::InProgress);
            continue;
        };
        q.record_error(&f.key, f.attempt, &f.worker, &f.message, now)?;
        q.note_delivery(id, f.attempt, now + lease_ms, now)?;
        if f.dead {
            q.set_dead(id, now)?;
            out.push(Status::Dead);
        } else {
            out.push(Status::Failed);
        }
    }
    Ok(out)
}

/// The lease owners that are processes of this host which have ended (their leases can be
/// freed at once: [`reap`]).
pub fn dead_owners<Q: QueueSql>(q: &mut Q) -> Result<Vec<String>, Q::Error> {
    let owners = q.lease_owners()?;
    Ok(owners.into_iter().filter(|o| is_dead_here(o)).collect())
}

/// Free at once the leases of `dead` owners: each item's error recorded against its owner,
/// then failed and due now, the attempt counted (a document that kills its worker every time
/// still ends in the dead-letter queue). Returns how many leases were freed.
pub fn reap<Q: QueueSql>(q: &mut Q, dead: &[String], now: i64) -> Result<usize, Q::Error> {
    let mut n = 0;
    for owner in dead {
        for (id, key, attempts) in q.leases_of(owner)? {
            q.record_error(
                &key,
                attempts,
                owner,
                "the worker's process ended before it finished (killed or crashed)",
                now,
            )?;
            q.set_failed(id, 0, now)?;
            n += 1;
        }
    }
    Ok(n)
}

/// One group of a stage's rows, as a backend counts them: status, whether an in-progress
/// row's lease expired, how many, the oldest enqueue time (ms since the epoch).
pub type StatusGroup = (String, bool, i64, Option<i64>);

/// A stage's counts for `status` from its rows grouped by status: work whose lease expired
/// counts as pending, and the oldest pending or failed item's age is kept.
pub fn stage_counts(
    groups: impl IntoIterator<Item = StatusGroup>,
    paused: bool,
    now: i64,
) -> StageCounts {
    let mut counts = StageCounts {
        paused,
        ..StageCounts::default()
    };
    let mut oldest: Option<i64> = None;
    for (status, expired, n, first) in groups {
        let n = n.max(0) as u64;
        match (status.as_str(), expired) {
            ("in_progress", false) => counts.in_progress += n,
            ("pending", _) | ("in_progress", true) => counts.pending += n,
            ("failed", _) => counts.failed += n,
            ("dead", _) => counts.dead += n,
            _ => counts.done += n,
        }
        if matches!(status.as_str(), "pending" | "failed") || expired {
            oldest = match (oldest, first) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    counts.oldest_pending_secs = oldest.map(|t| (now - t).max(0) as f64 / 1000.0);
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// The queue as plain memory: enough to check the rules' decisions apart from any SQL.
    #[derive(Default)]
    struct Memory {
        rows: BTreeMap<i64, Row>,
        paused: Vec<String>,
        errors: Vec<(WorkKey, u32, String, String)>,
        seq: i64,
        locks: bool,
    }

    #[derive(Clone, Debug)]
    struct Row {
        key: WorkKey,
        status: &'static str,
        attempts: u32,
        priority: i64,
        cost: u64,
        owner: Option<String>,
        not_before: i64,
        lease_expires: i64,
    }

    impl QueueSql for Memory {
        type Error = std::convert::Infallible;
        const ROW_LOCKS: bool = false;

        fn paused_stages(&mut self) -> Result<Vec<String>, Self::Error> {
            Ok(self.paused.clone())
        }

        fn candidates(
            &mut self,
            stage: &str,
            now: i64,
            sets: &[i64],
            limit: usize,
            lock: bool,
        ) -> Result<Vec<Candidate>, Self::Error> {
            self.locks |= lock;
            let mut c: Vec<Candidate> = self
                .rows
                .iter()
                .filter(|(_, r)| r.key.stage == stage)
                .filter(|(_, r)| sets.is_empty() || sets.contains(&r.key.vector_set))
                .filter(|(_, r)| match r.status {
                    "pending" => true,
                    "failed" => r.not_before <= now,
                    "in_progress" => r.lease_expires < now,
                    _ => false,
                })
                .map(|(&id, r)| Candidate {
                    id,
                    key: r.key.clone(),
                    attempts: r.attempts,
                    priority: r.priority,
                    seq: id,
                    input_version: "v".into(),
                    cost: r.cost,
                    expired_owner: (r.status == "in_progress").then(|| r.owner.clone().unwrap()),
                })
                .collect();
            c.sort_by_key(|c| (-c.priority, c.seq));
            c.truncate(limit);
            Ok(c)
        }

        fn next_due(&mut self, now: i64) -> Result<Option<i64>, Self::Error> {
            Ok(self
                .rows
                .values()
                .filter(|r| r.status == "failed" && r.not_before > now)
                .map(|r| r.not_before)
                .min())
        }

        fn paused_with_work(&mut self) -> Result<bool, Self::Error> {
            Ok(self.rows.values().any(|r| {
                self.paused.contains(&r.key.stage)
                    && matches!(r.status, "pending" | "failed" | "in_progress")
            }))
        }

        fn claim_seqs(&mut self, n: usize) -> Result<Vec<i64>, Self::Error> {
            let first = self.seq + 1;
            self.seq += n as i64;
            Ok((first..=self.seq).collect())
        }

        fn lease(
            &mut self,
            rows: &[(i64, i64)],
            owner: &str,
            expires: i64,
            _now: i64,
        ) -> Result<(), Self::Error> {
            for (id, _) in rows {
                let r = self.rows.get_mut(id).unwrap();
                r.status = "in_progress";
                r.attempts += 1;
                r.owner = Some(owner.into());
                r.lease_expires = expires;
            }
            Ok(())
        }

        fn held(&mut self, owner: &str, key: &WorkKey) -> Result<Option<(i64, u32)>, Self::Error> {
            Ok(self
                .rows
                .iter()
                .find(|(_, r)| {
                    &r.key == key && r.status == "in_progress" && r.owner.as_deref() == Some(owner)
                })
                .map(|(&id, r)| (id, r.attempts)))
        }

        fn record_error(
            &mut self,
            key: &WorkKey,
            attempt: u32,
            worker: &str,
            message: &str,
            _now: i64,
        ) -> Result<(), Self::Error> {
            self.errors
                .push((key.clone(), attempt, worker.into(), message.into()));
            Ok(())
        }

        fn set_dead(&mut self, id: i64, _now: i64) -> Result<(), Self::Error> {
            let r = self.rows.get_mut(&id).unwrap();
            r.status = "dead";
            r.owner = None;
            Ok(())
        }

        fn set_failed(&mut self, id: i64, not_before: i64, _now: i64) -> Result<(), Self::Error> {
            let r = self.rows.get_mut(&id).unwrap();
            r.status = "failed";
            r.owner = None;
            r.not_before = not_before;
            Ok(())
        }

        fn note_delivery(
            &mut self,
            id: i64,
            attempt: u32,
            lease_expires: i64,
            _now: i64,
        ) -> Result<(), Self::Error> {
            let r = self.rows.get_mut(&id).unwrap();
            r.attempts = r.attempts.max(attempt);
            r.lease_expires = lease_expires;
            Ok(())
        }

        fn lease_owners(&mut self) -> Result<Vec<String>, Self::Error> {
            let mut owners: Vec<String> =
                self.rows.values().filter_map(|r| r.owner.clone()).collect();
            owners.dedup();
            Ok(owners)
        }

        fn leases_of(&mut self, owner: &str) -> Result<Vec<(i64, WorkKey, u32)>, Self::Error> {
            Ok(self
                .rows
                .iter()
                .filter(|(_, r)| r.status == "in_progress" && r.owner.as_deref() == Some(owner))
                .map(|(&id, r)| (id, r.key.clone(), r.attempts))
                .collect())
        }
    }

    fn key(doc: &str, stage: &str, set: i64) -> WorkKey {
        WorkKey {
            document_id: doc.into(),
            stage: stage.into(),
            vector_set: set,
        }
    }

    fn memory(rows: &[(&str, &str, i64, i64, u64)]) -> Memory {
        let mut m = Memory::default();
        for (i, (doc, stage, set, priority, cost)) in rows.iter().enumerate() {
            m.rows.insert(
                i as i64 + 1,
                Row {
                    key: key(doc, stage, *set),
                    status: "pending",
                    attempts: 0,
                    priority: *priority,
                    cost: *cost,
                    owner: None,
                    not_before: 0,
                    lease_expires: 0,
                },
            );
        }
        m
    }

    fn request(stages: &[&str], max_items: usize, max_cost: u64) -> ClaimRequest {
        ClaimRequest {
            owner: "w1".into(),
            stages: stages.iter().map(|s| s.to_string()).collect(),
            vector_sets: Vec::new(),
            max_items,
            max_cost,
            lease: Duration::from_secs(60),
            retry_limit: 3,
        }
    }

    fn claimed(c: Claim) -> Vec<String> {
        match c {
            Claim::Items(items) => items.into_iter().map(|i| i.key.document_id).collect(),
            other => panic!("no items: {other:?}"),
        }
    }

    /// The highest priority of any stage asked for wins, a claim keeps to one stage and
    /// vector set, and the cost budget stops it after the first item that fits.
    #[test]
    fn a_claim_takes_the_best_stage_and_fits_its_budget() {
        let mut m = memory(&[
            ("a", "embed", 1, 1, 10),
            ("b", "embed", 2, 1, 10),
            ("c", "summary", 0, 2, 10),
            ("d", "summary", 0, 2, 100),
            ("e", "summary", 0, 2, 10),
        ]);
        let got = claim(&mut m, &request(&["embed", "summary"], 10, 50), 1000).unwrap();
        assert_eq!(
            claimed(got),
            ["c"],
            "d does not fit the budget left after c"
        );
        let got = claim(&mut m, &request(&["embed", "summary"], 10, 50), 1000).unwrap();
        assert_eq!(
            claimed(got),
            ["d"],
            "the first item is taken whatever its cost"
        );
        let got = claim(&mut m, &request(&["embed"], 10, 1000), 1000).unwrap();
        assert_eq!(claimed(got), ["a"], "one vector set per claim");
        assert!(!m.locks, "a store without row locks reads once");
    }

    /// A claim limited to some vector sets finds their work behind a page of another set's.
    #[test]
    fn a_claim_limited_to_a_vector_set_finds_its_work_behind_others() {
        let mut rows: Vec<(&str, &str, i64, i64, u64)> = vec![("x", "embed", 1, 1, 1); 5];
        rows.push(("wanted", "embed", 2, 1, 1));
        let mut m = memory(&rows);
        let mut req = request(&["embed"], 2, 100);
        req.vector_sets = vec![2];
        assert_eq!(claimed(claim(&mut m, &req, 1000).unwrap()), ["wanted"]);
    }

    /// Nothing claimable: the next failed item's due time, and whether a paused stage holds
    /// the work.
    #[test]
    fn an_idle_claim_says_when_and_why() {
        let mut m = memory(&[("a", "embed", 1, 1, 1), ("b", "embed", 1, 1, 1)]);
        m.paused = vec!["embed".into()];
        let got = claim(&mut m, &request(&["embed"], 10, 100), 1000).unwrap();
        assert_eq!(
            got,
            Claim::Idle {
                paused: true,
                next_due: None
            }
        );
        m.paused.clear();
        for r in m.rows.values_mut() {
            r.status = "failed";
            r.not_before = 5000;
        }
        let got = claim(&mut m, &request(&["embed"], 10, 100), 1000).unwrap();
        assert_eq!(
            got,
            Claim::Idle {
                paused: false,
                next_due: Some(5000)
            }
        );
    }

    /// Work claimed as often as the retry limit allows goes dead instead of out again; an
    /// expired lease's error is recorded against the worker that held it.
    #[test]
    fn work_claimed_too_often_goes_dead_and_expired_leases_are_recorded() {
        let mut m = memory(&[("a", "embed", 1, 1, 1), ("b", "embed", 1, 1, 1)]);
        for (id, attempts) in [(1, 3), (2, 1)] {
            let r = m.rows.get_mut(&id).unwrap();
            r.status = "in_progress";
            r.owner = Some("gone".into());
            r.lease_expires = 10;
            r.attempts = attempts;
        }
        let got = claim(&mut m, &request(&["embed"], 10, 100), 1000).unwrap();
        assert_eq!(claimed(got), ["b"]);
        assert_eq!(m.rows[&1].status, "dead");
        assert_eq!(m.rows[&2].attempts, 2);
        assert_eq!(m.errors.len(), 2);
        assert!(m
            .errors
            .iter()
            .all(|e| e.2 == "gone" && e.3.contains("expired")));
    }

    /// A failure backs off until the retry limit, then goes dead; a failure of work the
    /// worker no longer holds changes nothing.
    #[test]
    fn failures_back_off_then_go_dead() {
        let mut m = memory(&[("a", "embed", 1, 1, 1)]);
        let settings = StageSettings {
            retry_limit: 2,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            ..StageSettings::default()
        };
        let k = key("a", "embed", 1);
        let mut statuses = Vec::new();
        for now in [1_000, 100_000] {
            claimed(claim(&mut m, &request(&["embed"], 1, 100), now).unwrap());
            let got = fail(&mut m, "w1", &[(k.clone(), "boom".into())], &settings, now).unwrap();
            statuses.push((got[0], m.rows[&1].not_before - now));
        }
        assert_eq!(statuses[0].0, Status::Failed);
        assert!(statuses[0].1 > 0, "a backoff: {statuses:?}");
        assert_eq!(statuses[1].0, Status::Dead);
        let got = fail(&mut m, "w2", &[(k, "late".into())], &settings, 200_000).unwrap();
        assert_eq!(got, [Status::InProgress]);
        assert_eq!(m.errors.len(), 2);
    }

    /// A broker's failed delivery keeps the work held with the broker's attempt count, or
    /// dead-letters it on the broker's last delivery.
    #[test]
    fn failed_deliveries_keep_the_work_held_until_the_last() {
        let mut m = memory(&[("a", "embed", 1, 1, 1)]);
        claimed(claim(&mut m, &request(&["embed"], 1, 100), 1000).unwrap());
        let failure = |attempt, dead| DeliveryFailure {
            key: key("a", "embed", 1),
            attempt,
            message: "nope".into(),
            dead,
            worker: "w1".into(),
        };
        let got = fail_deliveries(&mut m, "w1", &[failure(4, false)], 30_000, 2000).unwrap();
        assert_eq!(got, [Status::Failed]);
        assert_eq!(
            (
                m.rows[&1].status,
                m.rows[&1].attempts,
                m.rows[&1].lease_expires
            ),
            ("in_progress", 4, 32_000)
        );
        let got = fail_deliveries(&mut m, "w1", &[failure(5, true)], 30_000, 3000).unwrap();
        assert_eq!(got, [Status::Dead]);
        assert_eq!(m.rows[&1].status, "dead");
    }

    /// Reaping frees every lease of a dead owner, due at once, with the error recorded.
    #[test]
    fn reaping_frees_a_dead_owners_leases() {
        let mut m = memory(&[("a", "embed", 1, 1, 1), ("b", "embed", 1, 1, 1)]);
        claimed(claim(&mut m, &request(&["embed"], 2, 100), 1000).unwrap());
        assert_eq!(reap(&mut m, &["w2".into()], 2000).unwrap(), 0);
        assert_eq!(reap(&mut m, &["w1".into()], 2000).unwrap(), 2);
        assert!(m
            .rows
            .values()
            .all(|r| r.status == "failed" && r.not_before == 0 && r.owner.is_none()));
        assert!(m.errors.iter().all(|e| e.3.contains("process ended")));
    }

    /// Expired leases count as pending, and the oldest waiting item's age is kept.
    #[test]
    fn stage_counts_fold_status_groups() {
        let c = stage_counts(
            [
                ("in_progress".to_string(), false, 2, Some(500)),
                ("in_progress".to_string(), true, 3, Some(100)),
                ("pending".to_string(), false, 4, Some(300)),
                ("done".to_string(), false, 5, Some(50)),
                ("dead".to_string(), false, 1, Some(10)),
            ],
            true,
            1100,
        );
        assert_eq!(
            (c.in_progress, c.pending, c.failed, c.dead, c.done, c.paused),
            (2, 7, 0, 1, 5, true)
        );
        assert_eq!(c.oldest_pending_secs, Some(1.0));
    }
}
