//! Tensor-parallel leases (contracts T1, T2): one lookup over every declared
//! shard of a TP group returns the common prefix and pins it in every shard
//! under one *TP lease*, named by an unforgeable token the Manager draws. Each
//! rank's worker session redeems its own shard's part with the token (no
//! second lookup) and then acquires and releases it as an ordinary lease.
//!
//! Ownership: the part of a rank that was not redeemed yet is an ordinary
//! `Granted` lease of the owner (the control-only scheduler session); a
//! redeemed part moves to the redeeming session, whose rules (quarantine on a
//! vanished connection, L2) apply from then on. The TP lease itself ends when
//! every part ended (each rank reported done: its lease was released or ended
//! with its session; a duplicate report finds the part done and changes
//! nothing), when its owner releases it or its owner's session ends (parts not
//! redeemed are released then; redeemed parts stay with their workers), or
//! when it expires unredeemed (a rank died before redeeming).
//!
//! Layer 1: calls down into `leases` (pins) and `registry`, never up.

use super::concurrent::HotCounters;
use super::leases::{LeaseRecord, LeaseState, TpLeaseRecord, TpPart, TpToken};
use super::{CacheError, CacheState};
use crate::keys::{BlockHash, BlockKey, LeaseId, NsId, SessionId};

/// Most shards one TP lease may declare (TP ranks on one host).
pub const MAX_TP_SHARDS: usize = 64;

/// Result of a TP lookup: the common prefix of every shard, pinned in all of
/// them under `token` (None when the common prefix is empty).
#[derive(Debug, Clone)]
pub struct TpLookupResult {
    pub token: Option<TpToken>,
    pub hit_blocks: u32,
    /// Indices (ascending) of hit blocks some shard holds on SSD only.
    pub ssd_blocks: Vec<u32>,
    pub generation: u64,
}

/// A redeemed part: an ordinary lease of the redeeming session.
#[derive(Debug, Clone)]
pub struct TpRedeemed {
    pub lease: LeaseId,
    pub hit_blocks: u32,
    /// Indices (ascending) of this shard's hit blocks on SSD only now.
    pub ssd_blocks: Vec<u32>,
    pub generation: u64,
}

impl CacheState {
    /// Look `hashes` up in every shard namespace of `nss` (shard `i` at index
    /// `i`, one fingerprint, one salt, one block size: equal TP-only shards of
    /// one group), and pin the common prefix in each under one TP lease named
    /// `token`, owned by session `s` of peer `uid`, expiring at `expires_at_ms`.
    pub fn lookup_tp(
        &mut self,
        s: SessionId,
        uid: u32,
        nss: &[NsId],
        hashes: &[BlockHash],
        token: TpToken,
        expires_at_ms: u64,
    ) -> Result<TpLookupResult, CacheError> {
        self.live_session(s)?;
        self.check_tp_group(nss)?;
        self.lookup_tp_part(s, Some(uid), nss, hashes, token, expires_at_ms)
    }

