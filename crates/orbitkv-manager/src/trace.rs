//! `orbitkv trace`: a bounded record of this Manager's lookups (with the block each
//! stopped at and why), restores, lease releases and generation resets, kept only
//! while a client keeps it armed (the `Trace` request), for one namespace
//! fingerprint and one process when asked. Disarmed, a request pays one relaxed
//! atomic load; armed, a traced request is copied and explained after its reply
//! is computed (under the shared cache lock), never while it holds a lock.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use orbitkv_core::{BlockKey, MissReason, NamespaceKey, NsId, SessionId};
use orbitkv_proto::{HASH_BYTES, LookupGrant, Request, Response, SaveItem, TpGrant};
use serde_json::{Value, json};

use crate::parts::{Cache, Clock};

/// Events kept; older ones are dropped (a reader that falls behind is told how many).
pub const MAX_EVENTS: usize = 4096;
/// Events in one `TraceOk` (the reader asks again for the rest).
const MAX_PER_REPLY: usize = 512;
/// Leases of traced lookups remembered for their lifetime (beyond: forgotten).
const MAX_LEASES: usize = 65_536;
/// The longest one `Trace` request may arm for.
pub const MAX_ARM_MS: u32 = 3_600_000;

#[derive(Default)]
pub struct Tracer {
    /// `Clock::now_ms` until which events are recorded; 0: never armed or stopped.
    armed_until: AtomicU64,
    inner: Mutex<Inner>,
    /// Blocks that left the cache while armed (told under the cache lock, so apart
    /// from `inner`, which is never held while the cache lock is taken).
    left: Mutex<Left>,
}

/// Blocks that stopped being visible while a trace was armed, the last
/// [`MAX_LEFT`] of them: when.
#[derive(Default)]
struct Left {
    when: HashMap<BlockKey, Instant>,
    order: VecDeque<BlockKey>,
}

/// Blocks remembered as having left the cache.
const MAX_LEFT: usize = 65_536;

#[derive(Default)]
struct Inner {
    fingerprint: Option<[u8; HASH_BYTES]>,
    pid: Option<i32>,
    events: VecDeque<(u64, Value)>,
    last_seq: u64,
    /// Lease id -> when its traced lookup granted it.
    leases: HashMap<u64, Instant>,
    /// Save id -> when its traced `BeginSave` was answered.
    saves: HashMap<u64, Instant>,
}

fn now_rfc3339() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    crate::log::rfc3339_millis(ms)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

impl Tracer {
    fn armed_at(&self, now_ms: u64) -> bool {
        now_ms < self.armed_until.load(Ordering::Relaxed)
    }

