//! KV events for KV-aware routers: every block that becomes visible in this Manager
//! (stored) or stops being visible (removed), and every move between DRAM (medium
//! `CPU`) and SSD only (`STORAGE`), published on a ZeroMQ PUB socket in
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

use wire::{Change, Medium};

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
    /// A block became visible (stored) or stopped being visible (removed), served
    /// from DRAM (`in_dram`) or from SSD only.
    pub fn changed(&self, key: &BlockKey, visible: bool, in_dram: bool) {
        let m = Medium::of(in_dram);
        self.send(
            key,
            if visible {
                Change::Stored(key.hash, m)
            } else {
                Change::Removed(key.hash, m)
            },
        );
    }

    /// A visible block moved between DRAM and SSD: stored in its new medium, then
    /// removed from its old one (a consumer keyed by hash and medium never sees it absent).
    pub fn moved(&self, key: &BlockKey, in_dram: bool) {
        self.send(key, Change::Stored(key.hash, Medium::of(in_dram)));
        self.send(key, Change::Removed(key.hash, Medium::of(!in_dram)));
    }

    fn send(&self, key: &BlockKey, change: Change) {
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