    /// The part of a TP lookup that this Manager holds when the group's shards
    /// live on several Managers (T1 across Managers): pin the common prefix of
    /// `hashes` over `nss` (some shards of one group, each once, in any order)
    /// under a TP lease named `token`. `uid`: the only uid whose sessions may
    /// redeem its parts; `None` for a lease pinned for a peer Manager (whose
    /// ranks' workers are this Manager's clients; the token is the capability).
    /// The caller trims it to the prefix common to every Manager with
    /// [`CacheState::trim_tp`] before handing the token out.
    pub fn lookup_tp_part(
        &mut self,
        s: SessionId,
        uid: Option<u32>,
        nss: &[NsId],
        hashes: &[BlockHash],
        token: TpToken,
        expires_at_ms: u64,
    ) -> Result<TpLookupResult, CacheError> {
        self.live_session(s)?;
        self.check_tp_shards(nss)?;
        if self.tp.contains_key(&token) {
            return Err(CacheError::TpGroup("token collision; retry".into()));
        }
        let generation = self.generation_of(nss[0])?;
        self.counters.tp_lookups += 1;
        HotCounters::add(&self.hot.lookup_blocks, hashes.len() as u64);
        let mut common = hashes.len();
        for &ns in nss {
            let present = hashes
                .iter()
                .take(common)
                .take_while(|h| {
                    let key = BlockKey {
                        ns,
                        generation,
                        hash: **h,
                    };
                    self.index.get(&key).is_some_and(|e| !e.doomed)
                })
                .count();
            common = common.min(present);
        }
        if common == 0 {
            return Ok(TpLookupResult {
                token: None,
                hit_blocks: 0,
                ssd_blocks: Vec::new(),
                generation,
            });
        }
        let mut ssd = std::collections::BTreeSet::new();
        let mut parts = Vec::with_capacity(nss.len());
        for &ns in nss {
            let keys: Vec<BlockKey> = hashes[..common]
                .iter()
                .map(|h| BlockKey {
                    ns,
                    generation,
                    hash: *h,
                })
                .collect();
            ssd.extend(self.ssd_only(&keys));
            let id = self.grant_lease(s, ns, keys, Some(token));
            parts.push(TpPart::Pending(id));
        }
        let hit_blocks = common as u32;
        let ssd_blocks: Vec<u32> = ssd.into_iter().collect();
        HotCounters::add(&self.hot.hit_blocks, u64::from(hit_blocks));
        HotCounters::add(&self.hot.ssd_hit_blocks, ssd_blocks.len() as u64);
        self.counters.tp_leases_granted += 1;
        self.apply_touches();
        self.tp.insert(
            token,
            TpLeaseRecord {
                owner: s,
                uid,
                nss: nss.to_vec(),
                parts,
                expires_at_ms,
            },
        );
        Ok(TpLookupResult {
            token: Some(token),
            hit_blocks,
            ssd_blocks,
            generation,
        })
    }

    /// Keep only the first `blocks` blocks of every part of the TP lease
    /// `token` (owned by `s`, no part redeemed yet) pinned: the prefix common
    /// to every Manager of a group spread over several. `0` ends the TP lease.
    /// Returns the blocks pinned now.
    pub fn trim_tp(&mut self, s: SessionId, token: TpToken, blocks: u32) -> Result<u32, CacheError> {
        let tp = self.tp.get(&token).ok_or(CacheError::UnknownTpLease)?;
        if tp.owner != s {
            return Err(CacheError::NotOwner {
                what: "TP lease",
                id: s.0,
            });
        }
        let mut ids = Vec::with_capacity(tp.parts.len());
        for part in &tp.parts {
            match part {
                TpPart::Pending(l) => ids.push(*l),
                TpPart::Redeemed(_) | TpPart::Done => {
                    return Err(CacheError::TpGroup(
                        "a TP lease is trimmed before its token is handed out".into(),
                    ));
                }
            }
        }
        if blocks == 0 {
            self.end_tp(token);
            return Ok(0);
        }
        let keep = blocks as usize;
        let mut pinned = u32::MAX;
        let mut trimmed = 0;
        for l in ids {
            let tail = match self.leases.get_mut(l) {
                Some(lease) if lease.keys.len() > keep => lease.keys.split_off(keep),
                Some(lease) => {
                    pinned = pinned.min(lease.keys.len() as u32);
                    continue;
                }
                None => return Err(CacheError::UnknownLease(l)),
            };
            trimmed = trimmed.max(tail.len());
            for k in tail {
                if let Some(e) = self.index.get(&k) {
                    e.unpin();
                }
                self.reap_if_doomed(k);
            }
            pinned = pinned.min(blocks);
        }
        HotCounters::sub(&self.hot.hit_blocks, trimmed as u64);
        Ok(pinned)
    }

    /// TP leases owned by session `s` now.
    pub fn tp_leases_of(&self, s: SessionId) -> usize {
        self.tp.values().filter(|t| t.owner == s).count()
    }

    /// Whether session `s` is open and not quarantined (a TP lease's owner
    /// that is gone ends the parts other Managers pinned for it).
    pub fn session_is_live(&self, s: SessionId) -> bool {
        self.sessions.get(&s).is_some_and(|i| !i.quarantined)
    }

