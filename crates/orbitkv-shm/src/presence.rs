//! The presence table: a shared-memory answer to "is this block certainly
//! absent?" that a client reads without sending the Manager a message.
//!
//! The Manager is the only writer ([`PresenceWriter`], under its cache lock);
//! clients map the same memfd read-only ([`PresenceView`]; the Manager seals
//! it with `F_SEAL_FUTURE_WRITE`, so no one can map it writable again).
//!
//! Layout (little-endian 64-bit words, every access atomic):
//!
//! ```text
//! word 0  MAGIC                       word 4  max_probe (largest displacement)
//! word 1  seq (seqlock: odd = writing) word 5  entries
//! word 2  slots (a power of two)      word 6  flags (SATURATED, CLOSED)
//! word 3  reserved                    word 7  reserved
//! word 8.. slots: 0 = empty, else a 64-bit fingerprint
//! ```
//!
//! An open-addressing table with linear probing and backward-shift deletion
//! (no tombstones) holding one fingerprint per *visible* block: inserted when
//! a block becomes visible, removed when it stops being visible (evicted,
//! dropped, doomed by a generation reset or a failed read). It is a multiset:
//! two blocks with the same fingerprint occupy two slots.
//!
//! **What a reader may conclude.** `Absent` is an answer for the table's state
//! at one instant (a seqlock read: the sequence word is the same, and even,
//! before and after the probe). `Maybe` (found, saturated, garbage, torn read
//! retried too often) promises nothing: the caller asks the Manager, whose
//! lookup takes a lease on bytes that are really there. So a stale or torn
//! read can cost an extra lookup (false positive) or a recompute of a block
//! that appeared a moment ago (the same race any lookup has); it can never
//! produce a hit on bytes that are not there, because a hit only ever comes
//! from the Manager.
//!
//! **Fingerprints** are `SHA-256(namespace key ‖ block hash)` truncated to 64
//! bits. The Manager draws a 256-bit secret at start and derives each
//! namespace's 128-bit key from it ([`namespace_key`]); a client receives a key
//! only in the reply to registering that namespace (which needs the tenant's
//! salt), so it cannot compute, test or link fingerprints of namespaces it
//! cannot look up. A restarted Manager has a new secret: keys of the old one
//! match nothing in its table.

use std::os::fd::OwnedFd;
use std::sync::atomic::{Ordering, fence};

use rustix::fs::{MemfdFlags, SealFlags};
use sha2::{Digest, Sha256};

use crate::ShmError;
use crate::words::Words;

/// `b"OKVPRES1"` as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"OKVPRES1");
/// Header words before the slots.
pub const HEADER_WORDS: usize = 8;
/// Longest probe a reader walks; an insert that would land farther marks the
/// table saturated instead (at ≤ 3/4 load, linear probing stays far below it).
pub const MAX_PROBE: usize = 1024;
/// Largest table: 2^28 slots (2 GiB). Bounds what a client maps.
pub const MAX_SLOTS: u64 = 1 << 28;
/// Smallest table.
pub const MIN_SLOTS: u64 = 1 << 10;
/// Seqlock retries before a reader gives up and answers `Maybe`.
const READ_RETRIES: usize = 64;

const W_MAGIC: usize = 0;
const W_SEQ: usize = 1;
const W_SLOTS: usize = 2;
const W_MAX_PROBE: usize = 4;
const W_ENTRIES: usize = 5;
const W_FLAGS: usize = 6;

/// Flag: an insert did not fit (load or probe limit); every answer is `Maybe`.
pub const FLAG_SATURATED: u64 = 1;
/// Flag: the Manager stopped; this table answers nothing any more.
pub const FLAG_CLOSED: u64 = 2;

/// Bytes of a namespace key.
pub const KEY_BYTES: usize = 16;

/// A namespace's presence key: `SHA-256("orbitkv-presence-ns" ‖ secret ‖ ns)`,
/// first 16 bytes. Unlinkable across namespaces without the secret.
pub fn namespace_key(secret: &[u8; 32], ns: u32) -> [u8; KEY_BYTES] {
    let mut h = Sha256::new();
    h.update(b"orbitkv-presence-ns");
    h.update(secret);
    h.update(ns.to_le_bytes());
    let d = h.finalize();
    let mut k = [0u8; KEY_BYTES];
    k.copy_from_slice(&d[..KEY_BYTES]);
    k
}

