//! Lease owners: who holds a claim. An owner names its host and process, so that a worker
//! that finds the lease of a dead process *on its own host* (killed with `kill -9`, crashed)
//! can take the work at once instead of waiting for the lease to expire. Leases of other
//! hosts, or of processes that may be alive, are only ever taken after they expire.

use std::fmt;

/// A lease owner: `host:pid:start:nonce`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner(String);

impl Owner {
    /// The owner id of this process, with a `role` ("enrich", "ingest") and a nonce, so two
    /// workers of one process are told apart.
    pub fn this_process(role: &str) -> Owner {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Owner(format!(
            "{}:{}:{}:{role}-{n}",
            host(),
            std::process::id(),
            start_time(std::process::id()).unwrap_or(0)
        ))
    }

    /// An owner that is no process: `enrich --queue` holds the work it hands to the broker
    /// under one name shared by every process of the queue (the broker says who works it).
    /// It is never reaped as a dead process; its leases only expire.
    pub fn shared(name: &str) -> Owner {
        Owner(name.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// True only when `owner` names a process of this host that is certainly gone (no such pid,
/// a pid reused by a process that started at another time, or a process that has exited and
/// waits only to be reaped by its parent: a zombie holds no lease). Unknown means alive.
pub fn is_dead_here(owner: &str) -> bool {
    let mut parts = owner.splitn(4, ':');
    let (Some(h), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if h != host() {
        return false;
    }
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    if pid == std::process::id() {
        return false;
    }
    if !std::path::Path::new("/proc/self/stat").exists() {
        return false; // no /proc: cannot tell, wait for the lease
    }
    match start_time(pid) {
        None => true,
        Some(t) if start != 0 && t != start => true,
        // Exited (a zombie, or being torn down): it will never renew or complete anything.
        Some(_) => matches!(state(pid), Some('Z' | 'X' | 'x')),
    }
}

/// The state of process `pid` (field 3 of /proc/PID/stat: R, S, D, Z for a zombie...).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// This process as `HOST:PID`, for messages to other processes.
pub fn process_name() -> String {
    format!("{}:{}", host(), std::process::id())
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().replace(':', "_"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The start time of process `pid` in clock ticks since boot (field 22 of /proc/PID/stat).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from the end.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_process_is_dead_and_this_one_and_other_hosts_are_not() {
        let me = Owner::this_process("test");
        assert!(!is_dead_here(me.as_str()));
        assert!(!is_dead_here("another-host:1:1:enrich-0"));
        assert!(!is_dead_here("garbage"));
        if std::path::Path::new("/proc/self/stat").exists() {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            let pid = child.id();
            let start = start_time(pid).unwrap_or(1);
            child.wait().unwrap();
            let owner = format!("{}:{pid}:{start}:enrich-0", host());
            assert!(is_dead_here(&owner), "{owner}");
            // Killed and not yet reaped by its parent (this test): a zombie, still in /proc
            // with its pid and start time, is dead all the same.
            let mut child = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap();
            let pid = child.id();
            let start = start_time(pid).unwrap();
            let owner = format!("{}:{pid}:{start}:enrich-0", host());
            assert!(!is_dead_here(&owner), "a live process is alive");
            std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while state(pid) != Some('Z') && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert_eq!(state(pid), Some('Z'), "not reaped yet: a zombie");
            assert_eq!(start_time(pid), Some(start));
            assert!(is_dead_here(&owner), "a zombie holds nothing");
            child.wait().unwrap();
        }
    }
}
