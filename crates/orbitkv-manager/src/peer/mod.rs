//! The peer tier (contract D3): on a local miss, ask peer Managers for the
//! missing blocks, take a source lease there, read the bytes into our own
//! arena (an invisible save of a Manager-internal session, committed once the
//! source's checksums match), release the source lease, and serve the blocks
//! like any local hit.
//!
//! - `transport.rs`: TCP, plain on literal loopback, mutual TLS otherwise;
//! - `source.rs`: serving our blocks to peers (lease held until the reader
//!   reports completion, its connection ends, or we shut down);
//! - `etcd.rs`: membership in etcd (register under a lease, discover peers).
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
mod source;
mod tp;
pub mod transport;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use orbitkv_core::{BlockHash, BlockKey, NsId, SaveId, SaveStatus, SessionEnd, SessionId};
use orbitkv_proto::peer::{PeerRequest, PeerResponse, decode_peer_response};
use orbitkv_proto::{FrameError, read_frame, write_frame};

use crate::config::PeerSettings;
use crate::shared::Shared;
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

    /// Fill the blocks of `hashes` (the missing suffix of a lookup in `ns`)
    /// from peers into this Manager's DRAM. Returns how many leading blocks a
    /// peer delivered and this Manager stored (visible now). Never returns bytes
    /// that failed their checks; any failure is a miss.
    pub fn fill(&self, shared: &Shared, ns: NsId, hashes: &[BlockHash]) -> usize {
        let Some(first) = hashes.first() else {
            return 0;
        };
        let (key, generation, block_bytes) = {
            let cache = shared.cache();
            let Ok(generation) = cache.generation_of(ns) else {
                return 0;
            };
            let Ok(block_bytes) = cache.block_bytes(ns) else {
                return 0;
            };
            let Some(tk) = cache.tier_key(&BlockKey {
                ns,
                generation,
                hash: *first,
            }) else {
                return 0;
            };
            (tk.ns, generation, block_bytes)
        };
        let req = PeerRequest::Fetch {
            fingerprint: key.fingerprint.0,
            shard: key.shard,
            salt: key.salt,
            block_bytes,
            generation,
            hashes: hashes.to_vec(),
        };
        let candidates = self.candidates(first);
        if candidates.len() > 1 && self.settings.fill_parallel > 1 {
            let probe = PeerRequest::Probe {
                fingerprint: key.fingerprint.0,
                shard: key.shard,
                salt: key.salt,
                block_bytes,
                generation,
                hashes: hashes.to_vec(),
            };
            return self.fill_parallel(shared, ns, (&probe, &req), hashes, block_bytes, candidates);
        }
        for addr in candidates {
            let t0 = Instant::now();
            let got = self.fetch_from(shared, &addr, ns, &req, hashes, block_bytes);
            let n = self.note_fetch(&addr, got, t0, block_bytes);
            if n > 0 {
                return n;
            }
        }
        0
    }

    /// Record one fetch from `addr` in its health; the blocks stored (0 on error).
    fn note_fetch(&self, addr: &str, got: Result<usize, PeerError>, t0: Instant, block_bytes: u64) -> usize {
        match got {
            Ok(n) => {
                let us = t0.elapsed().as_micros() as u64;
                self.record(addr, |h| {
                    h.fetches += 1;
                    h.latency_us += us;
                    h.down_until = None;
                    if n > 0 {
                        h.hit_fetches += 1;
                        h.blocks += n as u64;
                        h.bytes += n as u64 * block_bytes;
                    }
                });
                n
            }
            Err(e) => {
                warn_sampled!(
                    self.peers().get(addr).map_or(1, |h| h.errors + 1),
                    "peer {addr}: fetch failed: {e}; treated as a miss, peer skipped for {DOWN_BACKOFF:?}"
                );
                self.record(addr, |h| {
                    h.fetches += 1;
                    h.errors += 1;
                    h.last_error = Some(e.to_string());
                    h.down_until = Some(Instant::now() + DOWN_BACKOFF);
                });
                0
            }
        }
    }

    /// Probe every candidate at once (bounded), fetch from the longest hit,
    /// release the other hits. See the module comment.
    /// `asks`: the `Probe` and the `Fetch` of the same blocks (a winner big
    /// enough to split is fetched over several connections, [`Go::Split`]).
    fn fill_parallel(
        &self,
        shared: &Shared,
        ns: NsId,
        asks: (&PeerRequest, &PeerRequest),
        hashes: &[BlockHash],
        block_bytes: u64,
        candidates: Vec<String>,
    ) -> usize {
        let (probe, fetch) = asks;
        let t0 = Instant::now();
        let (kind, body) = (probe.kind(), probe.encode());
        let timeout = self.settings.timeout;
        let asked = hashes.len();
        // How the winner of `blocks` blocks delivers: told to `Send` on its
        // probe's connection, or, when large, fetched split over several.
        let go = |conn: &mut Conn, lease: u64, blocks: u32| -> Go {
            let streams = self.streams_for(blocks as usize, block_bytes as usize);
            if streams > 1 {
                return Go::Split {
                    lease,
                    blocks,
                    streams,
                };
            }
            let send = PeerRequest::Send { lease };
            Go::Sent(send_request(conn, send.kind(), &send.encode(), timeout))
        };
        // In flight at once without a thread each: write a wave's probes, then
        // read their answers (every peer works on its probe meanwhile).
        let mut answers = Vec::with_capacity(candidates.len());
        let mut early: Option<(usize, Go)> = None;
        // Probes whose answers are read after the early winner's bytes.
        let mut pending: Vec<(String, Sent)> = Vec::new();
        for wave in candidates.chunks(self.settings.fill_parallel) {
            let sent: Vec<(&String, Sent)> = wave
                .iter()
                .map(|addr| {
                    let fresh = || -> Result<(Conn, bool), PeerError> {
                        let mut c = self.connect(addr)?;
                        send_request(&mut c, kind, &body, timeout)?;
                        Ok((c, false))
                    };
                    let r = match self.take_conn(addr) {
                        Some(mut c) => match send_request(&mut c, kind, &body, timeout) {
                            Ok(()) => Ok((c, true)),
                            Err(_) => fresh(),
                        },
                        None => fresh(),
                    };
                    (addr, r)
                })
                .collect();
            let mut sent = sent.into_iter();
            for (addr, r) in sent.by_ref() {
                let r = r.and_then(|(mut c, pooled)| match read_leased(&mut c) {
                    Ok(l) => Ok((c, l)),
                    // A pooled connection the source had closed: once more on a fresh one.
                    Err(e) if pooled && !tp::is_timeout(&e) => {
                        let mut c = self.connect(addr)?;
                        let l = send_and_read_leased(&mut c, kind, &body, timeout)?;
                        Ok((c, l))
                    }
                    Err(e) => Err(e),
                });
                let mut r = r.and_then(|(c, l)| check_leased(c, l, asked, block_bytes));
                // The first whole hit in rendezvous order cannot be beaten: ask
                // it to send now and read its bytes before the other answers
                // (a slow peer must not stall its stream).
                if early.is_none()
                    && let Ok((conn, (lease, blocks, _))) = &mut r
                    && *blocks as usize == asked
                {
                    early = Some((answers.len(), go(conn, *lease, *blocks)));
                }
                answers.push((addr.clone(), r));
                if early.is_some() {
                    break;
                }
            }
            if early.is_some() {
                pending.extend(sent.map(|(a, r)| (a.clone(), r)));
                break; // later waves could not do better
            }
        }
        // Otherwise the longest hit; `max_by_key` keeps the last of equals, so
        // walk in reverse to let the earliest in rendezvous order win a tie.
        let best = early.as_ref().map(|(i, _)| *i).or_else(|| {
            answers
                .iter()
                .enumerate()
                .rev()
                .filter_map(|(i, (_, r))| match r {
                    Ok((_, (_, blocks, _))) if *blocks > 0 => Some((i, *blocks)),
                    _ => None,
                })
                .max_by_key(|&(_, blocks)| blocks)
                .map(|(i, _)| i)
        });
        // Ask the winner to send first; release the others while it reads its slots.
        let mut winner = None;
        if let Some(i) = best
            && let (addr, Ok((conn, (lease, blocks, _)))) = &mut answers[i]
        {
            let how = match early.take() {
                Some((_, how)) => how,
                None => go(conn, *lease, *blocks),
            };
            winner = Some((addr.clone(), how));
        }
        let mut winner_conn = None;
        for (i, (addr, r)) in answers.into_iter().enumerate() {
            match r {
                Ok((conn, _)) if Some(i) == best => winner_conn = Some(conn),
                Ok((mut conn, (lease, blocks, _))) => {
                    if blocks > 0 {
                        let done = PeerRequest::Done { lease, stored: false };
                        let sent = write_frame(&mut conn, done.kind(), 0, &done.encode())
                            .map_err(PeerError::from)
                            .and_then(|()| conn.flush().map_err(PeerError::from));
                        if sent.is_err() {
                            conn.close();
                            continue;
                        }
                    }
                    self.put_conn(&addr, conn);
                    self.note_fetch(&addr, Ok(0), t0, block_bytes);
                }
                Err(e) => {
                    self.note_fetch(&addr, Err(e), t0, block_bytes);
                }
            }
        }
        let stored = match (winner, winner_conn) {
            (Some((addr, Go::Sent(sent))), Some(mut conn)) => {
                let got = sent.and_then(|()| read_leased(&mut conn)).and_then(|leased| {
                    self.receive_leased(shared, &addr, conn, leased, ns, hashes, block_bytes)
                });
                self.note_fetch(&addr, got, t0, block_bytes)
            }
            (
                Some((
                    addr,
                    Go::Split {
                        lease,
                        blocks,
                        streams,
                    },
                )),
                Some(mut conn),
            ) => {
                // The probe's lease keeps the blocks pinned at the source while
                // the split fetch leases them range by range; released after.
                let n = blocks as usize;
                let got = self.fetch_split(shared, &addr, ns, fetch, &hashes[..n], block_bytes, streams);
                let done = PeerRequest::Done { lease, stored: false };
                let released = write_frame(&mut conn, done.kind(), 0, &done.encode())
                    .map_err(PeerError::from)
                    .and_then(|()| conn.flush().map_err(PeerError::from));
                match released {
                    Ok(()) => self.put_conn(&addr, conn),
                    // The source may have let it go already (its timeout); closing ends it anyway.
                    Err(_) => conn.close(),
                }
                self.note_fetch(&addr, got, t0, block_bytes)
            }
            _ => 0,
        };
        // Probes not read yet (an early winner): release their hits now.
        for (addr, r) in pending {
            match r.and_then(|(mut c, pooled)| read_leased(&mut c).map(|l| (c, l, pooled))) {
                Ok((mut conn, (lease, blocks, _), _)) => {
                    if blocks > 0 {
                        let done = PeerRequest::Done { lease, stored: false };
                        if write_frame(&mut conn, done.kind(), 0, &done.encode()).is_err()
                            || conn.flush().is_err()
                        {
                            conn.close();
                            continue;
                        }
                    }
                    self.put_conn(&addr, conn);
                    self.note_fetch(&addr, Ok(0), t0, block_bytes);
                }
                // A stale pooled connection is not the peer's fault; anything else is.
                Err(e) => {
                    if !matches!(&e, PeerError::Frame(FrameError::Closed)) {
                        self.note_fetch(&addr, Err(e), t0, block_bytes);
                    }
                }
            }
        }
        stored
    }

    fn connect(&self, addr: &str) -> Result<Conn, PeerError> {
        Ok(transport::connect(
            addr,
            self.tls.as_ref(),
            self.settings.timeout,
            &self.allowed_uids,
        )?)
    }

    /// Send a `Fetch` or `Probe` to `addr` and read its `Leased` answer,
    /// checked against what was asked. A pooled connection that fails before
    /// any reply is retried once on a fresh connection (the source may have
    /// closed it).
    fn open_leased(
        &self,
        addr: &str,
        kind: u16,
        body: &[u8],
        asked: usize,
        block_bytes: u64,
    ) -> Result<(Conn, (u64, u32, u64)), PeerError> {
        let (conn, leased) = match self.take_conn(addr) {
            Some(mut c) => match send_and_read_leased(&mut c, kind, body, self.settings.timeout) {
                Ok(l) => (c, l),
                Err(_) => {
                    let mut c = self.connect(addr)?;
                    let l = send_and_read_leased(&mut c, kind, body, self.settings.timeout)?;
                    (c, l)
                }
            },
            None => {
                let mut c = self.connect(addr)?;
                let l = send_and_read_leased(&mut c, kind, body, self.settings.timeout)?;
                (c, l)
            }
        };
        check_leased(conn, leased, asked, block_bytes)
    }

    /// One fetch from one peer: on one connection, or split over several
    /// when large ([`PeerTier::fetch_split`]).
    fn fetch_from(
        &self,
        shared: &Shared,
        addr: &str,
        ns: NsId,
        req: &PeerRequest,
        hashes: &[BlockHash],
        block_bytes: u64,
    ) -> Result<usize, PeerError> {
        let streams = self.streams_for(hashes.len(), block_bytes as usize);
        if streams > 1 && matches!(req, PeerRequest::Fetch { .. }) {
            return self.fetch_split(shared, addr, ns, req, hashes, block_bytes, streams);
        }
        let (conn, leased) = self.open_leased(addr, req.kind(), &req.encode(), hashes.len(), block_bytes)?;
        self.receive_leased(shared, addr, conn, leased, ns, hashes, block_bytes)
    }

    /// How many connections a fetch of `blocks` blocks of `len` bytes is split
    /// over: `--peer-fill-streams`, at most one per [`SPLIT_MIN_BYTES`].
    pub(crate) fn streams_for(&self, blocks: usize, len: usize) -> usize {
        let per = len.saturating_mul(blocks) / SPLIT_MIN_BYTES;
        self.settings.fill_streams.min(per).min(blocks).max(1)
    }

    /// A fetch from `addr`, split over several connections when large
    /// ([`PeerTier::streams_for`]): each asks for a contiguous range of
    /// `hashes` (a source lease of its own), receives and verifies it on its
    /// own thread; only when every range arrived and matched its checksums are
    /// the saves committed, the leading ranges up to the first the source held
    /// only in part. The other ranges are asked only once the source has
    /// leased all of the first. Any failure stores nothing and closes every
    /// connection (each source lease ends with it).
    #[allow(clippy::too_many_arguments)]
    fn fetch_split(
        &self,
        shared: &Shared,
        addr: &str,
        ns: NsId,
        req: &PeerRequest,
        hashes: &[BlockHash],
        block_bytes: u64,
        streams: usize,
    ) -> Result<usize, PeerError> {
        let ranges: Vec<&[BlockHash]> = hashes.chunks(hashes.len().div_ceil(streams)).collect();
        let open = |range: &[BlockHash]| -> Result<(Conn, u64, usize), PeerError> {
            // `req` with only this range's hashes.
            let mut req = req.clone();
            if let PeerRequest::Fetch { hashes, .. } = &mut req {
                *hashes = range.to_vec();
            }
            let (conn, (lease, blocks, _)) =
                self.open_leased(addr, req.kind(), &req.encode(), range.len(), block_bytes)?;
            Ok((conn, lease, blocks as usize))
        };
        let receive = |range: &[BlockHash], opened: (Conn, u64, usize)| -> Result<Part<'_>, PeerError> {
            let (mut conn, lease, blocks) = opened;
            if blocks == 0 {
                return Ok(Part {
                    conn,
                    lease,
                    blocks,
                    save: None,
                });
            }
            let mut fill = FillSession::open(shared);
            let ahead = self.hash_ahead(blocks, block_bytes as usize);
            match fill.receive_verified(&mut conn, ns, &range[..blocks], block_bytes, ahead) {
                Ok(save) => Ok(Part {
                    conn,
                    lease,
                    blocks,
                    save: Some((fill, save)),
                }),
                Err(e) => {
                    conn.close();
                    Err(e)
                }
            }
        };
        // The first range is asked first: a source without all of it gets no
        // other request (no bytes moved that could not be a prefix).
        let first = open(ranges[0])?;
        if first.2 < ranges[0].len() {
            let (conn, lease, blocks) = first;
            return self.receive_leased(
                shared,
                addr,
                conn,
                (lease, blocks as u32, block_bytes),
                ns,
                ranges[0],
                block_bytes,
            );
        }
        let parts: Vec<Result<Part<'_>, PeerError>> = std::thread::scope(|scope| {
            let others: Vec<_> = ranges[1..]
                .iter()
                .map(|r| {
                    std::thread::Builder::new()
                        .name("orbitkv-peer-fill".into())
                        .spawn_scoped(scope, || open(r).and_then(|o| receive(r, o)))
                })
                .collect();
            let mut parts = vec![receive(ranges[0], first)];
            for t in others {
                parts.push(match t {
                    Ok(t) => t
                        .join()
                        .unwrap_or_else(|_| Err(PeerError::Protocol("a fill thread panicked".into()))),
                    Err(e) => Err(PeerError::Io(e)),
                });
            }
            parts
        });
        if parts.iter().any(Result::is_err) {
            let mut first = None;
            for p in parts {
                match p {
                    // Closing ends its source lease; dropping its session aborts its save.
                    Ok(p) => p.conn.close(),
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            return Err(first.unwrap_or_else(|| PeerError::Protocol("a fill range failed".into())));
        }
        let mut stored = 0;
        let mut leading = true;
        for (range, p) in ranges.iter().zip(parts.into_iter().flatten()) {
            let Part {
                mut conn,
                lease,
                blocks,
                save,
            } = p;
            let Some((mut fill, save)) = save else {
                leading = false;
                self.put_conn(addr, conn);
                continue;
            };
            // Ranges after one the source held only in part are not a prefix: dropped.
            let keep = leading;
            if keep {
                stored += fill.commit(save)?;
            }
            drop(fill);
            leading &= blocks == range.len();
            let done = PeerRequest::Done { lease, stored: keep };
            write_frame(&mut conn, done.kind(), 0, &done.encode())?;
            conn.flush()?;
            self.put_conn(addr, conn);
        }
        Ok(stored)
    }

    /// Read the blocks a `Leased` announced into our arena, report `Done`.
    #[allow(clippy::too_many_arguments)]
    fn receive_leased(
        &self,
        shared: &Shared,
        addr: &str,
        mut conn: Conn,
        leased: (u64, u32, u64),
        ns: NsId,
        hashes: &[BlockHash],
        block_bytes: u64,
    ) -> Result<usize, PeerError> {
        let (lease, blocks, got_bytes) = leased;
        if blocks == 0 {
            self.put_conn(addr, conn);
            return Ok(0);
        }
        if blocks as usize > hashes.len() || got_bytes != block_bytes {
            conn.close();
            return Err(PeerError::Protocol(format!(
                "peer offered {blocks} block(s) of {got_bytes} bytes for {} of {block_bytes}",
                hashes.len()
            )));
        }
        let n = blocks as usize;
        let stored = {
            let mut reader = FillSession::open(shared);
            let ahead = self.hash_ahead(n, block_bytes as usize);
            match reader.receive(&mut conn, ns, &hashes[..n], block_bytes, ahead) {
                Ok(stored) => stored,
                Err(e) => {
                    conn.close();
                    return Err(e);
                }
            }
        };
        let done = PeerRequest::Done { lease, stored: true };
        write_frame(&mut conn, done.kind(), 0, &done.encode())?;
        conn.flush()?;
        self.put_conn(addr, conn);
        Ok(stored)
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

impl PeerTier {
    /// The `peers` object of `orbitkv status`.
    pub fn status_json(&self) -> serde_json::Value {
        let now = Instant::now();
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let src = &self.source;
        let peers: Vec<serde_json::Value> = self
            .health()
            .iter()
            .map(|(addr, h)| {
                let down = h.down_until.is_some_and(|t| t > now);
                serde_json::json!({
                    "addr": addr,
                    "source": if h.discovered { "etcd" } else { "static" },
                    "health": if down { "down" } else if h.fetches == 0 { "unknown" } else { "up" },
                    "fetches": h.fetches,
                    "hit_fetches": h.hit_fetches,
                    "blocks": h.blocks,
                    "bytes": h.bytes,
                    "errors": h.errors,
                    "mean_latency_us": h.latency_us.checked_div(h.fetches.saturating_sub(h.errors)).unwrap_or(0),
                    "last_error": h.last_error,
                })
            })
            .collect();
        let listen = *self.listen_addr.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::json!({
            "enabled": true,
            "listen": listen.map(|a| a.to_string()),
            "advertise": self.settings.advertise,
            "tls": self.tls.is_some(),
            "hash_thread": self.settings.hash_thread,
            "fill_streams": self.settings.fill_streams,
            "etcd": match &self.settings.etcd {
                None => serde_json::Value::from("off"),
                Some(_) => self.etcd_status.read().unwrap_or_else(|p| p.into_inner()).clone().into(),
            },
            "peers": peers,
            "tp": {
                "shard_peers": self.settings.tp_shards,
                "parallel": self.settings.tp_parallel,
                "pins": ld(&self.tp.pins),
                "errors": ld(&self.tp.errors),
                "settles": ld(&self.tp.settles),
                "releases": ld(&self.tp.releases),
                "remote_leases": self.tp.remote_leases(),
                "served_pins": ld(&self.tp.served_pins),
            },
            "source": {
                "connections": ld(&src.connections),
                "refused": ld(&src.refused),
                "bad_frames": ld(&src.bad_frames),
                "fetches": ld(&src.fetches),
                "blocks_sent": ld(&src.blocks_sent),
                "bytes_sent": ld(&src.bytes_sent),
                "leases_open": ld(&src.leases_open),
                "leases_done": ld(&src.leases_done),
                "leases_dropped": ld(&src.leases_dropped),
                "probes": ld(&src.probes),
                "probes_released": ld(&src.probes_released),
            },
        })
    }

    /// Per-peer series for `/metrics` (label `peer`).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let health = self.health();
        let now = Instant::now();
        type Get = fn(&PeerHealth) -> u64;
        let series: [(&str, &str, &str, Get); 6] = [
            ("peer_fetches_total", "Fetches sent to a peer", "counter", |h| {
                h.fetches
            }),
            (
                "peer_blocks_total",
                "Blocks received from a peer and stored",
                "counter",
                |h| h.blocks,
            ),
            (
                "peer_bytes_total",
                "Bytes received from a peer and stored",
                "counter",
                |h| h.bytes,
            ),
            (
                "peer_errors_total",
                "Failed fetches (a miss) per peer",
                "counter",
                |h| h.errors,
            ),
            (
                "peer_latency_us_total",
                "Sum of successful fetch latencies per peer, microseconds",
                "counter",
                |h| h.latency_us,
            ),
            (
                "peer_up",
                "1 unless the peer failed within the back-off",
                "gauge",
                |_| 0,
            ),
        ];
        for (name, help, kind, get) in series {
            out.push_str(&format!(
                "# HELP orbitkv_{name} {help}\n# TYPE orbitkv_{name} {kind}\n"
            ));
            for (addr, h) in &health {
                let v = if name == "peer_up" {
                    u64::from(h.down_until.is_none_or(|t| t <= now))
                } else {
                    get(h)
                };
                out.push_str(&format!("orbitkv_{name}{{peer=\"{addr}\"}} {v}\n"));
            }
        }
        let src = &self.source;
        let remote = AtomicU64::new(self.tp.remote_leases() as u64);
        for (name, help, kind, v) in [
            (
                "peer_tp_pins_total",
                "TP pin queries sent to Managers holding TP shards",
                "counter",
                &self.tp.pins,
            ),
            (
                "peer_tp_errors_total",
                "Failed TP queries to peers (each made a TP lookup a miss)",
                "counter",
                &self.tp.errors,
            ),
            (
                "peer_tp_remote_leases",
                "TP leases with parts pinned on peers, not yet ended by their owner",
                "gauge",
                &remote,
            ),
            (
                "peer_tp_served_pins_total",
                "TP pins served for other Managers",
                "counter",
                &self.tp.served_pins,
            ),
            (
                "peer_source_blocks_sent_total",
                "Blocks sent to peers",
                "counter",
                &src.blocks_sent,
            ),
            (
                "peer_source_bytes_sent_total",
                "Bytes sent to peers",
                "counter",
                &src.bytes_sent,
            ),
            (
                "peer_source_leases_open",
                "Source leases held for peers now",
                "gauge",
                &src.leases_open,
            ),
            (
                "peer_source_refused_total",
                "Peer connections refused (TLS, limit)",
                "counter",
                &src.refused,
            ),
            (
                "peer_source_bad_frames_total",
                "Peer connections closed for garbage",
                "counter",
                &src.bad_frames,
            ),
        ] {
            out.push_str(&format!(
                "# HELP orbitkv_{name} {help}\n# TYPE orbitkv_{name} {kind}\norbitkv_{name} {}\n",
                v.load(Ordering::Relaxed)
            ));
        }
        out
    }
}

/// A request written on a connection (`true`: a pooled one), or why not.
type Sent = Result<(Conn, bool), PeerError>;

/// Send a Fetch and read the `Leased` answer: (lease, blocks, block_bytes).
fn send_and_read_leased(
    conn: &mut Conn,
    kind: u16,
    body: &[u8],
    timeout: Duration,
) -> Result<(u64, u32, u64), PeerError> {
    send_request(conn, kind, body, timeout)?;
    read_leased(conn)
}

fn send_request(conn: &mut Conn, kind: u16, body: &[u8], timeout: Duration) -> Result<(), PeerError> {
    conn.set_timeouts(Some(timeout))?;
    write_frame(conn, kind, 0, body)?;
    conn.flush()?;
    Ok(())
}

/// Read a `Leased` answer: (lease, blocks, block_bytes).
fn read_leased(conn: &mut Conn) -> Result<(u64, u32, u64), PeerError> {
    let (h, body) = read_frame(conn)?;
    match decode_peer_response(h.kind, &body).map_err(|e| PeerError::Protocol(e.to_string()))? {
        PeerResponse::Leased {
            lease,
            blocks,
            block_bytes,
        } => Ok((lease, blocks, block_bytes)),
        PeerResponse::Error { message } => Err(PeerError::Protocol(format!("peer refused: {message}"))),
        other => Err(PeerError::Protocol(format!(
            "expected Leased, got {:?}",
            other.kind()
        ))),
    }
}

/// A `Leased` answer must not offer more blocks than asked, nor another size.
fn check_leased(
    conn: Conn,
    leased: (u64, u32, u64),
    asked: usize,
    block_bytes: u64,
) -> Result<(Conn, (u64, u32, u64)), PeerError> {
    let (_, blocks, got_bytes) = leased;
    if blocks > 0 && (blocks as usize > asked || got_bytes != block_bytes) {
        conn.close();
        return Err(PeerError::Protocol(format!(
            "peer offered {blocks} block(s) of {got_bytes} bytes for {asked} of {block_bytes}"
        )));
    }
    Ok((conn, leased))
}

/// A Manager-internal session that owns the save a fill writes into; ended
/// (its save aborted if not committed) when dropped. The Manager's own thread
/// is the only writer of those slots and has stopped when this drops, so the
/// end is `Clean`.
struct FillSession<'a> {
    shared: &'a Shared,
    id: SessionId,
}