/// A block's fingerprint in its namespace: never 0 (0 marks an empty slot).
pub fn fingerprint(key: &[u8; KEY_BYTES], hash: &[u8; 32]) -> u64 {
    let mut h = Sha256::new();
    h.update(key);
    h.update(hash);
    let d = h.finalize();
    let mut w = [0u8; 8];
    w.copy_from_slice(&d[..8]);
    u64::from_le_bytes(w).max(1)
}

/// Bytes of a table of `slots` slots.
pub fn table_bytes(slots: u64) -> u64 {
    (HEADER_WORDS as u64 + slots) * 8
}

/// The smallest valid slot count holding `blocks` at ≤ 1/2 load.
pub fn slots_for(blocks: u64) -> u64 {
    blocks
        .saturating_mul(2)
        .clamp(MIN_SLOTS, MAX_SLOTS)
        .next_power_of_two()
        .min(MAX_SLOTS)
}

fn valid_slots(slots: u64) -> bool {
    slots.is_power_of_two() && (MIN_SLOTS..=MAX_SLOTS).contains(&slots)
}

/// A reader's answer for one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Not in the table at one consistent instant.
    Absent,
    /// Possibly present (or the table cannot tell): ask the Manager.
    Maybe,
}

/// The Manager's handle: the only writer. Not `Clone`; `&mut self` methods.
#[derive(Debug)]
pub struct PresenceWriter {
    fd: OwnedFd,
    words: Words,
    mask: usize,
    entries: u64,
    max_probe: usize,
    saturated: bool,
    seq: u64,
}

impl PresenceWriter {
    /// Create the memfd (size sealed), map it writable, then seal it against
    /// any future writable mapping or `write(2)`: clients can only read.
    pub fn create(slots: u64) -> Result<PresenceWriter, ShmError> {
        if !valid_slots(slots) {
            return Err(ShmError::SizeMismatch {
                expected: slots,
                actual: 0,
            });
        }
        let bytes = table_bytes(slots);
        let fd = rustix::fs::memfd_create(
            "orbitkv-presence",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(ShmError::Create)?;
        rustix::fs::ftruncate(&fd, bytes).map_err(|err| ShmError::Truncate { size: bytes, err })?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).map_err(ShmError::Seal)?;
        let words = Words::map(&fd, HEADER_WORDS + slots as usize, true)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::FUTURE_WRITE | SealFlags::SEAL)
            .map_err(ShmError::Seal)?;
        words.store(W_SLOTS, slots, Ordering::Relaxed);
        words.store(W_MAGIC, MAGIC, Ordering::Release);
        Ok(PresenceWriter {
            fd,
            words,
            mask: slots as usize - 1,
            entries: 0,
            max_probe: 0,
            saturated: false,
            seq: 0,
        })
    }

    /// The memfd, to pass to clients (they map it read-only: it is sealed).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn slots(&self) -> u64 {
        self.mask as u64 + 1
    }

    pub fn entries(&self) -> u64 {
        self.entries
    }

    pub fn is_saturated(&self) -> bool {
        self.saturated
    }

    fn slot(&self, i: usize) -> u64 {
        self.words.load(HEADER_WORDS + (i & self.mask), Ordering::Relaxed)
    }

    fn set_slot(&self, i: usize, v: u64) {
        self.words
            .store(HEADER_WORDS + (i & self.mask), v, Ordering::Relaxed);
    }

    /// Seqlock write section: odd while `f` runs.
    fn write<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.seq = self.seq.wrapping_add(1);
        self.words.store(W_SEQ, self.seq, Ordering::Relaxed);
        fence(Ordering::Release);
        let r = f(self);
        self.seq = self.seq.wrapping_add(1);
        self.words.store(W_SEQ, self.seq, Ordering::Release);
        r
    }

    fn saturate(&mut self) {
        self.saturated = true;
        let flags = self.words.load(W_FLAGS, Ordering::Relaxed);
        self.words
            .store(W_FLAGS, flags | FLAG_SATURATED, Ordering::Release);
    }

    /// Add one occurrence of `fp` (non-zero). `false` when the table is (or
    /// just became) saturated: readers then answer `Maybe` for everything.
    pub fn insert(&mut self, fp: u64) -> bool {
        let fp = fp.max(1);
        if self.saturated {
            return false;
        }
        if (self.entries + 1) * 4 > self.slots() * 3 {
            self.saturate();
            return false;
        }
        let home = fp as usize & self.mask;
        let Some(d) = (0..=MAX_PROBE).find(|d| self.slot(home + d) == 0) else {
            self.saturate();
            return false;
        };
        self.write(|w| {
            w.set_slot(home + d, fp);
            w.entries += 1;
            w.words.store(W_ENTRIES, w.entries, Ordering::Relaxed);
            if d > w.max_probe {
                w.max_probe = d;
                w.words.store(W_MAX_PROBE, d as u64, Ordering::Relaxed);
            }
        });
        true
    }

    /// Remove one occurrence of `fp`; `false` if none was there (e.g. its
    /// insert was refused under saturation).
    pub fn remove(&mut self, fp: u64) -> bool {
        let fp = fp.max(1);
        let home = fp as usize & self.mask;
        let mut at = None;
        for d in 0..=self.max_probe {
            match self.slot(home + d) {
                0 => break,
                v if v == fp => {
                    at = Some((home + d) & self.mask);
                    break;
                }
                _ => {}
            }
        }
        let Some(hole) = at else {
            return false;
        };
        self.write(|w| {
            // Backward-shift: pull later members of the run into the hole when
            // that does not move them before their home slot.
            let mut hole = hole;
            let mut k = hole;
            loop {
                k = (k + 1) & w.mask;
                let v = w.slot(k);
                if v == 0 {
                    break;
                }
                let h = v as usize & w.mask;
                let dist_k = k.wrapping_sub(h) & w.mask;
                let dist_hole = k.wrapping_sub(hole) & w.mask;
                if dist_k >= dist_hole {
                    w.set_slot(hole, v);
                    hole = k;
                }
            }
            w.set_slot(hole, 0);
            w.entries -= 1;
            w.words.store(W_ENTRIES, w.entries, Ordering::Relaxed);
        });
        true
    }

    /// The Manager stops: readers answer [`PresenceError::Closed`] from now on.
    pub fn close(&mut self) {
        let flags = self.words.load(W_FLAGS, Ordering::Relaxed);
        self.words.store(W_FLAGS, flags | FLAG_CLOSED, Ordering::Release);
    }
}

