//! KV events for KV-aware routers: every block that becomes visible in this Manager
//! (stored) or stops being visible (removed), published on a ZeroMQ PUB socket in
//! vLLM's wire format ([`wire`]), so the consumers of vLLM's own `--kv-events-config`
//! stream decode them unchanged. One topic per namespace (its fingerprint in hex, a dot,
//! its shard); one sequence number per Manager; an optional ROUTER socket replays the
//! batches a late subscriber missed (vLLM's replay protocol).
//!
//! The cache tells [`Sink`] each change under its lock: one `try_send` into a bounded
//! channel (a full channel drops the event and counts it). The publisher thread owns
//! everything else: batching, the namespace names, the sockets and the replay ring
//! (bounded by batches and by bytes), on a one-thread tokio runtime of its own (ZeroMQ is
//! zmq.rs, in Rust). Off unless `--kv-events` is given.

pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{Receiver, Sender};

use orbitkv_core::{BlockKey, NamespaceKey, NsId};

use wire::Change;

/// Changes the channel holds before new ones are dropped.
const QUEUE: usize = 1 << 16;

/// Counters of the stream (status and metrics).
#[derive(Debug, Default)]
pub struct EventCounters {
    /// Changes published.
    pub published: AtomicU64,
    /// Changes dropped because the publisher fell behind (the channel was full).
    pub dropped: AtomicU64,
    /// Batches sent.
    pub batches: AtomicU64,
    /// Replay requests served.
    pub replays: AtomicU64,
}

/// The cache's side: one non-blocking send per change.
#[derive(Debug)]
pub struct Sink {
    tx: Sender<(NsId, Change)>,
    counters: Arc<EventCounters>,
}

impl Sink {
    pub fn changed(&self, key: &BlockKey, visible: bool) {
        let change = if visible {
            Change::Stored(key.hash)
        } else {
            Change::Removed(key.hash)
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send((key.ns, change)) {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

mod publisher;
pub use publisher::{EventsError, Publisher};

/// The sink and the counters a publisher feeds from.
fn channel() -> (Receiver<(NsId, Change)>, Sink, Arc<EventCounters>) {
    let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
    let counters = Arc::new(EventCounters::default());
    let sink = Sink {
        tx,
        counters: counters.clone(),
    };
    (rx, sink, counters)
}

/// The topic of a namespace's batches: its fingerprint in hex, a dot, its shard.
pub fn topic_of(key: &NamespaceKey) -> Vec<u8> {
    let mut t = String::with_capacity(72);
    for b in key.fingerprint.0 {
        t.push_str(&format!("{b:02x}"));
    }
    t.push('.');
    t.push_str(&key.shard.to_string());
    t.into_bytes()
}
