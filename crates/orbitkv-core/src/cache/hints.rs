//! Retention hints from applications: "these blocks return by then" (keep),
//! "these do not return" (done), "forget what I said" (clear). The policy
//! holds hinted blocks (`policy/retention.rs`); this module resolves a
//! request's hashes to blocks, and remembers hints on blocks not visible yet
//! (an engine's last saves commit after the request that hinted them
//! finished), bounded, applied when those blocks commit.
//!
//! A hint only reaches blocks of its own namespace (keys carry it), never
//! pins anything and never ends a lease: leased blocks are never evicted,
//! hinted or not. A keep over the cap displaces only the same namespace's
//! kept blocks.

use std::collections::{HashMap, VecDeque};

use super::{CacheError, CacheState};
use crate::keys::{BlockHash, BlockKey, NsId, SessionId};
use crate::policy::RetentionStats;
use crate::table::BlockRef;

/// The longest keep a hint may ask for (24 hours).
pub const MAX_RETAIN_TTL_MS: u64 = 24 * 3600 * 1000;
/// Hints remembered for blocks not visible yet; the oldest leave first.
pub const MAX_PENDING_HINTS: usize = 65_536;
/// How long a done hint waits for its block to commit.
const PENDING_DONE_MS: u64 = 60_000;

/// What a hint says about a chain of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retain {
    /// Expected back within `ttl_ms` (1 ms to [`MAX_RETAIN_TTL_MS`]).
    Keep { ttl_ms: u64 },
    /// Not expected back.
    Done,
    /// Drop earlier hints on these blocks.
    Clear,
}

/// What one hint did: blocks it applied to, blocks it will apply to when they
/// commit, and blocks it could not keep (the cap).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetainOutcome {
    pub applied: u32,
    pub pending: u32,
    pub refused: u32,
}

/// Hint counters and gauges, exported as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HintStats {
    pub retention: RetentionStats,
    pub requests_total: u64,
    pub pending_blocks: u64,
    pub pending_applied_total: u64,
    /// Pending hints dropped: expired before their block committed, or the
    /// oldest when [`MAX_PENDING_HINTS`] were waiting.
    pub pending_dropped_total: u64,
}

#[derive(Debug, Clone, Copy)]
enum PendingHold {
    Keep { until_ms: u64 },
    Done { until_ms: u64 },
}

impl PendingHold {
    fn until_ms(self) -> u64 {
        match self {
            PendingHold::Keep { until_ms } | PendingHold::Done { until_ms } => until_ms,
        }
    }
}

/// Hints on blocks not visible yet.
#[derive(Debug, Default)]
pub(super) struct PendingHints {
    map: HashMap<BlockKey, PendingHold>,
    order: VecDeque<BlockKey>,
    requests: u64,
    applied: u64,
    dropped: u64,
}

impl PendingHints {
    fn remember(&mut self, key: BlockKey, hold: PendingHold) {
        if self.map.insert(key, hold).is_none() {
            self.order.push_back(key);
        }
        while self.map.len() > MAX_PENDING_HINTS {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if self.map.remove(&old).is_some() {
                self.dropped += 1;
            }
        }
    }

    fn expire(&mut self, now_ms: u64) {
        let before = self.map.len();
        self.map.retain(|_, h| h.until_ms() > now_ms);
        self.dropped += (before - self.map.len()) as u64;
        let map = &self.map;
        self.order.retain(|k| map.contains_key(k));
    }
}

impl CacheState {
    /// Cap the bytes hints may keep (0: hints are refused).
    pub fn set_retention_cap(&mut self, bytes: u64) {
        self.policy.get().set_retention_cap(bytes);
    }

    pub fn hint_stats(&self) -> HintStats {
        HintStats {
            retention: self.policy.lock().retention_stats(),
            requests_total: self.hints.requests,
            pending_blocks: self.hints.map.len() as u64,
            pending_applied_total: self.hints.applied,
            pending_dropped_total: self.hints.dropped,
        }
    }

    /// Apply a hint from session `s` to the blocks of `hashes` (a chain,
    /// prefix first) in `ns`, at `now_ms` on the caller's clock.
    pub fn retain(
        &mut self,
        s: SessionId,
        ns: NsId,
        hashes: &[BlockHash],
        what: Retain,
        now_ms: u64,
    ) -> Result<RetainOutcome, CacheError> {
        self.session(s)?;
        let generation = self.generation_of(ns)?;
        let policy = self.policy.get();
        if policy.retention_stats().cap_bytes == 0 {
            return Err(CacheError::RetentionOff);
        }
        if let Retain::Keep { ttl_ms } = what
            && !(1..=MAX_RETAIN_TTL_MS).contains(&ttl_ms)
        {
            return Err(CacheError::BadHint(format!(
                "keep for {ttl_ms} ms: must be 1 to {MAX_RETAIN_TTL_MS} ms (24 hours)"
            )));
        }
        self.hints.requests += 1;
        let mut refs: Vec<BlockRef> = Vec::with_capacity(hashes.len());
        let mut absent = Vec::new();
        for key in BlockKey::chain(ns, generation, hashes) {
            match self.index.get_ref(&key) {
                Some((r, e)) if !e.doomed => refs.push(r),
                _ => absent.push(key),
            }
        }
        let policy = self.policy.get();
        let mut out = RetainOutcome::default();
        let pending = match what {
            Retain::Keep { ttl_ms } => {
                let until_ms = now_ms.saturating_add(ttl_ms);
                (out.applied, out.refused) = policy.hint_keep(&refs, ns.0, until_ms);
                Some(PendingHold::Keep { until_ms })
            }
            Retain::Done => {
                out.applied = policy.hint_done(&refs);
                Some(PendingHold::Done {
                    until_ms: now_ms.saturating_add(PENDING_DONE_MS),
                })
            }
            Retain::Clear => {
                out.applied = policy.hint_clear(&refs);
                for k in &absent {
                    self.hints.map.remove(k);
                }
                None
            }
        };
        if let Some(hold) = pending {
            for k in absent {
                self.hints.remember(k, hold);
                out.pending += 1;
            }
        }
        Ok(out)
    }

    /// Blocks just made visible: apply the hints that waited for them.
    /// `keys[i]` is known to the policy as `visible[i].0`.
    pub(super) fn apply_pending_hints(&mut self, keys: &[BlockKey], visible: &[(BlockRef, u64)]) {
        if self.hints.map.is_empty() {
            return;
        }
        for (key, (r, _)) in keys.iter().zip(visible) {
            let Some(hold) = self.hints.map.remove(key) else {
                continue;
            };
            self.hints.applied += 1;
            let policy = self.policy.get();
            match hold {
                PendingHold::Keep { until_ms } => {
                    policy.hint_keep(&[*r], key.ns.0, until_ms);
                }
                PendingHold::Done { .. } => {
                    policy.hint_done(&[*r]);
                }
            }
        }
    }

    /// Is a kept block's deadline at or before `now_ms`? (A check under the
    /// shared lock before taking the exclusive one.)
    pub fn hint_expiry_due(&self, now_ms: u64) -> bool {
        self.policy
            .lock()
            .next_hint_deadline()
            .is_some_and(|t| t <= now_ms)
    }

    /// Release kept blocks whose deadline passed and forget pending hints
    /// that expired; returns the blocks released.
    pub fn expire_hints(&mut self, now_ms: u64) -> usize {
        self.hints.expire(now_ms);
        self.policy.get().expire_hints(now_ms)
    }
}