/// Why a view cannot answer at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PresenceError {
    #[error("the Manager that published this presence table has stopped")]
    Closed,
}

/// Counters read from a table's header (any process; best effort).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresenceStats {
    pub slots: u64,
    pub entries: u64,
    pub max_probe: u64,
    pub saturated: bool,
    pub closed: bool,
}

/// A read-only mapping of a presence table. Every method tolerates arbitrary
/// contents (another process writes them): never a panic, never an access
/// outside the mapping, at worst a wrong answer that the protocol absorbs
/// (see the module docs).
#[derive(Debug)]
pub struct PresenceView {
    fd: OwnedFd,
    words: Words,
    slots: u64,
}

impl PresenceView {
    /// Map `fd` read-only as a table of `slots` slots (as announced in
    /// `HelloOk`): the slot count must be valid and the file large enough.
    pub fn open(fd: OwnedFd, slots: u64) -> Result<PresenceView, ShmError> {
        if !valid_slots(slots) {
            return Err(ShmError::SizeMismatch {
                expected: table_bytes(MIN_SLOTS),
                actual: table_bytes(slots.min(MAX_SLOTS * 2)),
            });
        }
        let words = Words::map(&fd, HEADER_WORDS + slots as usize, false)?;
        Ok(PresenceView { fd, words, slots })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn slots(&self) -> u64 {
        self.slots
    }

    pub fn stats(&self) -> PresenceStats {
        let flags = self.words.load(W_FLAGS, Ordering::Acquire);
        PresenceStats {
            slots: self.slots,
            entries: self.words.load(W_ENTRIES, Ordering::Relaxed),
            max_probe: self.words.load(W_MAX_PROBE, Ordering::Relaxed),
            saturated: flags & FLAG_SATURATED != 0,
            closed: flags & FLAG_CLOSED != 0,
        }
    }

    /// Is `fp` certainly absent?
    pub fn contains(&self, fp: u64) -> Result<Presence, PresenceError> {
        let fp = fp.max(1);
        let mask = self.slots as usize - 1;
        let w = &self.words;
        for _ in 0..READ_RETRIES {
            let s1 = w.load(W_SEQ, Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let flags = w.load(W_FLAGS, Ordering::Relaxed);
            if flags & FLAG_CLOSED != 0 {
                return Err(PresenceError::Closed);
            }
            if flags & FLAG_SATURATED != 0
                || w.load(W_MAGIC, Ordering::Relaxed) != MAGIC
                || w.load(W_SLOTS, Ordering::Relaxed) != self.slots
            {
                return Ok(Presence::Maybe);
            }
            let max_probe = usize::try_from(w.load(W_MAX_PROBE, Ordering::Relaxed))
                .unwrap_or(usize::MAX)
                .min(MAX_PROBE)
                .min(mask);
            let home = fp as usize & mask;
            let mut found = false;
            for d in 0..=max_probe {
                let v = w.load(HEADER_WORDS + ((home + d) & mask), Ordering::Relaxed);
                if v == fp {
                    found = true;
                    break;
                }
                if v == 0 {
                    break;
                }
            }
            fence(Ordering::Acquire);
            if w.load(W_SEQ, Ordering::Relaxed) != s1 {
                continue;
            }
            return Ok(if found { Presence::Maybe } else { Presence::Absent });
        }
        Ok(Presence::Maybe)
    }

    /// How many of `fps` from the start are possibly present: the length of
    /// the prefix before the first certainly-absent fingerprint.
    pub fn present_prefix(&self, fps: impl IntoIterator<Item = u64>) -> Result<usize, PresenceError> {
        let mut n = 0;
        for fp in fps {
            if self.contains(fp)? == Presence::Absent {
                break;
            }
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn view_of(w: &PresenceWriter) -> PresenceView {
        let fd = w.fd().try_clone().expect("dup");
        PresenceView::open(fd, w.slots()).expect("view")
    }

    #[test]
    fn insert_remove_and_absence_match_a_model() {
        let mut w = PresenceWriter::create(MIN_SLOTS).expect("create");
        let v = view_of(&w);
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A small universe (with home-slot collisions) so removals hit.
            let fp = (x % 900).max(1) | ((x % 7) << 40);
            let present = model.get(&fp).copied().unwrap_or(0);
            if x.is_multiple_of(3) && present > 0 {
                assert!(w.remove(fp), "step {step}");
                *model.entry(fp).or_default() -= 1;
            } else if model.values().sum::<u32>() < 700 {
                assert!(w.insert(fp), "step {step}");
                *model.entry(fp).or_default() += 1;
            }
            let probe = ((x >> 20) % 900) | (((x >> 20) % 7) << 40);
            let expect = model.get(&probe.max(1)).copied().unwrap_or(0) > 0;
            let got = v.contains(probe).expect("open");
            assert_eq!(got == Presence::Maybe, expect, "step {step} fp {probe:#x}");
        }
        assert_eq!(
            v.stats().entries,
            model.values().map(|c| u64::from(*c)).sum::<u64>()
        );
    }

    #[test]
    fn a_full_table_saturates_and_answers_maybe() {
        let mut w = PresenceWriter::create(MIN_SLOTS).expect("create");
        let v = view_of(&w);
        let mut ok = 0;
        for i in 1..=MIN_SLOTS {
            if w.insert(i * 0x1_0000_0001) {
                ok += 1;
            }
        }
        assert_eq!(ok, MIN_SLOTS * 3 / 4);
        assert!(v.stats().saturated);
        assert_eq!(v.contains(12345).expect("open"), Presence::Maybe);
    }

    #[test]
    fn a_closed_table_answers_nothing() {
        let mut w = PresenceWriter::create(MIN_SLOTS).expect("create");
        let v = view_of(&w);
        assert_eq!(v.contains(5), Ok(Presence::Absent));
        w.close();
        assert_eq!(v.contains(5), Err(PresenceError::Closed));
    }

    #[test]
    fn clients_cannot_map_the_table_writable() {
        let w = PresenceWriter::create(MIN_SLOTS).expect("create");
        let fd = w.fd().try_clone().expect("dup");
        assert!(Words::map(&fd, HEADER_WORDS + MIN_SLOTS as usize, true).is_err());
        assert!(rustix::io::write(&fd, &[1u8; 8]).is_err());
    }

    #[test]
    fn keys_and_fingerprints_differ_per_namespace_and_secret() {
        let a = namespace_key(&[1; 32], 1);
        assert_ne!(a, namespace_key(&[1; 32], 2));
        assert_ne!(a, namespace_key(&[2; 32], 1));
        assert_ne!(
            fingerprint(&a, &[0; 32]),
            fingerprint(&namespace_key(&[1; 32], 2), &[0; 32])
        );
        assert_ne!(fingerprint(&a, &[0; 32]), 0);
    }

    #[test]
    fn a_view_refuses_bad_sizes() {
        let w = PresenceWriter::create(MIN_SLOTS).expect("create");
        let fd = || w.fd().try_clone().expect("dup");
        assert!(PresenceView::open(fd(), MIN_SLOTS * 2).is_err(), "file too small");
        assert!(
            PresenceView::open(fd(), MIN_SLOTS + 1).is_err(),
            "not a power of two"
        );
        assert!(PresenceView::open(fd(), 0).is_err());
    }
}
