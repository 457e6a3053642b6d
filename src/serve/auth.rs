//! Who may talk to `serve`: the Host a request names (DNS rebinding), the browser sessions the
//! login page opens, and how fast wrong keys may be tried.
//!
//! - **Host.** A page on `attacker.example` whose name is made to resolve to 127.0.0.1 (DNS
//!   rebinding) reaches a loopback server from the victim's browser as a same-origin page: the
//!   only trace is the `Host` it sends. A request is answered only when its Host is a loopback
//!   name or address, the address the server listens on (or the one the connection reached,
//!   when it listens on every address), or a name the operator allows (`--allowed-host`);
//!   else 421. `/health` is exempt (it says nothing).
//! - **Sessions.** The login page's cookie is a random id (256 bits from the OS) that the
//!   server keeps with an expiry: it dies with the server, after [`SESSION_TTL`], or at
//!   `/logout`, never valid for another process. `Secure` when the login came over TLS (a
//!   proxy's `X-Forwarded-Proto: https` or `Forwarded: proto=https`).
//! - **Logins** are throttled: [`FAILURES_PER_CLIENT`] wrong keys a minute from one address,
//!   [`FAILURES_PER_SERVER`] from all together, then 429 with Retry-After.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where a request came in: the server's address the client connected to, and the client's.
#[derive(Clone, Copy, Debug)]
pub(super) struct Connection {
    pub local: IpAddr,
    pub remote: IpAddr,
}

/// The Host names and addresses the server answers to.
#[derive(Clone, Debug)]
pub struct HostPolicy {
    /// The address the server listens on (unspecified: every address).
    bound: IpAddr,
    /// `--allowed-host` names, lower case, without a port.
    allowed: Vec<String>,
}

impl HostPolicy {
    pub fn new(bound: IpAddr, allowed: &[String]) -> HostPolicy {
        HostPolicy {
            bound,
            allowed: allowed
                .iter()
                .map(|h| {
                    let h = h.trim().trim_end_matches('.').to_ascii_lowercase();
                    h.trim_start_matches('[').trim_end_matches(']').to_string()
                })
                .filter(|h| !h.is_empty())
                .collect(),
        }
    }

    /// Whether a request whose Host (or HTTP/2 authority) is `host` may be answered, on a
    /// connection that reached `local`. No Host at all (HTTP/1.0) is not a browser's request,
    /// which always names one.
    pub fn allows(&self, host: Option<&str>, local: Option<IpAddr>) -> bool {
        let Some(host) = host else {
            return true;
        };
        let Some(name) = host_name(host) else {
            return false;
        };
        if let Ok(ip) = name.parse::<IpAddr>() {
            let ip = canonical(ip);
            return ip.is_loopback()
                || (!self.bound.is_unspecified() && ip == canonical(self.bound))
                || self
                    .allowed
                    .iter()
                    .any(|a| a.parse::<IpAddr>().ok().map(canonical) == Some(ip))
                || (self.bound.is_unspecified() && local.map(canonical) == Some(ip));
        }
        name == "localhost" || name.ends_with(".localhost") || self.allowed.contains(&name)
    }
}

/// The host part of a Host header value (`name`, `name:port`, `[v6]:port`), lower case and
/// without a trailing dot; None when it is not one.
fn host_name(host: &str) -> Option<String> {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        inside
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

/// An IPv4 address mapped into IPv6 (`::ffff:127.0.0.1`) as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// How long a browser session lasts after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once, at most (the oldest goes first past it).
const MAX_SESSIONS: usize = 10_000;

/// The browser sessions the login page opened: random ids, each with its expiry. Only a hash
/// of each id is held.
#[derive(Default)]
pub(super) struct Sessions {
    live: Mutex<HashMap<[u8; 32], Instant>>,
}

impl Sessions {
    /// A new session: the id its cookie carries.
    pub fn open(&self) -> String {
        let id = random_hex();
        let now = Instant::now();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|_, expires| *expires > now);
        if live.len() >= MAX_SESSIONS {
            if let Some(oldest) = live.iter().min_by_key(|(_, e)| **e).map(|(k, _)| *k) {
                live.remove(&oldest);
            }
        }
        live.insert(*blake3::hash(id.as_bytes()).as_bytes(), now + SESSION_TTL);
        id
    }

    /// Whether `id` is a session that has not expired.
    pub fn valid(&self, id: &str) -> bool {
        let key = *blake3::hash(id.as_bytes()).as_bytes();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        match live.get(&key) {
            Some(expires) if *expires > Instant::now() => true,
            Some(_) => {
                live.remove(&key);
                false
            }
            None => false,
        }
    }

    /// End the session `id` (logout).
    pub fn close(&self, id: &str) {
        let key = *blake3::hash(id.as_bytes()).as_bytes();
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }
}

/// Wrong keys one client address may try in [`FAILURE_WINDOW`].
pub const FAILURES_PER_CLIENT: u32 = 5;
/// Wrong keys all clients together may try in [`FAILURE_WINDOW`].
pub const FAILURES_PER_SERVER: u32 = 100;
/// The window the failures are counted in.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Client addresses remembered, at most.
const MAX_CLIENTS: usize = 10_000;

