//! The peer tier (contract D3): on a local miss, ask peer Managers for the
//! missing blocks, take a source lease there, read the bytes into our own
//! arena (an invisible save of a Manager-internal session, committed once the
//! source's checksums match), release the source lease, and serve the blocks
//! like any local hit.
//!
//! - `transport.rs`: TCP, plain on literal loopback, mutual TLS otherwise;
//! - `source.rs`: serving our blocks to peers (lease held until the reader
//!   reports completion, its connection ends, or we shut down);
//! - `source_context.rs`: what serving peers is handed of this Manager;
//! - `etcd.rs`: membership in etcd (register under a lease, discover peers);
//! - `fill.rs`: a fill on a local miss, peers asked one at a time, and the
//!   `Fetch`/`Leased`/`Done` exchange of one peer;
//! - `probe.rs`: several peers probed at once, the longest hit fetched;
//! - `split.rs`: one peer's fetch split over several connections;
//! - `fill_session.rs`: the Manager-internal session a fill saves into, and
//!   receiving and verifying the blocks;
//! - `hashing.rs`: checksums on a helper thread while the next block moves;
//! - `status.rs`: the peer tier in `orbitkv status` and `/metrics`.
//!
//! Peers are ranked in rendezvous-hash order of the first missing block's key
//! (every Manager asks the same peer first for the same block). With one
//! candidate, or `--peer-fill-parallel 1`, they are asked one at a time with a
//! `Fetch` until one has a hit. Otherwise every candidate is *probed* at once
//! (at most `--peer-fill-parallel` in flight): each pins what it has and
//! answers the count; the longest answer wins (ties: rendezvous order) and is
//! told to `Send`, every other hit is told `Done` (its source lease released).
//! A peer that failed is skipped for [`DOWN_BACKOFF`], so a dead peer costs one
//! connect timeout, not one per miss.
//!
//! Data path of a fill: the source writes each pinned block straight from its
//! arena slot to the socket and hashes it (xxh3-64) after; the reader receives
//! each block straight into a fresh save slot of its own arena, folding each
//! receive into the block's hash as it lands ([`crate::checksum::Progressive`]).
//! A fetch of 16 MiB or more from one peer (asked alone, or a probe's winner,
//! whose probed lease keeps the blocks pinned until the split fetch ends) is
//! split over up to `--peer-fill-streams` connections ([`PeerTier::fetch_split`]): one range
//! of blocks, source lease and save each, all committed only once every range
//! arrived and matched. In a transfer of 4 MiB or more each side hashes on a helper thread
//! (`orbitkv-peer-hash`, [`checksums_alongside`]), block `i` while block `i + 1`
//! moves, when `--peer-hash-thread` is on (`auto`: with 4 or more CPUs);
//! otherwise inline, from cache. The reader commits the save
//! (the blocks become visible) only after every checksum matched the source's
//! and its helper has ended; the source releases its lease only after its
//! helper has ended.

mod etcd;
mod fill;
mod fill_session;
mod hashing;
mod pem;
mod probe;
mod source;
mod source_context;
mod split;
mod status;
mod tp;
pub mod transport;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use orbitkv_core::BlockHash;
use orbitkv_proto::FrameError;

use crate::config::PeerSettings;
pub use etcd::membership;
pub(crate) use hashing::{Piece, checksums_alongside};
pub use source::accept_loop;
pub use source_context::{Source, SourceHost};
pub use tp::forward_releases;
use transport::{Conn, Tls};

/// How long a peer that failed is skipped.
pub const DOWN_BACKOFF: Duration = Duration::from_secs(2);
/// Idle pooled connections kept per peer.
const POOL_PER_PEER: usize = 8;
/// A pooled connection idle longer than this is dropped, not reused (the
/// source closes connections idle for [`source::IDLE`]).
const POOL_IDLE: Duration = Duration::from_secs(20);

/// What one peer looked like to this Manager as a reader.
#[derive(Debug, Default, Clone)]
pub struct PeerHealth {
    pub fetches: u64,
    pub hit_fetches: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Sum of fetch latencies (request sent to last byte verified), microseconds.
    pub latency_us: u64,
    pub last_error: Option<String>,
    pub down_until: Option<Instant>,
    /// Came from etcd (else: the static list).
    pub discovered: bool,
}

/// Counters of this Manager as a source.
#[derive(Debug, Default)]
pub struct SourceCounters {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
    pub bad_frames: AtomicU64,
    pub fetches: AtomicU64,
    pub blocks_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub leases_open: AtomicU64,
    pub leases_done: AtomicU64,
    pub leases_dropped: AtomicU64,
    /// Probes answered with a hit (a reader asking several peers at once), and
    /// those the reader let go for a better answer.
    pub probes: AtomicU64,
    pub probes_released: AtomicU64,
}

/// The peer tier of one Manager.
pub struct PeerTier {
    pub settings: PeerSettings,
    /// Other uids trusted on plain loopback (`--allow-uid`).
    pub allowed_uids: Vec<u32>,
    tls: Option<Tls>,
    /// Static peers plus the ones etcd knows, each with its health.
    peers: Mutex<BTreeMap<String, PeerHealth>>,
    pool: Mutex<BTreeMap<String, Vec<(Conn, Instant)>>>,
    pub source: SourceCounters,
    /// Live source-side connections, shut down at Manager shutdown.
    live: Mutex<BTreeMap<u64, TcpStream>>,
    pub etcd_up: AtomicBool,
    pub etcd_status: RwLock<String>,
    pub listen_addr: Mutex<Option<std::net::SocketAddr>>,
    /// TP across Managers: links to shard holders, TP leases pinned there.
    tp: tp::TpLinks,
    /// HTTPS to etcd (`https://` endpoints), built at start-up.
    etcd_tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for PeerTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTier")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("protocol: {0}")]
    Protocol(String),
}