    /// Whether requests are traced now: one relaxed load while no trace is armed
    /// (the clock is read only while one is; an expired one is switched off here).
    #[inline]
    pub fn armed(&self, clock: Clock) -> bool {
        let until = self.armed_until.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        if clock.now_ms() < until {
            return true;
        }
        let _ = self
            .armed_until
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    /// The cache's visibility sink: `key` stopped being visible (evicted without an
    /// SSD copy, dropped from SSD, or doomed). Remembered only while armed; the
    /// armed test here reads no clock (an expired trace stops recording at the
    /// next request, which switches it off).
    pub fn left(&self, key: &BlockKey) {
        if !self.maybe_armed() {
            return;
        }
        let mut l = self.left.lock().unwrap_or_else(|p| p.into_inner());
        if l.when.insert(*key, Instant::now()).is_none() {
            l.order.push_back(*key);
            if l.order.len() > MAX_LEFT
                && let Some(old) = l.order.pop_front()
            {
                l.when.remove(&old);
            }
        }
    }

    /// When `key` left the cache, if it did while armed.
    fn left_at(&self, key: &BlockKey) -> Option<Instant> {
        let l = self.left.lock().unwrap_or_else(|p| p.into_inner());
        l.when.get(key).copied()
    }

    #[inline]
    fn maybe_armed(&self) -> bool {
        self.armed_until.load(Ordering::Relaxed) != 0
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A `Trace` request: (re)arm for `arm_ms` with this filter (0: stop), and
    /// the events after `cursor` as the `TraceOk` JSON.
    pub fn request(
        &self,
        now_ms: u64,
        arm_ms: u32,
        fingerprint: [u8; HASH_BYTES],
        pid: u32,
        cursor: u64,
    ) -> String {
        let mut g = self.inner();
        if arm_ms == 0 {
            self.armed_until.store(0, Ordering::Relaxed);
            g.leases.clear();
            g.saves.clear();
            *self.left.lock().unwrap_or_else(|p| p.into_inner()) = Left::default();
        } else {
            g.fingerprint = (fingerprint != [0; HASH_BYTES]).then_some(fingerprint);
            g.pid = (pid != 0).then(|| i32::try_from(pid).unwrap_or(i32::MAX));
            self.armed_until
                .store(now_ms.saturating_add(u64::from(arm_ms)).max(1), Ordering::Relaxed);
        }
        // u64::MAX: "from now on" (a new reader skips what earlier traces left).
        let cursor = if cursor == u64::MAX { g.last_seq } else { cursor };
        let oldest = g.events.front().map_or(g.last_seq + 1, |(s, _)| *s);
        // Events the reader never saw: dropped from the ring after its cursor.
        let missed = oldest.saturating_sub(cursor.saturating_add(1));
        let events: Vec<&Value> = g
            .events
            .iter()
            .filter(|(s, _)| *s > cursor)
            .take(MAX_PER_REPLY)
            .map(|(_, v)| v)
            .collect();
        let next = g
            .events
            .iter()
            .filter(|(s, _)| *s > cursor)
            .take(MAX_PER_REPLY)
            .last()
            .map_or(cursor.max(oldest.saturating_sub(1)), |(s, _)| *s);
        let more = g.events.back().is_some_and(|(s, _)| *s > next);
        json!({
            "armed": self.armed_at(now_ms),
            "filter": {
                "fingerprint": g.fingerprint.map(|f| hex(&f)),
                "pid": g.pid,
            },
            "next": next,
            "more": more,
            "missed": missed,
            "events": events,
        })
        .to_string()
    }

    fn push(&self, g: &mut Inner, mut event: Value) {
        g.last_seq += 1;
        let seq = g.last_seq;
        if let Some(m) = event.as_object_mut() {
            m.insert("seq".into(), seq.into());
            m.insert("time".into(), now_rfc3339().into());
        }
        if g.events.len() == MAX_EVENTS {
            g.events.pop_front();
        }
        g.events.push_back((seq, event));
    }

    /// Record `req` (as it was before handling) and its `reply`, if the filter
    /// takes it.
    pub fn observe(&self, cache: &Cache, s: SessionId, pid: i32, req: &Request, reply: &Response) {
        match (req, reply) {
            (Request::Lookup { ns, hashes }, _) => self.lookup(cache, s, pid, NsId(*ns), hashes, reply),
            (Request::Acquire { lease }, _) => {
                let mut g = self.inner();
                let Some(&granted) = g.leases.get(lease) else {
                    return;
                };
                let event = match reply {
                    Response::Slots { slots } => json!({
                        "event": "acquire", "pid": pid, "session": s.0, "lease": lease,
                        "blocks": slots.len(), "after_lookup_us": micros(granted),
                    }),
                    Response::Error { message, .. } => json!({
                        "event": "acquire", "pid": pid, "session": s.0, "lease": lease,
                        "error": message, "after_lookup_us": micros(granted),
                    }),
                    _ => return,
                };
                self.push(&mut g, event);
            }
            (Request::LookupTp { nss, hashes }, _) => self.lookup_tp(cache, s, pid, nss, hashes, reply),
            (
                Request::RedeemTp { ns, .. },
                Response::LookupOk(LookupGrant {
                    lease, hit_blocks, ..
                }),
            ) => {
                let Some(fp) = self.namespace_if_traced(cache, Some(pid), NsId(*ns)) else {
                    return;
                };
                let event = json!({
                    "event": "redeem", "pid": pid, "session": s.0, "namespace": hex(&fp),
                    "shard_ns": ns, "hit": hit_blocks, "lease": lease,
                });
                let mut g = self.inner();
                remember(&mut g, *lease);
                self.push(&mut g, event);
            }
            (Request::Release { lease }, _) => self.released(pid, s, &[*lease], false),
            (Request::BeginSave { ns, hashes }, _) => {
                let Some(fp) = self.namespace_if_traced(cache, Some(pid), NsId(*ns)) else {
                    return;
                };
                let mut event = json!({
                    "event": "save", "pid": pid, "session": s.0, "namespace": hex(&fp),
                    "asked": hashes.len(),
                });
                let Some(m) = event.as_object_mut() else {
                    return;
                };
                let mut g = self.inner();
                match reply {
                    Response::SaveBegun { save, items } => {
                        let count = |k: fn(&SaveItem) -> bool| items.iter().filter(|i| k(i)).count();
                        m.insert("save".into(), (*save).into());
                        m.insert(
                            "allocated".into(),
                            count(|i| matches!(i, SaveItem::Allocated { .. })).into(),
                        );
                        m.insert("present".into(), count(|i| matches!(i, SaveItem::Present)).into());
                        m.insert("refused".into(), count(|i| matches!(i, SaveItem::Refused)).into());
                        if g.saves.len() >= MAX_LEASES {
                            g.saves.clear();
                        }
                        g.saves.insert(*save, Instant::now());
                    }
                    Response::Error { message, .. } => {
                        m.insert("error".into(), message.clone().into());
                    }
                    _ => return,
                }
                self.push(&mut g, event);
            }
            (Request::CommitSave { save } | Request::AbortSave { save }, _) => {
                let mut g = self.inner();
                let Some(begun) = g.saves.remove(save) else {
                    return;
                };
                let mut event = json!({
                    "event": if matches!(req, Request::CommitSave { .. }) { "commit" } else { "abort" },
                    "pid": pid, "session": s.0, "save": save, "after_begin_us": micros(begun),
                });
                if let Some(m) = event.as_object_mut() {
                    match reply {
                        Response::Committed { blocks } => {
                            m.insert("committed".into(), (*blocks).into());
                        }
                        Response::Error { message, .. } => {
                            m.insert("error".into(), message.clone().into());
                        }
                        _ => {}
                    }
                }
                self.push(&mut g, event);
            }
            (Request::ResetGeneration { ns }, Response::Generation { generation }) => {
                let Some(fp) = self.namespace_if_traced(cache, Some(pid), NsId(*ns)) else {
                    return;
                };
                let event = json!({
                    "event": "reset", "pid": pid, "session": s.0, "namespace": hex(&fp),
                    "generation": generation,
                });
                self.push(&mut self.inner(), event);
            }
            _ => {}
        }
    }

    /// Leases released (`quiet`: by `ReleaseQuiet`, which has no reply).
    pub fn released(&self, pid: i32, s: SessionId, leases: &[u64], quiet: bool) {
        let mut g = self.inner();
        for lease in leases {
            if let Some(granted) = g.leases.remove(lease) {
                let event = json!({
                    "event": "release", "pid": pid, "session": s.0, "lease": lease,
                    "held_us": micros(granted), "quiet": quiet,
                });
                self.push(&mut g, event);
            }
        }
    }

    /// A lookup's local miss filled from the tiers below (before its own event):
    /// `missing` blocks asked of peers, then of the remote tier.
    pub fn filled(&self, cache: &Cache, s: SessionId, ns: NsId, missing: usize, peers: usize, remote: usize) {
        let Some(fp) = self.namespace_if_traced(cache, None, ns) else {
            return;
        };
        let event = json!({
            "event": "fill", "session": s.0, "namespace": hex(&fp), "missing": missing,
            "from_peers": peers, "from_remote": remote,
        });
        self.push(&mut self.inner(), event);
    }

    /// The namespace's identity when this process (None: not known here) and
    /// namespace are traced.
    fn traced_namespace(&self, cache: &Cache, pid: Option<i32>, ns: NsId) -> Option<NamespaceKey> {
        let (want_fp, want_pid) = {
            let g = self.inner();
            (g.fingerprint, g.pid)
        };
        if let (Some(want), Some(pid)) = (want_pid, pid)
            && want != pid
        {
            return None;
        }
        let key = cache.read().namespace_key(ns).ok()?;
        want_fp.is_none_or(|w| w == key.fingerprint.0).then_some(key)
    }

    /// [`Self::traced_namespace`]'s fingerprint.
    fn namespace_if_traced(&self, cache: &Cache, pid: Option<i32>, ns: NsId) -> Option<[u8; HASH_BYTES]> {
        self.traced_namespace(cache, pid, ns).map(|k| k.fingerprint.0)
    }

    fn lookup(
        &self,
        cache: &Cache,
        s: SessionId,
        pid: i32,
        ns: NsId,
        hashes: &[[u8; HASH_BYTES]],
        reply: &Response,
    ) {
        let Some(key) = self.traced_namespace(cache, Some(pid), ns) else {
            return;
        };
        let fp = key.fingerprint.0;
        let stop = {
            let cache = cache.read();
            match reply {
                Response::LookupOk(LookupGrant {
                    hit_blocks,
                    generation,
                    ..
                }) => {
                    let hit = *hit_blocks as usize;
                    hashes.get(hit).map(|h| {
                        let block = BlockKey {
                            ns,
                            generation: *generation,
                            hash: *h,
                        };
                        (hit, block, cache.explain_miss(ns, h))
                    })
                }
                _ => None,
            }
        };
        let mut event = json!({
            "event": "lookup", "pid": pid, "session": s.0, "namespace": hex(&fp),
            "shard": key.shard, "salted": key.salt != [0; 32], "asked": hashes.len(),
        });
        let Some(m) = event.as_object_mut() else {
            return;
        };
        let mut granted = None;
        match reply {
            Response::LookupOk(g) => {
                m.insert("hit".into(), g.hit_blocks.into());
                m.insert("ssd_only".into(), g.ssd_blocks.len().into());
                m.insert("generation".into(), g.generation.into());
                m.insert("lease".into(), g.lease.into());
                granted = Some(g.lease); // `remember` skips 0 (nothing pinned)
            }
            Response::Error { message, .. } => {
                m.insert("error".into(), message.clone().into());
            }
            _ => return,
        }
        if let Some((block, block_key, why)) = stop {
            let mut st = json!({ "block": block, "hash": hex(&hashes[block]) });
            if let Some(o) = st.as_object_mut() {
                match why {
                    Ok(MissReason::Absent) if let Some(at) = self.left_at(&block_key) => {
                        o.insert("reason".into(), "evicted".into());
                        o.insert("left_us_ago".into(), micros(at).into());
                    }
                    Ok(r) => {
                        o.insert("reason".into(), r.as_str().into());
                        if let MissReason::BeingSaved(by) = r {
                            o.insert("saving_session".into(), by.0.into());
                        }
                    }
                    Err(e) => {
                        o.insert("reason".into(), format!("unknown ({e})").into());
                    }
                }
            }
            m.insert("stop".into(), st);
        }
        let mut g = self.inner();
        if let Some(lease) = granted {
            remember(&mut g, lease);
        }
        self.push(&mut g, event);
    }

    /// A TP group lookup (query control): one event for the group, stopped where
    /// the common prefix ends, explained for the first shard that lacks the block.
    fn lookup_tp(
        &self,
        cache: &Cache,
        s: SessionId,
        pid: i32,
        nss: &[u32],
        hashes: &[[u8; HASH_BYTES]],
        reply: &Response,
    ) {
        let Some(fp) = nss
            .first()
            .and_then(|ns| self.namespace_if_traced(cache, Some(pid), NsId(*ns)))
        else {
            return;
        };
        let mut event = json!({
            "event": "lookup_tp", "pid": pid, "session": s.0, "namespace": hex(&fp),
            "shards": nss.len(), "asked": hashes.len(),
        });
        let Some(m) = event.as_object_mut() else {
            return;
        };
        match reply {
            Response::TpLeaseOk(TpGrant { hit_blocks, .. }) => {
                m.insert("hit".into(), (*hit_blocks).into());
                let hit = *hit_blocks as usize;
                if let Some(h) = hashes.get(hit) {
                    let cache = cache.read();
                    let first_lacking = nss.iter().enumerate().find_map(|(shard, ns)| {
                        match cache.explain_miss(NsId(*ns), h) {
                            Ok(MissReason::VisibleNow) => None,
                            Ok(r) => Some((shard, r.as_str().to_string())),
                            Err(e) => Some((shard, format!("unknown ({e})"))),
                        }
                    });
                    drop(cache);
                    let mut st = json!({ "block": hit, "hash": hex(h) });
                    if let (Some(o), Some((shard, why))) = (st.as_object_mut(), first_lacking) {
                        o.insert("shard".into(), shard.into());
                        o.insert("reason".into(), why.into());
                    }
                    m.insert("stop".into(), st);
                }
            }
            Response::Error { message, .. } => {
                m.insert("error".into(), message.clone().into());
            }
            _ => return,
        }
        self.push(&mut self.inner(), event);
    }
}

/// Remember when `lease` was granted (for its lifetime at release).
fn remember(g: &mut Inner, lease: u64) {
    if lease == 0 {
        return;
    }
    if g.leases.len() >= MAX_LEASES {
        g.leases.clear();
    }
    g.leases.insert(lease, Instant::now());
}