impl<'a> FillSession<'a> {
    fn open(shared: &'a Shared) -> Self {
        let id = shared.cache().open_session();
        FillSession { shared, id }
    }

    /// Receive `hashes.len()` blocks into fresh save slots, check them against
    /// the source's checksums (taken on a helper thread with `ahead`) and
    /// commit. Returns the blocks committed.
    fn receive(
        &mut self,
        conn: &mut Conn,
        ns: NsId,
        hashes: &[BlockHash],
        block_bytes: u64,
        ahead: bool,
    ) -> Result<usize, PeerError> {
        let save = self.receive_verified(conn, ns, hashes, block_bytes, ahead)?;
        self.commit(save)
    }

    /// [`FillSession::receive`] up to the commit: the blocks are in and every
    /// checksum matched the source's, but nothing is visible yet (dropping
    /// this session aborts the save).
    fn receive_verified(
        &mut self,
        conn: &mut Conn,
        ns: NsId,
        hashes: &[BlockHash],
        block_bytes: u64,
        ahead: bool,
    ) -> Result<SaveId, PeerError> {
        let (save, items) = self
            .shared
            .cache()
            .begin_save(self.id, ns, hashes)
            .map_err(|e| PeerError::Protocol(format!("no room for peer blocks: {e}")))?;
        let len = block_bytes as usize;
        let segments = &self.shared.segments[..];
        let sums = checksums_alongside(
            ahead,
            |sink| read_blocks(conn, segments, &items, len, !ahead, sink),
            || PeerError::Protocol("the checksum thread panicked".into()),
        )?;
        let (h, body) = read_frame(conn)?;
        let checksums =
            match decode_peer_response(h.kind, &body).map_err(|e| PeerError::Protocol(e.to_string()))? {
                PeerResponse::Sent { checksums } => checksums,
                other => {
                    return Err(PeerError::Protocol(format!(
                        "expected Sent, got {:#06x}",
                        other.kind()
                    )));
                }
            };
        if checksums != sums {
            let _ = self.shared.cache().abort_save(self.id, save);
            return Err(PeerError::Protocol(
                "block checksums differ from the source's; nothing stored".into(),
            ));
        }
        Ok(save)
    }

