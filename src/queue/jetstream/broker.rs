//! `Broker`: the connection, its streams, consumers and the runs bucket, and what each role
//! asks of them.

use super::*;

/// What the output task waits on, in order: a reply to send when its turn comes, and the bytes
/// of a publish that it held.
pub(super) type Ordered =
    Pin<Box<dyn Future<Output = (Option<(jetstream::Message, AckKind)>, usize)> + Send>>;

pub(super) enum Outgoing {
    /// Coalesced with the publishes to the same subject that wait behind it.
    Publish {
        subject: String,
        payload: Bytes,
    },
    /// Published as it is (an item split out of a redelivered batch).
    PublishAlone {
        subject: String,
        payload: Bytes,
    },
    Ack(Box<jetstream::Message>, AckKind),
    /// Answered when everything before it is done.
    Flush(Sender<()>),
}

/// A connection to the broker, shared by the queues of a process (cheap to clone).
#[derive(Clone)]
pub struct Broker {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) config: BrokerConfig,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) outgoing: tokio::sync::mpsc::Sender<Outgoing>,
    pub(super) closed: AtomicBool,
    pub(super) tags_arc: Arc<AtomicU64>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

pub(super) fn backend(queue: &'static str, e: impl std::fmt::Display) -> QueueError {
    QueueError::Backend {
        queue,
        message: e.to_string(),
    }
}

impl Broker {
    /// Connect, waiting up to `wait` for a server to answer, and make sure the streams and the
    /// runs bucket exist. The connection reconnects by itself for as long as the process runs.
    pub fn connect(config: BrokerConfig, wait: Duration) -> Result<Broker, BrokerError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nats")
            .enable_all()
            .build()
            .map_err(|e| BrokerError::Connect(format!("cannot start the broker client: {e}")))?;
        let client = rt.block_on(connect_client(&config, wait))?;
        let _in_runtime = rt.enter();
        let js = jetstream::new(client.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(OUTGOING);
        rt.spawn(output(js.clone(), rx));
        let broker = Broker {
            inner: Arc::new(Inner {
                config,
                rt,
                client,
                js,
                outgoing: tx,
                closed: AtomicBool::new(false),
                tags_arc: Arc::new(AtomicU64::new(1)),
            }),
        };
        broker.ensure_streams()?;
        Ok(broker)
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    pub(super) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.inner.rt.block_on(f)
    }

    /// Retry a JetStream API call while the cluster has no leader or the server restarts.
    pub(super) fn retrying<T, E: std::fmt::Display, Fut: Future<Output = Result<T, E>>>(
        &self,
        what: &str,
        mut call: impl FnMut() -> Fut,
    ) -> Result<T, BrokerError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        self.block_on(async {
            loop {
                match call().await {
                    Ok(v) => return Ok(v),
                    Err(e) if Instant::now() < deadline => {
                        let _ = &e;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(BrokerError::api(what, e)),
                }
            }
        })
    }

    pub(super) fn ensure_streams(&self) -> Result<(), BrokerError> {
        let c = &self.inner.config;
        for lane in Lane::ALL {
            let config = stream::Config {
                name: c.stream(lane),
                subjects: vec![format!("{}.{}.*", c.prefix, lane.name())],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::New,
                max_messages: match lane {
                    Lane::Events => c.limit * 8,
                    _ => c.limit,
                },
                max_bytes: c.limit_mb.saturating_mul(1 << 20),
                num_replicas: c.replicas,
                ..Default::default()
            };
            let js = self.inner.js.clone();
            self.retrying(&format!("creating stream {}", config.name), || {
                let (js, config) = (js.clone(), config.clone());
                async move { js.get_or_create_stream(config).await }
            })?;
        }
        let replicas = c.replicas;
        for (bucket, what, max_age) in [
            (c.bucket(), "creating the runs bucket", Duration::ZERO),
            // Notes of roles are read while their run lasts: a day is plenty.
            (
                c.roles_bucket(),
                "creating the roles bucket",
                Duration::from_secs(86_400),
            ),
        ] {
            let js = self.inner.js.clone();
            self.retrying(what, || {
                let (js, bucket) = (js.clone(), bucket.clone());
                async move {
                    match js.get_key_value(&bucket).await {
                        Ok(kv) => Ok(kv),
                        Err(_) => {
                            js.create_key_value(jetstream::kv::Config {
                                bucket,
                                history: 1,
                                storage: stream::StorageType::File,
                                num_replicas: replicas,
                                max_age,
                                ..Default::default()
                            })
                            .await
                        }
                    }
                }
            })?;
        }
        Ok(())
    }