    /// Shards of one group, each once: one fingerprint, salt and block size.
    fn check_tp_shards(&self, nss: &[NsId]) -> Result<(), CacheError> {
        if nss.is_empty() || nss.len() > MAX_TP_SHARDS {
            return Err(CacheError::TpGroup(format!(
                "a TP lookup declares 1 to {MAX_TP_SHARDS} shards, got {}",
                nss.len()
            )));
        }
        let first = self.ns(nss[0])?;
        let (fp, salt, bytes) = (first.key.fingerprint, first.key.salt, first.block_bytes);
        let mut seen = std::collections::BTreeSet::new();
        for &ns in nss {
            let info = self.ns(ns)?;
            if !seen.insert(info.key.shard) {
                return Err(CacheError::TpGroup(format!(
                    "shard {} declared twice",
                    info.key.shard
                )));
            }
            if info.key.fingerprint != fp || info.key.salt != salt || info.block_bytes != bytes {
                return Err(CacheError::TpGroup(format!(
                    "namespace {} differs from the first shard declared in fingerprint, salt or block size: one TP group only",
                    ns.0
                )));
            }
        }
        Ok(())
    }

    /// Every namespace registered, shards `0..n` in order, one fingerprint,
    /// salt and block size.
    pub fn check_tp_group(&self, nss: &[NsId]) -> Result<(), CacheError> {
        self.check_tp_shards(nss)?;
        for (i, &ns) in nss.iter().enumerate() {
            let shard = self.ns(ns)?.key.shard;
            if shard as usize != i {
                return Err(CacheError::TpGroup(format!(
                    "namespace {} at position {i} is shard {shard}: declare shards 0..{} in order",
                    ns.0,
                    nss.len()
                )));
            }
        }
        Ok(())
    }

    /// Take shard `ns`'s part of the TP lease `token` into session `s` (of peer
    /// `uid`): its lease becomes `s`'s, to acquire and release as any other.
    pub fn redeem_tp(
        &mut self,
        s: SessionId,
        uid: u32,
        token: TpToken,
        ns: NsId,
    ) -> Result<TpRedeemed, CacheError> {
        self.live_session(s)?;
        let tp = self.tp.get(&token).ok_or(CacheError::UnknownTpLease)?;
        if tp.uid.is_some_and(|u| u != uid) {
            return Err(CacheError::NotOwner {
                what: "TP lease (another uid)",
                id: u64::from(uid),
            });
        }
        let Some(idx) = tp.nss.iter().position(|&n| n == ns) else {
            return Err(CacheError::TpGroup(format!(
                "namespace {} is not a shard of this TP lease",
                ns.0
            )));
        };
        let owner = tp.owner;
        let lease = match tp.parts[idx] {
            TpPart::Pending(l) => l,
            TpPart::Redeemed(_) | TpPart::Done => {
                return Err(CacheError::TpGroup(format!(
                    "shard {idx} of this TP lease was redeemed already"
                )));
            }
        };
        let generation = self.generation_of(ns)?;
        let l = self
            .leases
            .get_mut(lease)
            .ok_or(CacheError::UnknownLease(lease))?;
        l.session = s;
        let hit_blocks = l.keys.len() as u32;
        let keys = l.keys.clone();
        let ssd_blocks = self.ssd_only(&keys);
        // A transfer between sessions, not an end: the lease lives on.
        if let Some(info) = self.sessions.get_mut(&owner) {
            info.leases.get_mut().remove(&lease);
        }
        self.live_session(s)?.leases.get_mut().insert(lease);
        if let Some(tp) = self.tp.get_mut(&token) {
            tp.parts[idx] = TpPart::Redeemed(lease);
        }
        self.counters.tp_parts_redeemed += 1;
        Ok(TpRedeemed {
            lease,
            hit_blocks,
            ssd_blocks,
            generation,
        })
    }

    /// The owner ends its TP lease: parts not redeemed are released (no
    /// address was handed out for them); redeemed parts stay with their workers.
    ///
    /// When every rank has redeemed its part, nothing is left for the owner to
    /// end: the TP lease ends with its last part, counted completed. The ranks
    /// release their parts on their own sessions, so the Manager may apply the
    /// owner's release first even when the ranks sent theirs before the owner
    /// (an adapter's ranks report a load only after releasing); the count then
    /// does not depend on which session thread ran first.
    pub fn release_tp(&mut self, s: SessionId, token: TpToken) -> Result<(), CacheError> {
        self.live_session(s)?;
        let tp = self.tp.get(&token).ok_or(CacheError::UnknownTpLease)?;
        if tp.owner != s {
            return Err(CacheError::NotOwner {
                what: "TP lease",
                id: s.0,
            });
        }
        if tp.parts.iter().all(|p| !matches!(p, TpPart::Pending(_))) {
            return Ok(());
        }
        self.end_tp(token);
        self.counters.tp_leases_released += 1;
        Ok(())
    }