    /// Make a verified save's blocks visible; the blocks committed.
    fn commit(&mut self, save: SaveId) -> Result<usize, PeerError> {
        let committed = self
            .shared
            .cache()
            .commit_save(self.id, save)
            .map_err(|e| PeerError::Protocol(e.to_string()))?;
        Ok(committed as usize)
    }
}

/// One connection's part of a split fetch, received and verified, not yet
/// committed: its connection, the source lease, the blocks offered, and the
/// save holding them (none for a miss).
struct Part<'a> {
    conn: Conn,
    lease: u64,
    blocks: usize,
    save: Option<(FillSession<'a>, SaveId)>,
}

/// How the winner of a parallel probe delivers its blocks.
enum Go {
    /// Told to `Send` on its probe's connection (the outcome of that request).
    Sent(Result<(), PeerError>),
    /// Fetched split over `streams` connections ([`PeerTier::fetch_split`]),
    /// its probed `lease` of `blocks` blocks held until that fetch ends.
    Split { lease: u64, blocks: u32, streams: usize },
}

/// A split fetch gives each connection at least this many bytes.
const SPLIT_MIN_BYTES: usize = 8 << 20;

/// A transfer of at least this many bytes checksums each block on a helper
/// thread while the next one moves, so the thread on the socket only moves
/// bytes. Below it, starting the thread (tens of µs) would cost about what
/// hashing inline does (~30 GB/s from cache: 4 MiB in ~140 µs).
const HASH_AHEAD_MIN_BYTES: usize = 4 << 20;
/// Blocks waiting for the helper at most (then the socket thread waits).
const HASH_AHEAD_QUEUE: usize = 64;

