//! Tensor parallelism across Managers (contract T1 across hosts).
//!
//! With `--tp-shard-peer SHARD=HOST:PORT` the scheduler's Manager ("A")
//! answers one `LookupTp` for every declared shard, although the workers of
//! some shards are clients of other Managers ("holders"):
//!
//! 1. A pins the common prefix of its own shards under a TP lease `token`
//!    (the ordinary single-host TP lease, of the scheduler's session);
//! 2. A asks every holder, in parallel (at most `--tp-peer-parallel` queries
//!    in flight), to pin the first of those blocks in its shards under a TP
//!    lease of the same `token` (`PeerTpPin`); each holder answers how many
//!    it pinned;
//! 3. the common prefix is the least of those answers; A trims its own part
//!    and every holder's (`PeerTpSettle`, in parallel, answered) to it, or ends
//!    them all when it is 0, and only then answers the scheduler;
//! 4. each remote rank's worker redeems its part at its own Manager with the
//!    token (`RedeemTp`, unchanged): the part becomes an ordinary lease of the
//!    worker, released when it reports done (once: a duplicate report finds
//!    no lease).
//!
//! A holder's TP lease is owned by the session of the *link*, the one
//! long-lived peer connection A keeps to it. Its parts not yet redeemed end
//! when A's scheduler releases the TP lease (A sends `PeerTpRelease`), when
//! the scheduler's session ends (A's reaper notices and sends
//! `PeerTpRelease`), when the link ends (A died, was restarted or answered
//! garbage: the holder ends its link session), or at the deadline A sent,
//! bounded by the holder's own `--tp-lease-ttl-ms`. Redeemed parts stay with
//! their worker (contract L2), as on one host.
//!
//! Any failure of a holder (down, slow past `--peer-timeout-ms`, garbage, query
//! control off there) makes the whole lookup a miss (common prefix 0) with
//! nothing left pinned: never a wrong hit. Time bound of one lookup: two
//! waves (pin, settle) of `ceil(holders / --tp-peer-parallel)` peer operations,
//! each bounded by `--peer-timeout-ms` (a connect plus one frame each way).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use orbitkv_core::{BlockHash, BlockKey, CacheError, NamespaceKey, NsId, SessionId, TpLookupResult, TpToken};
use orbitkv_proto::peer::{PeerRequest, PeerResponse, TpPinQuery, decode_peer_response};
use orbitkv_proto::{FrameError, read_frame, write_frame};

use super::source_context::Source;
use super::transport::Conn;
use super::{PeerError, PeerTier};
use crate::parts::{Cache, Shutdown};

/// A TP lease this Manager pinned parts of on peers, until its owner ends it.
#[derive(Debug)]
struct RemoteTp {
    owner: SessionId,
    peers: Vec<String>,
    expires_ms: u64,
}

/// Links to the Managers holding TP shards, the TP leases pinned there, and
/// counters (status, metrics).
#[derive(Default)]
pub struct TpLinks {
    links: Mutex<BTreeMap<String, Arc<Mutex<Option<Conn>>>>>,
    remote: Mutex<HashMap<[u8; 16], RemoteTp>>,
    /// Pin queries sent / failed (a failure is a miss for the lookup).
    pub pins: AtomicU64,
    pub errors: AtomicU64,
    /// Settle/release messages sent.
    pub settles: AtomicU64,
    pub releases: AtomicU64,
    /// As a holder: pins served for other Managers.
    pub served_pins: AtomicU64,
    /// Releases to forward to holders, handled by the `orbitkv-tp-release`
    /// thread (off the scheduler's request path). `None` before it started.
    forward: Mutex<Option<Sender<Forward>>>,
}

