//! In-memory index of the SSD tier: key -> extent, LRU order, read pins and the
//! journal handle, all under the tier's one lock.

use std::collections::{BTreeMap, HashMap};

use crate::alloc::ExtentAllocator;
use crate::format::{FORMAT_VERSION, JournalRecord, RecordKind, SECTOR};
use crate::index::{Entry, KeyIndex};
use crate::journal::Journal;
use crate::key::SsdKey;

pub(crate) struct State {
    pub(crate) index: KeyIndex,
    pub(crate) alloc: ExtentAllocator,
    /// tick -> key, oldest first.
    pub(crate) lru: BTreeMap<u64, SsdKey>,
    pub(crate) tick: u64,
    pub(crate) seq: u64,
    /// extent start (bytes) -> readers in flight.
    pub(crate) pins: HashMap<u64, u32>,
    /// Extents freed while pinned: start -> units.
    pub(crate) deferred: HashMap<u64, u64>,
    pub(crate) used_bytes: u64,
    pub(crate) journal: Journal,
}

impl State {
    /// The index of `n` recovered blocks, `placed` oldest first (their LRU order), and
    /// their keys and lengths in that order (`RecoveryReport::recovered`), built on
    /// three threads.
    pub(crate) fn load<'a, I>(
        alloc: ExtentAllocator,
        seq: u64,
        journal: Journal,
        placed: I,
        n: usize,
    ) -> (State, Vec<(SsdKey, u64)>)
    where
        I: Iterator<Item = &'a JournalRecord> + Clone + Send,
    {
        let entry = |r: &JournalRecord, tick: u64| Entry {
            off: r.offset,
            len: r.len,
            seq: r.seq,
            sum: r.payload_sum,
            tick,
        };
        let build_index = |it: I| {
            let mut index = KeyIndex::with_capacity(n);
            let mut used_bytes = 0u64;
            for (r, tick) in it.zip(1u64..) {
                let e = entry(r, tick);
                used_bytes += e.units() * SECTOR;
                index.insert(r.key, e);
            }
            (index, used_bytes)
        };
        let ((index, used_bytes), lru, recovered) = std::thread::scope(|s| {
            // Three independent builds from the same records: the index and the recovered
            // list on helper threads (each built here instead if no thread can be had),
            // the LRU map (ticks 1..=n in order, collected in bulk) on this one.
            let spawn = |name: &str| std::thread::Builder::new().name(name.into());
            let side = spawn("orbitkv-ssd-index").spawn_scoped(s, {
                let it = placed.clone();
                move || build_index(it)
            });
            let list = |it: I| it.map(|r| (r.key, r.len)).collect::<Vec<(SsdKey, u64)>>();
            let listed = spawn("orbitkv-ssd-list").spawn_scoped(s, {
                let it = placed.clone();
                move || list(it)
            });
            let lru: BTreeMap<u64, SsdKey> = placed.clone().zip(1u64..).map(|(r, t)| (t, r.key)).collect();
            let recovered = match listed {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(_) => list(placed.clone()),
            };
            let built = match side {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(_) => build_index(placed),
            };
            (built, lru, recovered)
        });
        let tick = lru.len() as u64;
        let st = State {
            index,
            alloc,
            lru,
            tick,
            seq,
            pins: HashMap::new(),
            deferred: HashMap::new(),
            used_bytes,
            journal,
        };
        (st, recovered)
    }

    fn release(&mut self, off: u64, units: u64) {
        if self.pins.contains_key(&off) {
            self.deferred.insert(off, units);
        } else {
            self.alloc.free(off / SECTOR, units);
        }
    }

    pub(crate) fn unpin(&mut self, off: u64) {
        let left = match self.pins.get_mut(&off) {
            Some(c) => {
                *c -= 1;
                *c
            }
            None => return,
        };
        if left == 0 {
            self.pins.remove(&off);
            if let Some(units) = self.deferred.remove(&off) {
                self.alloc.free(off / SECTOR, units);
            }
        }
    }

    pub(crate) fn drop_entry(&mut self, key: &SsdKey) -> Option<Entry> {
        let e = self.index.remove(key)?;
        self.lru.remove(&e.tick);
        self.used_bytes -= e.units() * SECTOR;
        self.release(e.off, e.units());
        Some(e)
    }

    pub(crate) fn insert_entry(&mut self, key: SsdKey, mut e: Entry) {
        self.tick += 1;
        e.tick = self.tick;
        self.lru.insert(e.tick, key);
        self.used_bytes += e.units() * SECTOR;
        self.index.insert(key, e);
    }

    pub(crate) fn touch(&mut self, key: &SsdKey) {
        self.tick += 1;
        let t = self.tick;
        if let Some(e) = self.index.get_mut(key) {
            self.lru.remove(&e.tick);
            e.tick = t;
            self.lru.insert(t, *key);
        }
    }

    pub(crate) fn remove_record(&mut self, key: SsdKey) -> JournalRecord {
        self.seq += 1;
        JournalRecord {
            version: FORMAT_VERSION as u16,
            kind: RecordKind::Remove,
            seq: self.seq,
            key,
            file: 0,
            offset: 0,
            len: 0,
            payload_sum: 0,
        }
    }
}