    pub(super) fn roles(&self) -> Result<jetstream::kv::Store, BrokerError> {
        let js = self.inner.js.clone();
        let bucket = self.inner.config.roles_bucket();
        self.retrying("opening the roles bucket", || {
            let (js, bucket) = (js.clone(), bucket.clone());
            async move { js.get_key_value(bucket).await }
        })
    }

    /// Say what this role process made of a run (the publisher reads it).
    pub fn put_role_note(&self, note: &RoleNote) -> Result<(), BrokerError> {
        let kv = self.roles()?;
        let bytes = Bytes::from(serde_json::to_vec(note).expect("a note encodes"));
        // Keys are tokens of letters, digits, `-` and `_` joined by dots.
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        let key = format!(
            "{}.{}.{}",
            clean(&note.run),
            clean(&note.role),
            clean(&note.process)
        );
        self.retrying("recording the role's note", || {
            let (kv, key, bytes) = (kv.clone(), key.clone(), bytes.clone());
            async move { kv.put(key, bytes).await }
        })?;
        Ok(())
    }

    /// What the role processes made of `run` so far, one note a process (its latest).
    pub fn role_notes(&self, run: &str) -> Result<Vec<RoleNote>, BrokerError> {
        let kv = self.roles()?;
        let prefix = format!("{run}.");
        let keys = self.keys(&kv, "listing the roles' notes")?;
        let mut notes = Vec::new();
        for key in keys.into_iter().filter(|k| k.starts_with(&prefix)) {
            let got = self.retrying("reading a role's note", || {
                let (kv, key) = (kv.clone(), key.clone());
                async move { kv.get(key).await }
            })?;
            // A note this version cannot read is another version's: left out.
            if let Some(note) = got.and_then(|b| serde_json::from_slice::<RoleNote>(&b).ok()) {
                notes.push(note);
            }
        }
        Ok(notes)
    }

    pub(super) fn runs(&self) -> Result<jetstream::kv::Store, BrokerError> {
        let js = self.inner.js.clone();
        let bucket = self.inner.config.bucket();
        self.retrying("opening the runs bucket", || {
            let (js, bucket) = (js.clone(), bucket.clone());
            async move { js.get_key_value(bucket).await }
        })
    }

    /// Record a run (its settings and state) for the other processes.
    pub fn put_run(&self, record: &RunRecord) -> Result<(), BrokerError> {
        let kv = self.runs()?;
        let bytes = Bytes::from(serde_json::to_vec(record).expect("a record encodes"));
        let key = record.run.clone();
        self.retrying("recording the run", || {
            let (kv, key, bytes) = (kv.clone(), key.clone(), bytes.clone());
            async move { kv.put(key, bytes).await }
        })?;
        Ok(())
    }

    pub fn get_run(&self, run: &str) -> Result<Option<RunRecord>, BrokerError> {
        let kv = self.runs()?;
        let bytes = self.retrying("reading the run", || {
            let (kv, key) = (kv.clone(), run.to_string());
            async move { kv.get(key).await }
        })?;
        bytes
            .map(|b| {
                serde_json::from_slice(&b)
                    .map_err(|e| BrokerError::Message(format!("run {run}: unreadable record: {e}")))
            })
            .transpose()
    }