    /// End every TP lease owned by `s` (its session is ending).
    pub(super) fn end_tp_of_session(&mut self, s: SessionId) {
        let owned: Vec<TpToken> = self
            .tp
            .iter()
            .filter(|(_, t)| t.owner == s)
            .map(|(k, _)| *k)
            .collect();
        for token in owned {
            self.end_tp(token);
        }
    }

    /// Would [`Self::expire_tp`] at `now_ms` end anything? A check under the
    /// shared lock, so the Manager's reaper takes the exclusive lock (which
    /// stalls every lookup) only when a TP lease is due.
    pub fn tp_expiry_due(&self, now_ms: u64) -> bool {
        self.tp.values().any(|t| t.expires_at_ms <= now_ms)
    }

    /// End TP leases whose deadline passed (a rank died before redeeming its
    /// part). Returns how many ended.
    pub fn expire_tp(&mut self, now_ms: u64) -> usize {
        let due: Vec<TpToken> = self
            .tp
            .iter()
            .filter(|(_, t)| t.expires_at_ms <= now_ms)
            .map(|(k, _)| *k)
            .collect();
        for token in &due {
            self.end_tp(*token);
            self.counters.tp_leases_expired += 1;
        }
        due.len()
    }

    /// Forget a TP lease; release the parts still pending (owned by the owner,
    /// `Granted`: no copy can read them).
    fn end_tp(&mut self, token: TpToken) {
        let Some(tp) = self.tp.remove(&token) else {
            return;
        };
        for part in tp.parts {
            if let TpPart::Pending(l) = part {
                self.end_lease(l);
            }
        }
    }

    /// Parts of a live TP lease (tests and status).
    pub fn tp_parts(&self, token: TpToken) -> Option<Vec<TpPart>> {
        self.tp.get(&token).map(|t| t.parts.clone())
    }

