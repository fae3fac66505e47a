//! The ZeroMQ side of the KV-event stream: the PUB socket, the ROUTER socket of vLLM's
//! replay protocol, batching and the replay ring, on a one-thread tokio runtime owned
//! by the publisher thread (zmq.rs runs its connections as tasks of that runtime).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use orbitkv_core::NsId;
use tokio::sync::mpsc::Receiver;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::wire::{self, Change};
use super::{EventCounters, Sink, topic_of};
use crate::config::EventsSettings;
use crate::log;
use crate::parts::{Cache, Shutdown};

/// Changes in one batch at most.
const BATCH: usize = 1024;
/// How often the queue is drained: the most a change waits before it is published.
const TICK: Duration = Duration::from_millis(2);
/// Bytes of payload the replay ring keeps at most.
const RING_BYTES: usize = 64 << 20;
/// vLLM's end-of-replay marker: -1 as 8 bytes big-endian.
const END_SEQ: [u8; 8] = [0xff; 8];
/// A send that takes longer (a subscriber that stopped reading) is abandoned and logged.
const SEND_DEADLINE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("KV events: starting the publisher's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("KV events: binding {endpoint}: {err}")]
    Bind { endpoint: String, err: zeromq::ZmqError },
    #[error("KV events: {path}: {why}")]
    Private { path: String, why: String },
}

/// The publisher: its sockets are bound by [`Publisher::bind`] (so a bad endpoint fails
/// start-up), then [`Publisher::run`] serves until shutdown.
pub struct Publisher {
    rt: tokio::runtime::Runtime,
    state: State,
}

/// Everything the publisher's loop owns, apart from its runtime.
struct State {
    rx: Receiver<(NsId, Change)>,
    pub_socket: zeromq::PubSocket,
    replay: Option<zeromq::RouterSocket>,
    settings: EventsSettings,
    counters: Arc<EventCounters>,
    ring: VecDeque<(u64, Vec<u8>, Arc<Vec<u8>>)>,
    ring_bytes: usize,
    next_seq: u64,
    topics: HashMap<NsId, Vec<u8>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("settings", &self.state.settings)
            .field("next_seq", &self.state.next_seq)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    pub fn bind(settings: &EventsSettings) -> Result<(Publisher, Sink, Arc<EventCounters>), EventsError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(EventsError::Runtime)?;
        let bind_err = |endpoint: &str| {
            let endpoint = endpoint.to_string();
            move |err| EventsError::Bind { endpoint, err }
        };
        // An ipc socket must live in a directory only this user can enter: the socket's own
        // mode cannot be set before a subscriber could connect.
        let private = |endpoint: &str| -> Result<(), EventsError> {
            if let Some(path) = endpoint.strip_prefix("ipc://") {
                private_dir(path).map_err(|why| EventsError::Private {
                    path: path.to_string(),
                    why,
                })?;
            }
            Ok(())
        };
        let (pub_socket, replay) = rt.block_on(async {
            private(&settings.endpoint)?;
            let mut p = zeromq::PubSocket::new();
            p.bind(&settings.endpoint)
                .await
                .map_err(bind_err(&settings.endpoint))?;
            let replay = match &settings.replay {
                Some(r) => {
                    private(r)?;
                    let mut s = zeromq::RouterSocket::new();
                    s.bind(r).await.map_err(bind_err(r))?;
                    Some(s)
                }
                None => None,
            };
            Ok::<_, EventsError>((p, replay))
        })?;
        let (rx, sink, counters) = super::channel();
        let state = State {
            rx,
            pub_socket,
            replay,
            settings: settings.clone(),
            counters: counters.clone(),
            ring: VecDeque::new(),
            ring_bytes: 0,
            next_seq: 0,
            topics: HashMap::new(),
        };
        Ok((Publisher { rt, state }, sink, counters))
    }

    /// Batch, publish and replay until shutdown (the changes already queued are sent first).
    pub fn run(self, cache: &Cache, shutdown: &Shutdown) {
        let Publisher { rt, mut state } = self;
        log!(
            Info,
            "kv events: publishing on {}{}",
            state.settings.endpoint,
            state
                .settings
                .replay
                .as_deref()
                .map_or(String::new(), |r| format!(", replay on {r}"))
        );
        rt.block_on(state.serve(cache, shutdown));
    }
}