/// Failed logins, counted per client address and in all, in fixed windows.
#[derive(Default)]
pub(super) struct LoginThrottle {
    state: Mutex<Throttle>,
}

#[derive(Default)]
struct Throttle {
    clients: HashMap<IpAddr, (Instant, u32)>,
    all: Option<(Instant, u32)>,
}

impl LoginThrottle {
    /// None when `client` may try a key now; else the seconds until it may.
    pub fn wait(&self, client: Option<IpAddr>) -> Option<u64> {
        let now = Instant::now();
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let over = |window: Option<&(Instant, u32)>, limit: u32| {
            window
                .filter(|(start, n)| *n >= limit && now < *start + FAILURE_WINDOW)
                .map(|(start, _)| (*start + FAILURE_WINDOW - now).as_secs().max(1))
        };
        let client = client.and_then(|c| over(state.clients.get(&c), FAILURES_PER_CLIENT));
        client.or_else(|| over(state.all.as_ref(), FAILURES_PER_SERVER))
    }

    /// A wrong key from `client`.
    pub fn failed(&self, client: Option<IpAddr>) {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let bump = |window: &mut (Instant, u32)| {
            if now >= window.0 + FAILURE_WINDOW {
                *window = (now, 0);
            }
            window.1 = window.1.saturating_add(1);
        };
        bump(state.all.get_or_insert((now, 0)));
        if let Some(c) = client {
            if state.clients.len() >= MAX_CLIENTS && !state.clients.contains_key(&c) {
                state
                    .clients
                    .retain(|_, (start, _)| now < *start + FAILURE_WINDOW);
                if state.clients.len() >= MAX_CLIENTS {
                    // Every slot in use within the window: the server-wide count still holds.
                    return;
                }
            }
            bump(state.clients.entry(c).or_insert((now, 0)));
        }
    }
}

/// 32 bytes from the OS's generator, as hex.
fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    fill_random(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `out` filled from the OS's generator (/dev/urandom), else from the standard library's
/// randomly keyed hashers.
pub(super) fn fill_random(out: &mut [u8]) {
    use std::io::Read;
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .is_ok()
    {
        return;
    }
    use std::hash::{BuildHasher, Hasher};
    for chunk in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
    }
}

/// Whether a request came over TLS to the proxy in front of the server.
pub(super) fn over_tls(headers: &axum::http::HeaderMap) -> bool {
    let forwarded_proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("https")
        });
    let forwarded = headers
        .get_all(axum::http::header::FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([';', ',']))
        .any(|p| p.trim().eq_ignore_ascii_case("proto=https"));
    forwarded_proto || forwarded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_the_served_address_and_allowed_names_pass() {
        let lo = HostPolicy::new("127.0.0.1".parse().unwrap(), &["search.example".into()]);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:8080",
            "127.0.0.2",
            "search.example",
            "Search.Example.:443",
        ] {
            assert!(lo.allows(Some(ok), None), "{ok}");
        }
        for bad in [
            "attacker.example:8080",
            "localhost.attacker.example",
            "10.0.0.5:8080",
            "127.0.0.1:80:80",
            "[::1",
            "",
            "search.example.attacker",
        ] {
            assert!(!lo.allows(Some(bad), None), "{bad}");
        }
        assert!(lo.allows(None, None), "no Host: not a browser");
        // Listening on every address: the address the connection reached.
        let any = HostPolicy::new("0.0.0.0".parse().unwrap(), &[]);
        let local = Some("10.0.0.5".parse().unwrap());
        assert!(any.allows(Some("10.0.0.5:8080"), local));
        assert!(!any.allows(Some("10.0.0.6:8080"), local));
        assert!(!any.allows(Some("0.0.0.0:8080"), local));
        let one = HostPolicy::new("10.0.0.5".parse().unwrap(), &[]);
        assert!(one.allows(Some("10.0.0.5"), None));
        assert!(!one.allows(Some("intranet:8080"), None));
    }

    #[test]
    fn sessions_are_random_and_end() {
        let s = Sessions::default();
        let (a, b) = (s.open(), s.open());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(s.valid(&a) && s.valid(&b));
        assert!(!s.valid("0".repeat(64).as_str()));
        s.close(&a);
        assert!(!s.valid(&a) && s.valid(&b));
        // Another server's sessions are not this one's.
        assert!(!Sessions::default().valid(&b));
    }

    #[test]
    fn wrong_keys_are_throttled_per_client_and_in_all() {
        let t = LoginThrottle::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..FAILURES_PER_CLIENT {
            assert_eq!(t.wait(Some(a)), None);
            t.failed(Some(a));
        }
        assert!(t.wait(Some(a)).is_some_and(|s| (1..=60).contains(&s)));
        assert_eq!(t.wait(Some(b)), None, "another client is not held back");
        let t = LoginThrottle::default();
        for i in 0..FAILURES_PER_SERVER {
            t.failed(Some(IpAddr::from([
                10,
                1,
                (i / 256) as u8,
                (i % 256) as u8,
            ])));
        }
        assert!(
            t.wait(Some(b)).is_some(),
            "the server-wide count holds every client"
        );
    }
}
