//! The broker's URL (`nats://`/`tls://` servers, credentials, TLS files, the settings of the
//! query) and connecting to it: waiting for a starting server, refusing plainly what cannot
//! work (credentials, a TLS handshake).

use super::*;

/// Where the broker is and how a run's streams are set up: `nats://HOST:PORT[,nats://...]`
/// with `?prefix=NAME` (streams, subjects and bucket names), `replicas=N` (stream replicas
/// in a cluster), `ack_wait=SECONDS`, `max_deliver=N`, `max_pending=N` (messages one consumer
/// may hold unacknowledged), `limit=N` and `limit_mb=N` (messages and MiB a stream holds
/// before producers wait) and `max_hold=SECONDS` (how long a process may keep one item alive
/// with in-progress acks).
///
/// A secured broker: `nats://USER:PASS@HOST:PORT` (user and password), `nats://TOKEN@HOST`
/// (a token), `?creds=PATH` (a NATS credentials file: JWT and nkey seed); `tls://HOST:PORT` or
/// `?tls=true` (TLS required), `?tls_ca=PATH` (the CA that signed the server's certificate),
/// `?tls_cert=PATH&tls_key=PATH` (a client certificate). The credentials are held as
/// [`Secret`]s and left out of every message ([`BrokerConfig::describe`]).
#[derive(Clone, Debug, PartialEq)]
pub struct BrokerConfig {
    /// The servers' addresses, without credentials.
    pub servers: Vec<String>,
    /// How this process proves who it is.
    pub auth: NatsAuth,
    /// TLS required for every server.
    pub tls: bool,
    /// The CA certificate (PEM) the server's certificate is checked against.
    pub tls_ca: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for servers that verify clients.
    pub tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub prefix: String,
    pub replicas: usize,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    pub max_pending: i64,
    pub limit: i64,
    /// MiB a stream holds before producers wait (a message may carry many items).
    pub limit_mb: i64,
    /// How long a process keeps one item with in-progress acknowledgements, at most.
    pub max_hold: Duration,
}

/// How a process authenticates to NATS.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A credentials file (`.creds`: a user JWT and its nkey seed).
    Creds(std::path::PathBuf),
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            servers: vec!["nats://127.0.0.1:4222".into()],
            auth: NatsAuth::None,
            tls: false,
            tls_ca: None,
            tls_client: None,
            prefix: "ragline".into(),
            replicas: 1,
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            max_pending: 4096,
            limit: 20_000,
            limit_mb: 256,
            max_hold: Duration::from_secs(600),
        }
    }
}

impl BrokerConfig {
    pub fn parse(url: &str) -> Result<Self, BrokerError> {
        Self::parse_config(url)
    }