impl PeerTier {
    pub fn new(settings: PeerSettings, allowed_uids: Vec<u32>) -> Result<PeerTier, String> {
        let tls = settings.tls.as_ref().map(Tls::load).transpose()?;
        let etcd_tls = settings
            .etcd
            .as_ref()
            .and_then(|e| e.tls.as_ref())
            .map(etcd::load_tls)
            .transpose()?;
        let peers = settings
            .peers
            .iter()
            .map(|p| (p.clone(), PeerHealth::default()))
            .collect();
        Ok(PeerTier {
            settings,
            allowed_uids,
            tls,
            peers: Mutex::new(peers),
            pool: Mutex::new(BTreeMap::new()),
            source: SourceCounters::default(),
            live: Mutex::new(BTreeMap::new()),
            etcd_up: AtomicBool::new(false),
            etcd_status: RwLock::new("off".into()),
            listen_addr: Mutex::new(None),
            tp: tp::TpLinks::default(),
            etcd_tls,
        })
    }

    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    fn peers(&self) -> MutexGuard<'_, BTreeMap<String, PeerHealth>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A snapshot for `orbitkv status` and `/metrics`.
    pub fn health(&self) -> BTreeMap<String, PeerHealth> {
        self.peers().clone()
    }

    /// Replace the etcd-discovered part of the peer list (static peers stay).
    pub fn set_discovered(&self, found: &[String]) {
        let me = self.settings.advertise.as_deref();
        let mut peers = self.peers();
        peers.retain(|addr, h| !h.discovered || found.contains(addr) || self.settings.peers.contains(addr));
        for f in found {
            if Some(f.as_str()) == me || peers.contains_key(f) {
                continue;
            }
            log!(Info, "peer {f} discovered through etcd");
            peers.insert(
                f.clone(),
                PeerHealth {
                    discovered: true,
                    ..PeerHealth::default()
                },
            );
        }
    }

    /// Peers to ask for `first`, in rendezvous order, skipping those marked down.
    fn candidates(&self, first: &BlockHash) -> Vec<String> {
        let now = Instant::now();
        let mut v: Vec<(u64, String)> = self
            .peers()
            .iter()
            .filter(|(_, h)| h.down_until.is_none_or(|t| t <= now))
            .map(|(a, _)| {
                let mut buf = Vec::with_capacity(32 + a.len());
                buf.extend_from_slice(first);
                buf.extend_from_slice(a.as_bytes());
                (xxhash_rust::xxh3::xxh3_64(&buf), a.clone())
            })
            .collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.into_iter().map(|(_, a)| a).collect()
    }

    fn take_conn(&self, addr: &str) -> Option<Conn> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let list = pool.get_mut(addr)?;
        while let Some((c, t)) = list.pop() {
            if t.elapsed() < POOL_IDLE {
                return Some(c);
            }
        }
        None
    }

    fn put_conn(&self, addr: &str, c: Conn) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let list = pool.entry(addr.to_string()).or_default();
        if list.len() < POOL_PER_PEER {
            list.push((c, Instant::now()));
        }
    }

    fn record(&self, addr: &str, f: impl FnOnce(&mut PeerHealth)) {
        if let Some(h) = self.peers().get_mut(addr) {
            f(h);
        }
    }

    fn connect(&self, addr: &str) -> Result<Conn, PeerError> {
        Ok(transport::connect(
            addr,
            self.tls.as_ref(),
            self.settings.timeout,
            &self.allowed_uids,
        )?)
    }

    /// Register a live source-side connection (shut down at Manager shutdown).
    fn track(&self, id: u64, s: &TcpStream) {
        if let Ok(c) = s.try_clone() {
            self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(id, c);
        }
    }

    fn untrack(&self, id: u64) {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// Close every source-side connection: their threads end their sessions,
    /// which releases every source lease.
    pub fn shutdown(&self) {
        for s in self.live.lock().unwrap_or_else(|p| p.into_inner()).values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Bind the peer listener when one is configured (`--peer-listen`), and note
/// its address (status, and waking it at shutdown). The Manager's wiring
/// (`lib.rs`) runs [`accept_loop`] on it, and starts the etcd membership
/// ([`membership`]) and TP-release ([`forward_releases`]) threads.
pub fn listen(peer: &PeerTier) -> std::io::Result<Option<std::net::TcpListener>> {
    let Some(addr) = peer.settings.listen else {
        return Ok(None);
    };
    let listener = std::net::TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    *peer.listen_addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(local);
    log!(
        Info,
        "serving peers on {local} ({})",
        if peer.tls.is_some() {
            "mutual TLS"
        } else {
            "plain TCP, loopback only"
        }
    );
    Ok(Some(listener))
}

/// At shutdown: close every peer connection and wake the peer accept loop.
pub fn wake_listener(peer: &PeerTier) {
    peer.shutdown();
    if let Some(a) = *peer.listen_addr.lock().unwrap_or_else(|p| p.into_inner()) {
        let _ = TcpStream::connect_timeout(&a, Duration::from_millis(200));
    }
}