impl State {
    /// Every [`TICK`] (or at once for a replay request): drain the queue into batches. The
    /// queue is only polled, never awaited, so a change costs the cache no wake-up.
    async fn serve(&mut self, cache: &Cache, shutdown: &Shutdown) {
        let mut pending: Vec<(NsId, Change)> = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                req = next_request(&mut self.replay) => {
                    self.answer_replay(req).await;
                    continue;
                }
                () = tokio::time::sleep(TICK) => {}
            }
            let stopping = shutdown.requested();
            while let Ok(c) = self.rx.try_recv() {
                pending.push(c);
                if pending.len() == BATCH {
                    self.publish(cache, &mut pending).await;
                }
            }
            if !pending.is_empty() {
                self.publish(cache, &mut pending).await;
            }
            if stopping {
                break;
            }
        }
    }

    /// One batch per namespace, in the order its first change arrived.
    async fn publish(&mut self, cache: &Cache, pending: &mut Vec<(NsId, Change)>) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut order: Vec<NsId> = Vec::new();
        let mut by_ns: HashMap<NsId, Vec<Change>> = HashMap::new();
        for (ns, c) in pending.drain(..) {
            by_ns
                .entry(ns)
                .or_insert_with(|| {
                    order.push(ns);
                    Vec::new()
                })
                .push(c);
        }
        for ns in order {
            let changes = by_ns.remove(&ns).unwrap_or_default();
            let Some(topic) = self.topic(cache, ns) else {
                continue; // the namespace is gone: nothing left to tell about it
            };
            let payload = Arc::new(wire::encode_batch(ts, &changes, self.settings.form));
            let seq = self.next_seq;
            self.next_seq += 1;
            let msg = frames([&topic, &seq.to_be_bytes(), &payload]);
            match tokio::time::timeout(SEND_DEADLINE, self.pub_socket.send(msg)).await {
                Ok(Ok(())) => {
                    self.counters
                        .published
                        .fetch_add(changes.len() as u64, Ordering::Relaxed);
                    self.counters.batches.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(e)) => log!(Warn, "kv events: sending batch {seq}: {e}"),
                Err(_) => log!(Warn, "kv events: batch {seq} not sent within {SEND_DEADLINE:?}"),
            }
            self.remember(seq, topic, payload);
        }
    }

    fn topic(&mut self, cache: &Cache, ns: NsId) -> Option<Vec<u8>> {
        if let Some(t) = self.topics.get(&ns) {
            return Some(t.clone());
        }
        let key = cache.read().namespace_key(ns).ok()?;
        let t = topic_of(&key);
        self.topics.insert(ns, t.clone());
        Some(t)
    }

    fn remember(&mut self, seq: u64, topic: Vec<u8>, payload: Arc<Vec<u8>>) {
        self.ring_bytes += payload.len() + topic.len();
        self.ring.push_back((seq, topic, payload));
        while self.ring.len() > self.settings.buffer || self.ring_bytes > RING_BYTES {
            if let Some((_, t, p)) = self.ring.pop_front() {
                self.ring_bytes -= p.len() + t.len();
            }
        }
    }

    /// A request `[identity, "", start seq as 8 bytes big-endian]` is answered with every
    /// kept batch from that sequence number on, then the end marker.
    async fn answer_replay(&mut self, req: Result<ZmqMessage, zeromq::ZmqError>) {
        let frames_in = match req {
            Ok(m) => m.into_vec(),
            Err(e) => {
                log!(Warn, "kv events: replay socket: {e}");
                return;
            }
        };
        let [id, empty, start] = frames_in.as_slice() else {
            log!(
                Warn,
                "kv events: a replay request of {} frames ignored",
                frames_in.len()
            );
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            log!(
                Warn,
                "kv events: a replay request whose start is not 8 bytes ignored"
            );
            return;
        };
        let start = u64::from_be_bytes(start);
        self.counters.replays.fetch_add(1, Ordering::Relaxed);
        let Some(r) = self.replay.as_mut() else {
            return;
        };
        let kept: Vec<_> = self
            .ring
            .iter()
            .filter(|(s, _, _)| *s >= start)
            .cloned()
            .collect();
        for (seq, topic, payload) in kept {
            let msg = frames([id, empty, &topic, &seq.to_be_bytes(), &payload]);
            if !matches!(tokio::time::timeout(SEND_DEADLINE, r.send(msg)).await, Ok(Ok(()))) {
                return; // the subscriber is gone or too slow: it asks again
            }
        }
        let end = frames([id, empty, b"", &END_SEQ, b""]);
        let _ = tokio::time::timeout(SEND_DEADLINE, r.send(end)).await;
    }
}

/// `path`'s directory exists, is this user's, and group and others have no access to it.
fn private_dir(path: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let dir = std::path::Path::new(path)
        .parent()
        .ok_or_else(|| "an ipc socket needs a directory".to_string())?;
    let meta = std::fs::metadata(dir).map_err(|e| format!("its directory {}: {e}", dir.display()))?;
    let me = orbitkv_shm::peer::my_uid();
    if meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "its directory {} must belong to uid {me} with no access for group or others (mode {:o}, \
             owner {}): anyone who can enter it can subscribe; `chmod 700` it or choose a private directory",
            dir.display(),
            meta.mode() & 0o7777,
            meta.uid()
        ));
    }
    Ok(())
}

/// The next replay request, or never without a replay socket.
async fn next_request(replay: &mut Option<zeromq::RouterSocket>) -> Result<ZmqMessage, zeromq::ZmqError> {
    match replay.as_mut() {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

fn frames<const N: usize>(parts: [&[u8]; N]) -> ZmqMessage {
    let mut it = parts.into_iter();
    let mut m = ZmqMessage::from(it.next().map(<[u8]>::to_vec).unwrap_or_default());
    for p in it {
        m.push_back(p.to_vec().into());
    }
    m
}