    /// Every key of the bucket `kv` (`what`: for the error).
    pub(super) fn keys(
        &self,
        kv: &jetstream::kv::Store,
        what: &str,
    ) -> Result<Vec<String>, BrokerError> {
        self.retrying(what, || {
            let kv = kv.clone();
            async move {
                match kv.keys().await {
                    Ok(keys) => Ok(keys.filter_map(|k| async { k.ok() }).collect().await),
                    Err(e) => Err(e),
                }
            }
        })
    }

    /// The runs recorded, oldest first.
    pub fn list_runs(&self) -> Result<Vec<RunRecord>, BrokerError> {
        let keys = self.keys(&self.runs()?, "listing runs")?;
        let mut runs = Vec::new();
        for key in keys {
            if let Some(r) = self.get_run(&key)? {
                runs.push(r);
            }
        }
        runs.sort_by_key(|r| (r.started, r.run.clone()));
        Ok(runs)
    }

    /// Create the run's consumers (durable pull, explicit ack, the URL's AckWait, MaxDeliver
    /// and max_ack_pending).
    pub fn create_consumers(&self, run: RunId) -> Result<(), BrokerError> {
        let c = self.inner.config.clone();
        for lane in Lane::ALL {
            let name = c.consumer(lane, run);
            let config = consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: c.subject(lane, run),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: c.ack_wait,
                max_deliver: c.max_deliver,
                max_ack_pending: c.max_pending,
                num_replicas: c.replicas,
                ..Default::default()
            };
            let js = self.inner.js.clone();
            let stream = c.stream(lane);
            self.retrying(&format!("creating consumer {name}"), || {
                let (js, stream, config, name) =
                    (js.clone(), stream.clone(), config.clone(), name.clone());
                async move {
                    let stream = js.get_stream(stream).await.map_err(|e| e.to_string())?;
                    stream
                        .get_or_create_consumer(&name, config)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            })?;
        }
        Ok(())
    }

    /// Remove what is left of a finished run on the broker: its consumers and any message
    /// still on its subjects (duplicates of work already done).
    pub fn remove_run(&self, run: RunId) -> Result<(), BrokerError> {
        let c = self.inner.config.clone();
        for lane in Lane::ALL {
            let js = self.inner.js.clone();
            let (stream, name, subject) =
                (c.stream(lane), c.consumer(lane, run), c.subject(lane, run));
            self.retrying("removing the run's consumers", || {
                let (js, stream, name, subject) =
                    (js.clone(), stream.clone(), name.clone(), subject.clone());
                async move {
                    let stream = js.get_stream(stream).await.map_err(|e| e.to_string())?;
                    let _ = stream.delete_consumer(&name).await;
                    stream
                        .purge()
                        .filter(subject)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            })?;
        }
        Ok(())
    }

    /// A queue of the run on `lane`, for pushing and (with `consume`) popping.
    pub fn queue<T: Wire + 'static>(
        &self,
        lane: Lane,
        run: RunId,
        consume: Option<usize>,
    ) -> JetStreamQueue<T> {
        self.make_queue(lane, run, consume, false)
    }