    pub(super) fn parse_config(url: &str) -> Result<Self, BrokerError> {
        let mut config = BrokerConfig::default();
        // Messages show the URL without its secrets.
        let shown = crate::secret::redact_url(url);
        let url = url.trim();
        let (servers, query) = url.split_once('?').unwrap_or((url, ""));
        config.parse_servers(servers, &shown)?;
        let mut client = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            config.set(key, value, &shown, &mut client)?;
        }
        match client {
            (Some(c), Some(k)) => {
                config.tls_client = Some((c, k));
                config.tls = true;
            }
            (None, None) => {}
            _ => {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: a client certificate needs both tls_cert= and tls_key="
                )))
            }
        }
        Ok(config)
    }

    /// The servers of a URL (`nats://` or `tls://`, comma-separated) and the one identity
    /// the cluster is given (every server names the same, or only some do).
    pub(super) fn parse_servers(&mut self, servers: &str, shown: &str) -> Result<(), BrokerError> {
        let mut auths = Vec::new();
        let mut addresses = Vec::new();
        for s in servers.split(',').filter(|s| !s.is_empty()) {
            let safe = crate::secret::redact_url(s);
            let Some((scheme, rest)) = s
                .split_once("://")
                .filter(|(scheme, _)| *scheme == "nats" || *scheme == "tls")
            else {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: `{safe}` is not a nats:// address (nats://HOST:PORT, \
                     or tls://HOST:PORT for TLS)"
                )));
            };
            self.tls |= scheme == "tls";
            let (auth, host) = match rest.rsplit_once('@') {
                Some((userinfo, host)) => (userinfo_auth(userinfo), host),
                None => (NatsAuth::None, rest),
            };
            let address = format!("{scheme}://{host}");
            ServerAddr::from_str(&address)
                .map_err(|e| BrokerError::Config(format!("queue URL `{shown}`: `{safe}`: {e}")))?;
            auths.push(auth);
            addresses.push(address);
        }
        self.servers = addresses;
        if self.servers.is_empty() {
            return Err(BrokerError::Config(format!(
                "queue URL `{shown}` names no server (nats://HOST:PORT)"
            )));
        }
        let named: Vec<&NatsAuth> = auths.iter().filter(|a| **a != NatsAuth::None).collect();
        if named.windows(2).any(|w| w[0] != w[1]) {
            return Err(BrokerError::Config(format!(
                "queue URL `{shown}`: the servers name different credentials; give one user \
                 (or token) for the cluster"
            )));
        }
        self.auth = named.first().map_or(NatsAuth::None, |a| (*a).clone());
        Ok(())
    }

    /// One `key=value` setting of the URL's query (`client`: the client certificate and key
    /// files, which come as two settings).
    pub(super) fn set(
        &mut self,
        key: &str,
        value: &str,
        shown: &str,
        client: &mut (Option<std::path::PathBuf>, Option<std::path::PathBuf>),
    ) -> Result<(), BrokerError> {
        let number = |what: &str| -> Result<i64, BrokerError> {
            value.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                BrokerError::Config(format!(
                    "queue URL `{shown}`: `{key}={value}` must be a positive {what}"
                ))
            })
        };
        let path = || -> Result<std::path::PathBuf, BrokerError> {
            if value.is_empty() {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: `{key}=` needs a file's path"
                )));
            }
            Ok(std::path::PathBuf::from(value))
        };
        let seconds = || number("number of seconds").map(|n| Duration::from_secs(n as u64));
        match key {
            "creds" => {
                if self.auth != NatsAuth::None {
                    return Err(BrokerError::Config(format!(
                        "queue URL `{shown}`: give either credentials in the address or \
                         ?creds=, not both"
                    )));
                }
                self.auth = NatsAuth::Creds(path()?);
            }
            "tls" => match value {
                "true" | "1" | "yes" => self.tls = true,
                "false" | "0" | "no" => {}
                _ => {
                    return Err(BrokerError::Config(format!(
                        "queue URL `{shown}`: `tls={value}` must be true or false"
                    )))
                }
            },
            "tls_ca" => {
                self.tls_ca = Some(path()?);
                self.tls = true;
            }
            "tls_cert" => client.0 = Some(path()?),
            "tls_key" => client.1 = Some(path()?),
            "prefix" => {
                if value.is_empty()
                    || !value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    return Err(BrokerError::Config(format!(
                        "queue URL `{shown}`: prefix `{value}` must be letters, digits, - or _"
                    )));
                }
                self.prefix = value.to_string();
            }
            "replicas" => self.replicas = number("number")? as usize,
            "ack_wait" => self.ack_wait = seconds()?,
            "max_deliver" => self.max_deliver = number("number")?,
            "max_pending" => self.max_pending = number("number")?,
            "limit" => self.limit = number("number")?,
            "limit_mb" => self.limit_mb = number("number of MiB")?,
            "max_hold" => self.max_hold = seconds()?,
            _ => {
                return Err(BrokerError::Config(format!(
                    "queue URL `{shown}`: unknown setting `{key}` (prefix, replicas, ack_wait, \
                     max_deliver, max_pending, limit, limit_mb, max_hold, creds, tls, tls_ca, \
                     tls_cert, tls_key)"
                )))
            }
        }
        Ok(())
    }

    pub fn stream(&self, lane: Lane) -> String {
        format!(
            "{}_{}",
            self.prefix.to_uppercase(),
            lane.name().to_uppercase()
        )
    }

    pub fn subject(&self, lane: Lane, run: RunId) -> String {
        format!("{}.{}.{run}", self.prefix, lane.name())
    }

    pub fn consumer(&self, lane: Lane, run: RunId) -> String {
        format!("{}-{run}", lane.name())
    }

    pub(super) fn bucket(&self) -> String {
        format!("{}_RUNS", self.prefix.to_uppercase())
    }

    /// The bucket where role processes say what they make of each run ([`RoleNote`]).
    pub(super) fn roles_bucket(&self) -> String {
        format!("{}_ROLES", self.prefix.to_uppercase())
    }

    /// The URL without settings or credentials, for messages.
    pub fn describe(&self) -> String {
        self.servers.join(",")
    }
}