    pub(super) fn check_tp_invariants(&self) -> Result<(), String> {
        for (token, tp) in &self.tp {
            if tp.parts.iter().all(|p| *p == TpPart::Done) {
                return Err(format!("{token:?}: every part is done but the TP lease lives"));
            }
            for (i, part) in tp.parts.iter().enumerate() {
                let (l, owner) = match part {
                    TpPart::Pending(l) => (*l, Some(tp.owner)),
                    TpPart::Redeemed(l) => (*l, None),
                    TpPart::Done => continue,
                };
                let check = |lease: &mut LeaseRecord| {
                    if lease.tp != Some(*token) || lease.ns != tp.nss[i] {
                        return Err(format!("{token:?}: part {i} lease does not belong to it"));
                    }
                    if owner.is_some_and(|o| o != lease.session)
                        || (owner.is_some() && lease.state != LeaseState::Granted)
                    {
                        return Err(format!(
                            "{token:?}: pending part {i} is not a granted lease of the owner"
                        ));
                    }
                    Ok(())
                };
                self.leases
                    .with(l, check)
                    .ok_or(format!("{token:?}: part {i} names an ended lease"))??;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{AcquireStep, SessionEnd};
    use crate::keys::{Fingerprint, NamespaceKey};

    const BLOCK: u64 = 4096;
    const UID: u32 = 1000;
    const T: TpToken = TpToken([7; 16]);

    struct Tp {
        c: CacheState,
        nss: Vec<NsId>,
        sched: SessionId,
    }

    fn h(i: u8) -> BlockHash {
        [i; 32]
    }

    fn ns_key(fp: u8, shard: u32) -> NamespaceKey {
        NamespaceKey {
            fingerprint: Fingerprint([fp; 32]),
            shard,
            salt: [0; 32],
        }
    }

    /// `ranks` shards; shard `r` holds blocks `0..present[r]`.
    fn setup(present: &[u8]) -> Tp {
        let mut c = CacheState::new(&[64 * BLOCK]);
        let saver = c.open_session();
        let mut nss = Vec::new();
        for (r, &n) in present.iter().enumerate() {
            let (ns, _) = c.register_namespace(ns_key(1, r as u32), BLOCK).expect("ns");
            let hs: Vec<BlockHash> = (0..n).map(h).collect();
            let (id, _) = c.begin_save(saver, ns, &hs).expect("begin");
            c.commit_save(saver, id).expect("commit");
            nss.push(ns);
        }
        c.end_session(saver, SessionEnd::Clean).expect("end");
        let sched = c.open_session();
        Tp { c, nss, sched }
    }

    fn hashes(n: u8) -> Vec<BlockHash> {
        (0..n).map(h).collect()
    }

    impl Tp {
        /// The scheduler's TP lookup of blocks `0..n` over every shard (token `T`).
        fn lookup(&mut self, n: u8) -> TpLookupResult {
            self.c
                .lookup_tp(self.sched, UID, &self.nss, &hashes(n), T, 1000)
                .expect("lookup")
        }
    }

    /// `setup(present)`, the scheduler's TP lookup of blocks `0..n`, and a new
    /// worker session with its redeemed part of shard `rank`.
    fn redeemed(present: &[u8], n: u8, rank: usize) -> (Tp, SessionId, TpRedeemed) {
        let mut t = setup(present);
        t.lookup(n);
        let w = t.c.open_session();
        let got = t.c.redeem_tp(w, UID, T, t.nss[rank]).expect("redeem");
        (t, w, got)
    }

    fn pins(c: &CacheState) -> u64 {
        c.gauges().pinned_blocks
    }

    #[test]
    fn the_common_prefix_is_pinned_in_every_shard_and_ends_with_the_last_rank() {
        let mut t = setup(&[4, 2, 4]);
        let r = t.lookup(4);
        assert_eq!((r.token, r.hit_blocks), (Some(T), 2));
        assert_eq!(
            pins(&t.c),
            6,
            "the common prefix (2 blocks) pinned in each of 3 shards"
        );
        t.c.check_invariants().expect("invariants");
        let workers: Vec<SessionId> = (0..3).map(|_| t.c.open_session()).collect();
        for (rank, &w) in workers.iter().enumerate() {
            let got = t.c.redeem_tp(w, UID, T, t.nss[rank]).expect("redeem");
            assert_eq!(got.hit_blocks, 2);
            assert!(matches!(t.c.acquire(w, got.lease), Ok(AcquireStep::Ready(s)) if s.len() == 2));
            t.c.check_invariants().expect("invariants");
            t.c.release(w, got.lease).expect("release");
            // A duplicate report counts once: the part is done, nothing else moves.
            assert_eq!(
                t.c.release(w, got.lease),
                Err(CacheError::UnknownLease(got.lease))
            );
            t.c.check_invariants().expect("invariants");
            let left = t.c.tp_parts(T);
            if rank < 2 {
                let parts = left.expect("lives until every rank reported");
                assert_eq!(parts.iter().filter(|p| **p == TpPart::Done).count(), rank + 1);
            } else {
                assert!(left.is_none(), "the last rank's report ends the TP lease");
            }
        }
        assert_eq!(pins(&t.c), 0);
        assert_eq!(t.c.counters().tp_leases_completed, 1);
        assert_eq!(t.c.gauges().live_leases, 0);
        // The owner's late release finds nothing to end.
        assert_eq!(t.c.release_tp(t.sched, T), Err(CacheError::UnknownTpLease));
    }

    #[test]
    fn the_owner_releasing_before_the_ranks_applied_theirs_still_counts_the_lease_completed() {
        // Every rank redeemed its part; the owner's release is applied before the
        // ranks' (they come on other sessions): nothing is ended early, and the TP
        // lease is completed by the last part, as when the owner came last.
        let mut t = setup(&[2, 2]);
        t.lookup(2);
        let ranks: Vec<(SessionId, LeaseId)> = (0..2)
            .map(|i| {
                let w = t.c.open_session();
                (w, t.c.redeem_tp(w, UID, T, t.nss[i]).expect("redeem").lease)
            })
            .collect();
        t.c.release_tp(t.sched, T).expect("owner release");
        t.c.release_tp(t.sched, T)
            .expect("a repeated owner release is a no-op");
        assert_eq!(pins(&t.c), 4, "the ranks still hold their parts");
        assert_eq!(t.c.counters().tp_leases_released, 0);
        for (w, l) in ranks {
            t.c.check_invariants().expect("invariants");
            t.c.release(w, l).expect("rank release");
        }
        assert_eq!(pins(&t.c), 0);
        assert!(t.c.tp_parts(T).is_none());
        assert_eq!(t.c.counters().tp_leases_completed, 1);
        assert_eq!(t.c.gauges().live_leases, 0);
        t.c.check_invariants().expect("invariants");
    }

    #[test]
    fn a_shard_missing_the_first_block_is_a_miss_for_all() {
        let mut t = setup(&[3, 0]);
        let r = t.lookup(3);
        assert_eq!((r.token, r.hit_blocks), (None, 0));
        assert_eq!(pins(&t.c), 0);
        assert_eq!(t.c.gauges().live_leases, 0);
    }

    #[test]
    fn redeem_is_bound_to_uid_namespace_and_once_per_shard() {
        let mut t = setup(&[2, 2]);
        t.lookup(2);
        let w = t.c.open_session();
        assert!(matches!(
            t.c.redeem_tp(w, UID + 1, T, t.nss[0]),
            Err(CacheError::NotOwner { .. })
        ));
        assert_eq!(
            t.c.redeem_tp(w, UID, TpToken([8; 16]), t.nss[0]).map(|r| r.lease),
            Err(CacheError::UnknownTpLease)
        );
        let (other, _) = t.c.register_namespace(ns_key(2, 0), BLOCK).expect("ns");
        assert!(matches!(
            t.c.redeem_tp(w, UID, T, other),
            Err(CacheError::TpGroup(_))
        ));
        let first = t.c.redeem_tp(w, UID, T, t.nss[0]).expect("redeem");
        let w2 = t.c.open_session();
        assert!(matches!(
            t.c.redeem_tp(w2, UID, T, t.nss[0]),
            Err(CacheError::TpGroup(_))
        ));
        // Only the owner may end the TP lease; only the redeemer may release its part.
        assert!(matches!(t.c.release_tp(w, T), Err(CacheError::NotOwner { .. })));
        assert!(matches!(
            t.c.release(w2, first.lease),
            Err(CacheError::NotOwner { .. })
        ));
        t.c.check_invariants().expect("invariants");
    }

    #[test]
    fn the_owner_ending_releases_unredeemed_parts_and_leaves_redeemed_ones_to_workers() {
        let (mut t, w, got) = redeemed(&[2, 2], 2, 0);
        assert!(matches!(t.c.acquire(w, got.lease), Ok(AcquireStep::Ready(_))));
        t.c.end_session(t.sched, SessionEnd::Vanished).expect("end");
        t.c.check_invariants().expect("invariants");
        assert!(t.c.tp_parts(T).is_none());
        assert!(!t.c.is_quarantined(t.sched), "the owner held only granted parts");
        assert_eq!(pins(&t.c), 2, "rank 0's acquired part stays pinned");
        // Rank 0's process dies mid-copy: quarantined until it is proven gone (L2).
        t.c.end_session(w, SessionEnd::Vanished).expect("vanish");
        assert!(t.c.is_quarantined(w));
        assert_eq!(pins(&t.c), 2);
        t.c.process_gone(w).expect("gone");
        assert_eq!(pins(&t.c), 0);
        assert_eq!(t.c.gauges().live_leases, 0);
        t.c.check_invariants().expect("invariants");
    }

    #[test]
    fn a_tp_lease_never_redeemed_by_a_rank_expires() {
        let (mut t, w, got) = redeemed(&[2, 2], 2, 0);
        t.c.release(w, got.lease).expect("release");
        assert!(!t.c.tp_expiry_due(999), "the reaper's shared-lock check agrees");
        assert_eq!(t.c.expire_tp(999), 0);
        assert!(t.c.tp_expiry_due(1000));
        assert_eq!(t.c.expire_tp(1000), 1);
        assert!(!t.c.tp_expiry_due(u64::MAX), "nothing left to expire");
        assert_eq!(pins(&t.c), 0, "rank 1 never came: its part is released");
        assert_eq!(t.c.counters().tp_leases_expired, 1);
        let w1 = t.c.open_session();
        assert_eq!(
            t.c.redeem_tp(w1, UID, T, t.nss[1]).map(|r| r.lease),
            Err(CacheError::UnknownTpLease)
        );
        t.c.check_invariants().expect("invariants");
    }

    #[test]
    fn the_owner_release_keeps_redeemed_parts_until_their_workers_drain() {
        let (mut t, w, got) = redeemed(&[3, 3], 3, 1);
        assert!(matches!(t.c.acquire(w, got.lease), Ok(AcquireStep::Ready(_))));
        t.c.release_tp(t.sched, T).expect("release_tp");
        assert_eq!(pins(&t.c), 3, "shard 0's part released, shard 1's still copying");
        t.c.check_invariants().expect("invariants");
        t.c.release(w, got.lease).expect("release");
        assert_eq!(pins(&t.c), 0);
        assert_eq!(t.c.counters().tp_leases_released, 1);
    }

    #[test]
    fn a_tp_group_must_be_equal_shards_in_order() {
        let mut t = setup(&[1, 1]);
        let swapped = [t.nss[1], t.nss[0]];
        assert!(matches!(
            t.c.lookup_tp(t.sched, UID, &swapped, &hashes(1), T, 1000),
            Err(CacheError::TpGroup(_))
        ));
        let (foreign, _) = t.c.register_namespace(ns_key(2, 1), BLOCK).expect("ns");
        assert!(matches!(
            t.c.lookup_tp(t.sched, UID, &[t.nss[0], foreign], &hashes(1), T, 1000),
            Err(CacheError::TpGroup(_))
        ));
        assert!(matches!(
            t.c.lookup_tp(t.sched, UID, &[], &hashes(1), T, 1000),
            Err(CacheError::TpGroup(_))
        ));
        assert_eq!(t.c.gauges().live_leases, 0);
    }

    #[test]
    fn a_generation_reset_is_refused_while_a_tp_lease_pins_blocks() {
        let mut t = setup(&[1, 1]);
        t.lookup(1);
        assert!(matches!(
            t.c.bump_generation(t.nss[0]),
            Err(CacheError::Busy { .. })
        ));
        t.c.release_tp(t.sched, T).expect("release");
        t.c.bump_generation(t.nss[0]).expect("reset");
    }

    #[test]
    fn a_part_pinned_for_a_peer_is_trimmed_to_the_common_prefix_and_redeemed_by_any_uid() {
        let mut t = setup(&[0, 5, 3]);
        let part = [t.nss[2], t.nss[1]];
        let r =
            t.c.lookup_tp_part(t.sched, None, &part, &hashes(5), T, 1000)
                .expect("part");
        assert_eq!((r.token, r.hit_blocks), (Some(T), 3));
        assert_eq!(pins(&t.c), 6);
        // The scheduler's Manager found 2 in common: the rest is unpinned.
        assert_eq!(t.c.trim_tp(t.sched, T, 2), Ok(2));
        assert_eq!(pins(&t.c), 4);
        assert_eq!(t.c.trim_tp(t.sched, T, 9), Ok(2), "never grows");
        t.c.check_invariants().expect("invariants");
        let w = t.c.open_session();
        assert!(matches!(t.c.trim_tp(w, T, 1), Err(CacheError::NotOwner { .. })));
        let got = t.c.redeem_tp(w, UID + 7, T, t.nss[1]).expect("any uid");
        assert_eq!(got.hit_blocks, 2);
        assert!(
            matches!(t.c.trim_tp(t.sched, T, 1), Err(CacheError::TpGroup(_))),
            "no trim once a part is out"
        );
        t.c.release(w, got.lease).expect("release");
        // The owner (the peer link's session) ends: the unredeemed part goes.
        t.c.end_session(t.sched, SessionEnd::Clean).expect("end");
        assert_eq!(pins(&t.c), 0);
        assert!(t.c.tp_parts(T).is_none());
        t.c.check_invariants().expect("invariants");
    }

    #[test]
    fn trimming_to_zero_ends_the_part_and_shards_are_declared_once() {
        let mut t = setup(&[2, 2]);
        assert!(matches!(
            t.c.lookup_tp_part(t.sched, None, &[t.nss[1], t.nss[1]], &hashes(2), T, 1000),
            Err(CacheError::TpGroup(_))
        ));
        t.c.lookup_tp_part(t.sched, Some(UID), &[t.nss[1]], &hashes(2), T, 1000)
            .expect("part");
        assert_eq!(t.c.tp_leases_of(t.sched), 1);
        assert_eq!(t.c.trim_tp(t.sched, T, 0), Ok(0));
        assert_eq!(pins(&t.c), 0);
        assert_eq!(t.c.tp_leases_of(t.sched), 0);
        assert_eq!(t.c.gauges().live_leases, 0);
        assert!(t.c.session_is_live(t.sched));
        t.c.check_invariants().expect("invariants");
    }
}