impl PeerTier {
    /// Whether a transfer of `blocks` blocks of `len` bytes hashes on a helper
    /// (`--peer-hash-thread`, and big enough).
    pub(crate) fn hash_ahead(&self, blocks: usize, len: usize) -> bool {
        self.settings.hash_thread && blocks >= 2 && len.saturating_mul(blocks) >= HASH_AHEAD_MIN_BYTES
    }
}

/// One block of a transfer, to checksum: its bytes (in an arena slot the
/// caller keeps frozen until [`checksums_alongside`] returns), or the sum of
/// bytes already hashed (a block the reader read past).
pub(crate) enum Piece<'a> {
    Bytes(&'a [u8]),
    Sum(u64),
}

impl Piece<'_> {
    fn sum(self) -> u64 {
        match self {
            Piece::Bytes(b) => crate::checksum::xxh3_64(b),
            Piece::Sum(s) => s,
        }
    }
}

/// Run `io`, which moves a transfer's blocks over the socket and hands each
/// to its sink in block order, and return the blocks' xxh3-64 in that order.
/// With `ahead`, a scoped helper thread (`orbitkv-peer-hash`) hashes block `i`
/// while `io` moves block `i + 1`; otherwise (or if the thread cannot start)
/// each block is hashed in the sink. The helper has ended — every slice it held
/// dropped — when this returns, whatever happened, so the caller may then
/// commit, abort or release what the slices point into.
pub(crate) fn checksums_alongside<'a, E>(
    ahead: bool,
    io: impl FnOnce(&mut dyn FnMut(Piece<'a>)) -> Result<(), E>,
    panicked: impl FnOnce() -> E,
) -> Result<Vec<u64>, E> {
    let mut sums = Vec::new();
    if !ahead {
        io(&mut |p| sums.push(p.sum()))?;
        return Ok(sums);
    }
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Piece<'a>>(HASH_AHEAD_QUEUE);
        let helper = std::thread::Builder::new()
            .name("orbitkv-peer-hash".into())
            .spawn_scoped(scope, move || {
                rx.into_iter().map(Piece::sum).collect::<Vec<u64>>()
            });
        let Ok(helper) = helper else {
            io(&mut |p| sums.push(p.sum()))?;
            return Ok(sums);
        };
        // A send fails only if the helper is gone (it panicked): the join says so.
        let moved = io(&mut |p| {
            let _ = tx.send(p);
        });
        drop(tx);
        let hashed = helper.join();
        moved?;
        hashed.map_err(|_| panicked())
    })
}