    pub(super) fn make_queue<T: Wire + 'static>(
        &self,
        lane: Lane,
        run: RunId,
        consume: Option<usize>,
        direct_acks: bool,
    ) -> JetStreamQueue<T> {
        let inbox = consume.map(|prefetch| Inbox::start(self, lane, run, prefetch));
        JetStreamQueue {
            broker: self.clone(),
            lane,
            run,
            prefix: self.inner.config.prefix.clone(),
            inbox,
            direct_acks,
            _item: PhantomData,
        }
    }

    /// A queue of the run on `lane` whose deliveries cause no publishes (the publisher
    /// following the events): its acknowledgements go out at once instead of behind this
    /// process's publishes. Those may be waiting for room in a full stream that only these
    /// acknowledgements make (the connector's work waits on the workers, which wait on the
    /// indexer, which waits on the events), so ordering them would close the circle.
    pub fn follower<T: Wire + 'static>(
        &self,
        lane: Lane,
        run: RunId,
        prefetch: usize,
    ) -> JetStreamQueue<T> {
        self.make_queue(lane, run, Some(prefetch), true)
    }

    /// Messages a consumer of the run still has to deliver or see acknowledged (an estimate).
    pub fn backlog(&self, lane: Lane, run: RunId) -> Option<u64> {
        let c = &self.inner.config;
        let (stream, name) = (c.stream(lane), c.consumer(lane, run));
        let js = self.inner.js.clone();
        self.block_on(async move {
            let stream = js.get_stream(stream).await.ok()?;
            let mut consumer: consumer::PullConsumer = stream.get_consumer(&name).await.ok()?;
            let info = consumer.info().await.ok()?;
            Some(info.num_pending + info.num_ack_pending as u64)
        })
    }

    /// The messages that reached MaxDeliver on the run's consumers, as they happen:
    /// (lane, the message's payload). The server stops delivering such a message; the caller
    /// decides what becomes of its document. The message is removed from its stream.
    pub fn dead_letters(&self, run: RunId) -> Result<Receiver<(Lane, Bytes)>, BrokerError> {
        let c = self.inner.config.clone();
        let (tx, rx) = bounded(1024);
        let client = self.inner.client.clone();
        let js = self.inner.js.clone();
        let subject = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>".to_string();
        let mut sub = self
            .block_on(client.subscribe(subject))
            .map_err(|e| BrokerError::api("watching for dead letters", e))?;
        let names: HashMap<(String, String), Lane> = Lane::ALL
            .iter()
            .map(|&l| ((c.stream(l), c.consumer(l, run)), l))
            .collect();
        self.inner.rt.spawn(async move {
            #[derive(Deserialize)]
            struct Advisory {
                stream: String,
                consumer: String,
                stream_seq: u64,
            }
            while let Some(msg) = sub.next().await {
                let Ok(a) = serde_json::from_slice::<Advisory>(&msg.payload) else {
                    continue;
                };
                let Some(&lane) = names.get(&(a.stream.clone(), a.consumer.clone())) else {
                    continue;
                };
                let Ok(stream) = js.get_stream(&a.stream).await else {
                    continue;
                };
                if let Ok(m) = stream.get_raw_message(a.stream_seq).await {
                    let _ = stream.delete_message(a.stream_seq).await;
                    // Every item of the message (a batch is split on its second delivery,
                    // so this is one item unless MaxDeliver is 1).
                    let Ok((items, _)) = split_message(&m.payload) else {
                        continue;
                    };
                    for item in items {
                        if tx.send((lane, item)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Wait until everything pushed so far is stored (or `wait` passes).
    pub fn flush(&self, wait: Duration) -> bool {
        let (tx, rx) = bounded::<()>(1);
        let out = self.inner.outgoing.clone();
        let sent = self.block_on(async move { out.send(Outgoing::Flush(tx)).await.is_ok() });
        let done = sent && rx.recv_timeout(wait).is_ok();
        let client = self.inner.client.clone();
        let _ = self.block_on(async move { tokio::time::timeout(wait, client.flush()).await });
        done
    }

    /// Set `flag` on SIGTERM or SIGINT (the process finishes what it holds and exits).
    pub fn stop_on_signals(&self, flag: Arc<AtomicBool>) {
        use tokio::signal::unix::{signal, SignalKind};
        self.inner.rt.spawn(async move {
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!(target: crate::NOTE, "stopping: finishing what this process holds");
            flag.store(true, Ordering::Relaxed);
        });
    }

    pub(super) fn send(&self, out: Outgoing, timeout: Duration) -> Result<(), Outgoing> {
        let tx = self.inner.outgoing.clone();
        self.block_on(async move {
            match tokio::time::timeout(timeout, tx.reserve()).await {
                Ok(Ok(permit)) => {
                    permit.send(out);
                    Ok(())
                }
                _ => Err(out),
            }
        })
    }
}