/// A TP lease whose parts on `peers` are to be ended.
type Forward = ([u8; 16], Vec<String>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TpLinks {
    fn link(&self, addr: &str) -> Arc<Mutex<Option<Conn>>> {
        lock(&self.links).entry(addr.to_string()).or_default().clone()
    }

    pub fn remote_leases(&self) -> usize {
        lock(&self.remote).len()
    }
}

/// Run `f` over `jobs` with at most `bound` in flight; results in job order.
pub(super) fn fan_out<T: Send, R: Send>(jobs: Vec<T>, bound: usize, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    if jobs.len() <= 1 || bound <= 1 {
        return jobs.into_iter().map(f).collect();
    }
    let n = jobs.len();
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..bound.min(n) {
            scope.spawn(|| {
                loop {
                    let Some((i, job)) = lock(&queue).pop() else {
                        break;
                    };
                    let r = f(job);
                    lock(&results)[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

pub(super) fn is_timeout(e: &PeerError) -> bool {
    let io = match e {
        PeerError::Io(io) | PeerError::Frame(FrameError::Io(io)) => io,
        _ => return false,
    };
    matches!(
        io.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

impl PeerTier {
    /// TP shards of this group whose workers are clients of peer Managers.
    pub fn has_tp_shard_peers(&self) -> bool {
        !self.settings.tp_shards.is_empty()
    }

    /// One request on the link to `addr`, one reply. A link that fails is
    /// closed (the holder then ends every TP lease of that link). `retry`: a
    /// link found broken before it answered is replaced once (safe for a pin:
    /// whatever the old link pinned ended with it).
    fn tp_call(&self, addr: &str, req: &PeerRequest, retry: bool) -> Result<PeerResponse, PeerError> {
        let link = self.tp.link(addr);
        let mut slot = lock(&link);
        let reused = slot.is_some();
        let first = match slot.take() {
            Some(c) => Ok(c),
            None => self.connect(addr),
        }
        .and_then(|mut c| exchange(&mut c, req, self.settings.timeout).map(|r| (c, r)));
        let (conn, resp) = match first {
            Ok(x) => x,
            Err(e) if retry && reused && !is_timeout(&e) => {
                let mut c = self.connect(addr)?;
                let r = exchange(&mut c, req, self.settings.timeout)?;
                (c, r)
            }
            Err(e) => return Err(e),
        };
        if let PeerResponse::Error { message } = &resp {
            conn.close();
            return Err(PeerError::Protocol(format!("peer refused: {message}")));
        }
        *slot = Some(conn);
        Ok(resp)
    }

    fn tp_pin(&self, addr: &str, req: &PeerRequest, asked: usize) -> Result<(u32, Vec<u32>), PeerError> {
        self.tp.pins.fetch_add(1, Ordering::Relaxed);
        match self.tp_call(addr, req, true)? {
            PeerResponse::TpPinned { blocks, ssd_blocks } if blocks as usize <= asked => {
                Ok((blocks, ssd_blocks))
            }
            other => {
                self.tp_close(addr);
                Err(PeerError::Protocol(format!(
                    "expected TpPinned of at most {asked} blocks, got {other:?}"
                )))
            }
        }
    }

    /// Settle (`blocks > 0`) or end the TP lease `token` on `addr`: the
    /// blocks pinned there now.
    fn tp_settle(&self, addr: &str, token: TpToken, blocks: u32) -> Result<u32, PeerError> {
        let req = if blocks == 0 {
            self.tp.releases.fetch_add(1, Ordering::Relaxed);
            PeerRequest::TpRelease { token: token.0 }
        } else {
            self.tp.settles.fetch_add(1, Ordering::Relaxed);
            PeerRequest::TpSettle {
                token: token.0,
                blocks,
            }
        };
        match self.tp_call(addr, &req, false)? {
            PeerResponse::TpSettled { blocks: now } if now <= blocks || blocks == 0 => Ok(now),
            other => {
                self.tp_close(addr);
                Err(PeerError::Protocol(format!("expected TpSettled, got {other:?}")))
            }
        }
    }

    /// Close the link to `addr`: the holder ends every TP lease it pinned on it.
    fn tp_close(&self, addr: &str) {
        let link = self.tp.link(addr);
        if let Some(c) = lock(&link).take() {
            c.close();
        }
    }

    fn tp_failed(&self, addr: &str, what: &str, e: &PeerError) {
        let n = self.tp.errors.fetch_add(1, Ordering::Relaxed) + 1;
        let e = if is_timeout(e) {
            format!("no answer within {:?} (--peer-timeout-ms)", self.settings.timeout)
        } else {
            e.to_string()
        };
        warn_sampled!(
            n,
            "TP {what} at peer {addr} failed: {e}; the TP lookup is a miss and nothing stays pinned there"
        );
        self.record(addr, |h| {
            h.errors += 1;
            h.last_error = Some(format!("TP {what}: {e}"));
        });
    }

    /// The scheduler's `LookupTp` over `nss` (shard `i` at `nss[i]`) when some
    /// shards' workers are clients of peer Managers (`tp_lease_ttl`: this
    /// Manager's `--tp-lease-ttl-ms`). See the module comment.
    #[allow(clippy::too_many_arguments)]
    pub fn lookup_across(
        &self,
        cache: &Cache,
        tp_lease_ttl: Duration,
        s: SessionId,
        uid: u32,
        nss: &[NsId],
        hashes: &[BlockHash],
        token: TpToken,
        expires_ms: u64,
    ) -> Result<TpLookupResult, CacheError> {
        let (generation, key, block_bytes) = {
            let cache = cache.write();
            cache.check_tp_group(nss)?;
            let generation = cache.generation_of(nss[0])?;
            let block_bytes = cache.block_bytes(nss[0])?;
            let tk = cache
                .tier_key(&BlockKey {
                    ns: nss[0],
                    generation,
                    hash: [0; 32],
                })
                .ok_or(CacheError::UnknownNamespace(nss[0]))?;
            (generation, tk.ns, block_bytes)
        };
        let miss = TpLookupResult {
            token: None,
            hit_blocks: 0,
            ssd_blocks: Vec::new(),
            generation,
        };
        let mut local = Vec::new();
        let mut holders: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (i, &ns) in nss.iter().enumerate() {
            match self.settings.tp_shards.get(&(i as u32)) {
                Some(addr) => holders.entry(addr.as_str()).or_default().push(i as u32),
                None => local.push(ns),
            }
        }
        // 1. Our own shards first: their prefix bounds what peers are asked.
        let mut n = hashes.len() as u32;
        let mut ssd = BTreeSet::new();
        let mut local_pinned = false;
        if !local.is_empty() {
            let r = cache
                .write()
                .lookup_tp_part(s, Some(uid), &local, hashes, token, expires_ms)?;
            n = r.hit_blocks;
            ssd.extend(r.ssd_blocks);
            local_pinned = r.token.is_some();
        }
        if n == 0 {
            return Ok(miss);
        }
        if holders.is_empty() {
            // Every declared shard is ours (the group is smaller than the placement).
            return Ok(TpLookupResult {
                token: local_pinned.then_some(token),
                hit_blocks: n,
                ssd_blocks: ssd.into_iter().collect(),
                generation,
            });
        }
        // 2. Pin at every holder, in parallel.
        let ttl_ms = u64::try_from(tp_lease_ttl.as_millis()).unwrap_or(u64::MAX);
        let asked = &hashes[..n as usize];
        let jobs: Vec<(&str, Vec<u32>)> = holders.into_iter().collect();
        let pinned = fan_out(jobs, self.settings.tp_parallel, |(addr, shards)| {
            let req = pin_request(token, &key, block_bytes, generation, ttl_ms, shards, asked);
            let r = self.tp_pin(addr, &req, asked.len());
            if let Err(e) = &r {
                self.tp_failed(addr, "pin", e);
            }
            (addr, r)
        });
        let mut common = n;
        let mut at: Vec<(&str, u32)> = Vec::new();
        for (addr, r) in &pinned {
            match r {
                Ok((b, s)) => {
                    common = common.min(*b);
                    if *b > 0 {
                        at.push((addr, *b));
                        ssd.extend(s.iter().copied());
                    }
                }
                Err(_) => common = 0,
            }
        }
        // 3. Trim every holder to the common prefix (or end it), in parallel.
        let settle = |list, to| self.settle_all(token, list, to);
        if common > 0 {
            let settled = settle(at.clone(), common);
            if settled.iter().any(|(_, ok)| !ok) {
                // A holder lost its part meanwhile: a miss for every rank.
                common = 0;
                // (`u32::MAX`: any count but 0, so that each is sent.)
                let alive = settled
                    .into_iter()
                    .filter(|(_, ok)| *ok)
                    .map(|(a, _)| (a, u32::MAX))
                    .collect();
                settle(alive, 0);
            }
        } else {
            settle(at.clone(), 0);
        }
        // 4. Our own part.
        if local_pinned && cache.write().trim_tp(s, token, common).is_err() && common > 0 {
            // The scheduler's session ended meanwhile: end the holders' parts too.
            settle(at.clone(), 0);
            common = 0;
        }
        if common == 0 {
            return Ok(miss);
        }
        let peers: Vec<String> = at.iter().map(|(a, _)| a.to_string()).collect();
        lock(&self.tp.remote).insert(
            token.0,
            RemoteTp {
                owner: s,
                peers,
                expires_ms,
            },
        );
        Ok(TpLookupResult {
            token: Some(token),
            hit_blocks: common,
            ssd_blocks: ssd.into_iter().filter(|&i| i < common).collect(),
            generation,
        })
    }

    /// Trim every `(holder, blocks pinned)` to `to` (0: end), in parallel:
    /// whether each holder has exactly `to` now.
    fn settle_all<'a>(&self, token: TpToken, list: Vec<(&'a str, u32)>, to: u32) -> Vec<(&'a str, bool)> {
        fan_out(list, self.settings.tp_parallel, |(addr, b)| {
            if b == to {
                return (addr, true);
            }
            let r = self.tp_settle(addr, token, to);
            if let Err(e) = &r {
                self.tp_failed(addr, if to == 0 { "release" } else { "settle" }, e);
            }
            (addr, r.is_ok_and(|now| now == to))
        })
    }

    /// The scheduler (session `s`) ends TP lease `token`: end the parts pinned
    /// for it on peers. `None`: no peer holds a part of it; `Some(Err)`: it is
    /// another session's.
    pub fn release_across(&self, s: SessionId, token: TpToken) -> Option<Result<(), CacheError>> {
        let mut remote = lock(&self.tp.remote);
        let owner = remote.get(&token.0)?.owner;
        if owner != s {
            return Some(Err(CacheError::NotOwner {
                what: "TP lease",
                id: s.0,
            }));
        }
        let r = remote.remove(&token.0)?;
        drop(remote);
        self.forward(vec![(token.0, r.peers)]);
        Some(Ok(()))
    }

    /// End these TP leases' parts on their holders: on the release thread,
    /// or here if it is not running.
    fn forward(&self, list: Vec<Forward>) {
        let rest: Vec<Forward> = {
            let tx = lock(&self.tp.forward);
            match tx.as_ref() {
                Some(tx) => list
                    .into_iter()
                    .filter_map(|f| tx.send(f).err().map(|e| e.0))
                    .collect(),
                None => list,
            }
        };
        for (t, peers) in rest {
            self.release_at(TpToken(t), peers);
        }
    }

    /// Start forwarding releases on a thread of their own (started by the
    /// Manager's wiring, `lib.rs`).
    pub fn forwarder(&self) -> Receiver<Forward> {
        let (tx, rx) = std::sync::mpsc::channel();
        *lock(&self.tp.forward) = Some(tx);
        rx
    }

    fn release_at(&self, token: TpToken, peers: Vec<String>) {
        fan_out(peers, self.settings.tp_parallel, |addr| {
            if let Err(e) = self.tp_settle(&addr, token, 0) {
                self.tp_failed(&addr, "release", &e);
            }
        });
    }

    /// Reaper: forget TP leases past their deadline (holders expire their
    /// parts at the same deadline) and end, on the holders, those whose owner
    /// session is gone (on the release thread: a slow peer never stalls the
    /// reaper).
    pub fn tp_reap(&self, cache: &Cache, now_ms: u64) {
        let gone: Vec<Forward> = {
            let mut remote = lock(&self.tp.remote);
            if remote.is_empty() {
                return;
            }
            remote.retain(|_, r| r.expires_ms > now_ms);
            let cache = cache.write();
            let dead: Vec<[u8; 16]> = remote
                .iter()
                .filter(|(_, r)| !cache.session_is_live(r.owner))
                .map(|(t, _)| *t)
                .collect();
            drop(cache);
            dead.into_iter()
                .filter_map(|t| remote.remove(&t).map(|r| (t, r.peers)))
                .collect()
        };
        if !gone.is_empty() {
            self.forward(gone);
        }
    }
}

/// The `orbitkv-tp-release` thread: forward releases until shutdown.
pub fn forward_releases(peer: &PeerTier, shutdown: &Shutdown, rx: Receiver<Forward>) {
    while !shutdown.requested() {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((t, peers)) => peer.release_at(TpToken(t), peers),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn pin_request(
    token: TpToken,
    key: &NamespaceKey,
    block_bytes: u64,
    generation: u64,
    ttl_ms: u64,
    shards: Vec<u32>,
    hashes: &[BlockHash],
) -> PeerRequest {
    PeerRequest::TpPin(TpPinQuery {
        token: token.0,
        fingerprint: key.fingerprint.0,
        salt: key.salt,
        block_bytes,
        generation,
        ttl_ms,
        shards,
        hashes: hashes.to_vec(),
    })
}

/// Send one request and read its reply, each within `timeout`.
fn exchange(conn: &mut Conn, req: &PeerRequest, timeout: Duration) -> Result<PeerResponse, PeerError> {
    conn.set_timeouts(Some(timeout))?;
    write_frame(conn, req.kind(), 0, &req.encode())?;
    conn.flush()?;
    let (h, body) = read_frame(conn)?;
    decode_peer_response(h.kind, &body).map_err(|e| {
        conn.close();
        PeerError::Protocol(e.to_string())
    })
}

/// As a holder: answer a TP request that arrived on a peer link (session `s`).
pub(super) fn serve(src: Source<'_>, s: SessionId, req: PeerRequest) -> PeerResponse {
    let (config, cache) = (src.config, src.arena.cache);
    match req {
        PeerRequest::TpPin(pin) => {
            if !config.enable_query_control {
                return PeerResponse::Error {
                    message: "tensor-parallel query control is off on this Manager; start it with --enable-query-control".into(),
                };
            }
            src.peer.tp.served_pins.fetch_add(1, Ordering::Relaxed);
            let own = u64::try_from(config.tp_lease_ttl.as_millis()).unwrap_or(u64::MAX);
            let expires = src.clock.now_ms().saturating_add(pin.ttl_ms.min(own));
            let mut cache = cache.write();
            let mut nss = Vec::with_capacity(pin.shards.len());
            for shard in pin.shards {
                let key = NamespaceKey {
                    fingerprint: orbitkv_core::Fingerprint(pin.fingerprint),
                    shard,
                    salt: pin.salt,
                };
                match cache.register_namespace(key, pin.block_bytes) {
                    Ok((ns, g)) if g == pin.generation => nss.push(ns),
                    // Another block size or generation: nothing here is that shard's block.
                    _ => {
                        return PeerResponse::TpPinned {
                            blocks: 0,
                            ssd_blocks: Vec::new(),
                        };
                    }
                }
            }
            match cache.lookup_tp_part(s, None, &nss, &pin.hashes, TpToken(pin.token), expires) {
                Ok(r) => PeerResponse::TpPinned {
                    blocks: r.hit_blocks,
                    ssd_blocks: r.ssd_blocks,
                },
                Err(e) => PeerResponse::Error {
                    message: format!("TP pin: {e}"),
                },
            }
        }
        PeerRequest::TpSettle { token, blocks } => match cache.write().trim_tp(s, TpToken(token), blocks) {
            Ok(now) => PeerResponse::TpSettled { blocks: now },
            Err(CacheError::UnknownTpLease | CacheError::NotOwner { .. }) => {
                PeerResponse::TpSettled { blocks: 0 }
            }
            Err(e) => PeerResponse::Error {
                message: format!("TP settle: {e}"),
            },
        },
        // Parts redeemed already stay with their workers; a duplicate or late
        // release finds nothing (the lease ended with its last rank).
        PeerRequest::TpRelease { token } => {
            let _ = cache.write().release_tp(s, TpToken(token));
            PeerResponse::TpSettled { blocks: 0 }
        }
        other => PeerResponse::Error {
            message: format!("kind {:#06x} is not a TP request", other.kind()),
        },
    }
}