/// Read the blocks of a fill in order, each into its save slot (or past it),
/// handing each to `sink` as soon as it is in.
fn read_blocks<'a>(
    conn: &mut Conn,
    segments: &'a [orbitkv_shm::Segment],
    items: &[SaveStatus],
    len: usize,
    hash_inline: bool,
    sink: &mut dyn FnMut(Piece<'a>),
) -> Result<(), PeerError> {
    let mut scratch: Vec<u8> = Vec::new();
    for st in items {
        match st {
            SaveStatus::Allocated(slot) if hash_inline => {
                let (_, sum) = crate::tier::recv_into_save_slot_hashed(segments, *slot, len, conn)?;
                sink(Piece::Sum(sum));
            }
            SaveStatus::Allocated(slot) => {
                sink(Piece::Bytes(crate::tier::recv_into_save_slot(
                    segments, *slot, len, conn,
                )?));
            }
            // Already here (or refused for room): read past the bytes.
            SaveStatus::Present | SaveStatus::Refused => {
                scratch.resize(len, 0);
                std::io::Read::read_exact(conn, &mut scratch)?;
                sink(Piece::Sum(crate::checksum::xxh3_64(&scratch)));
            }
        }
    }
    Ok(())
}

impl Drop for FillSession<'_> {
    fn drop(&mut self) {
        let _ = self.shared.cache().end_session(self.id, SessionEnd::Clean);
    }
}