/// The client's options for `config`: identity, TLS, and reconnecting for as long as the
/// process runs.
pub(super) async fn connect_options(
    config: &BrokerConfig,
) -> Result<async_nats::ConnectOptions, BrokerError> {
    let mut options = match &config.auth {
        NatsAuth::None => async_nats::ConnectOptions::new(),
        NatsAuth::UserPassword { user, password } => async_nats::ConnectOptions::new()
            .user_and_password(user.clone(), password.expose().to_string()),
        NatsAuth::Token(token) => {
            async_nats::ConnectOptions::new().token(token.expose().to_string())
        }
        NatsAuth::Creds(path) => async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| {
                BrokerError::Config(format!(
                    "cannot read the NATS credentials file {} (?creds=): {e}",
                    path.display()
                ))
            })?,
    };
    options = options
        .name("ragline")
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2));
    if config.tls {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.tls_ca {
        if !ca.is_file() {
            return Err(BrokerError::Config(format!(
                "the CA certificate {} (?tls_ca=) is not a readable file",
                ca.display()
            )));
        }
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &config.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// A client connected to one of `config`'s servers, trying until one answers or `wait` passes
/// (it may be starting); a server that answers and refuses the credentials or the TLS
/// handshake is an error at once, said plainly. The connection reconnects by itself for as
/// long as the process runs.
pub(crate) async fn connect_client(
    config: &BrokerConfig,
    wait: Duration,
) -> Result<async_nats::Client, BrokerError> {
    let addrs: Vec<ServerAddr> = config
        .servers
        .iter()
        .map(|s| ServerAddr::from_str(s).expect("checked by BrokerConfig::parse"))
        .collect();
    let described = config.describe();
    // Try until the server answers or `wait` passes (it may be starting); a server
    // that answers and refuses the credentials or the TLS handshake is an error at
    // once, said plainly.
    let deadline = Instant::now() + wait;
    let mut last = String::from("no answer");
    loop {
        let options = connect_options(config).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, options.connect(addrs.clone())).await {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(e)) => {
                use async_nats::ConnectErrorKind as K;
                match e.kind() {
                    K::AuthorizationViolation | K::Authentication => {
                        return Err(BrokerError::Connect(format!(
                            "the NATS server at {described} refused this process's \
                                 credentials ({e}): check the user and password or token \
                                 in --queue (nats://USER:PASS@HOST:PORT, nats://TOKEN@HOST) \
                                 or the ?creds= file"
                        )))
                    }
                    _ if tls_failure(&e) => {
                        return Err(BrokerError::Connect(format!(
                            "TLS with the NATS server at {described} failed ({}): \
                                 check ?tls_ca= (the CA that signed the server's \
                                 certificate) and that the address is the name in it",
                            root_cause(&e)
                        )))
                    }
                    _ => last = root_cause(&e),
                }
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(BrokerError::Connect(format!(
                "cannot reach the NATS server at {described} within {}s ({last}): is \
                     it running (`scripts/nats.sh start`), and is the address right?",
                wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A TLS handshake that failed (a certificate not trusted, a name that does not match):
/// the server answered, so waiting longer cannot help.
pub(super) fn tls_failure(e: &async_nats::ConnectError) -> bool {
    if e.kind() == async_nats::ConnectErrorKind::Tls {
        return true;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return true;
            }
        }
        let text = err.to_string();
        if text.contains("certificate") || text.contains("handshake") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The innermost error's message.
pub(super) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// What the userinfo of a server address says: `USER:PASS` or a token.
pub(super) fn userinfo_auth(userinfo: &str) -> NatsAuth {
    match userinfo.split_once(':') {
        Some((user, password)) => NatsAuth::UserPassword {
            user: percent_decode(user),
            password: Secret::new(percent_decode(password)),
        },
        None => NatsAuth::Token(Secret::new(percent_decode(userinfo))),
    }
}

/// `%XX` escapes decoded (a password with `@` or `:` is written `%40`, `%3A`).
pub(super) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).expect("hex") * 16 + hex(l).expect("hex")) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