/// A thread body and the spawner that starts it under a name.
pub type Job = Box<dyn FnOnce() + Send>;
pub type Spawn<'a> = &'a mut dyn FnMut(&str, Job);

/// Start the peer listener and the etcd membership thread, as configured.
pub fn start(shared: &Arc<Shared>, spawn: Spawn<'_>) -> std::io::Result<()> {
    let Some(peer) = shared.peers.as_ref() else {
        return Ok(());
    };
    if let Some(addr) = peer.settings.listen {
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
        let sh = shared.clone();
        spawn(
            "orbitkv-peer-accept",
            Box::new(move || source::accept_loop(sh, listener)),
        );
    }
    if peer.settings.etcd.is_some() {
        let sh = shared.clone();
        spawn("orbitkv-etcd", Box::new(move || etcd::membership(sh)));
    }
    if peer.has_tp_shard_peers() {
        let rx = peer.forwarder();
        let sh = shared.clone();
        spawn(
            "orbitkv-tp-release",
            Box::new(move || tp::forward_releases(sh, rx)),
        );
    }
    Ok(())
}

/// At shutdown: close every peer connection and wake the peer accept loop.
pub fn wake_listener(shared: &Shared) {
    if let Some(peer) = shared.peers.as_ref() {
        peer.shutdown();
        if let Some(a) = *peer.listen_addr.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = TcpStream::connect_timeout(&a, Duration::from_millis(200));
        }
    }
}
