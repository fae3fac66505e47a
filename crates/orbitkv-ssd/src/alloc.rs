//! Free-extent allocator over a data file, in 4 KiB units. Best fit, with full
//! coalescing on free, so an allocation of `n` units fails only when no free run of
//! `n` contiguous units exists.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone)]
pub(crate) struct ExtentAllocator {
    total: u64,
    /// start -> length of each maximal free run.
    by_start: BTreeMap<u64, u64>,
    /// (length, start) of each free run, for best fit.
    by_len: BTreeSet<(u64, u64)>,
    free: u64,
}

impl ExtentAllocator {
    /// All `total` units free.
    pub(crate) fn new(total: u64) -> Self {
        let mut a = ExtentAllocator {
            total,
            by_start: BTreeMap::new(),
            by_len: BTreeSet::new(),
            free: 0,
        };
        if total > 0 {
            a.insert_run(0, total);
        }
        a
    }

    /// `total` units with the given extents used and the rest free, built in one pass.
    /// `used` must be sorted by start, non-overlapping and inside `total` (recovery's
    /// placement guarantees it; anything else returns `None`).
    pub(crate) fn from_used(total: u64, used: impl IntoIterator<Item = (u64, u64)>) -> Option<Self> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut at = 0u64;
        for (start, units) in used {
            let end = start.checked_add(units)?;
            if start < at || end > total || units == 0 {
                return None;
            }
            if start > at {
                runs.push((at, start - at));
            }
            at = end;
        }
        if total > at {
            runs.push((at, total - at));
        }
        let free = runs.iter().map(|&(_, l)| l).sum();
        // Both collect from sorted input: the maps are built in bulk, not node by node.
        let mut by_len: Vec<(u64, u64)> = runs.iter().map(|&(s, l)| (l, s)).collect();
        by_len.sort_unstable();
        Some(ExtentAllocator {
            total,
            by_start: runs.into_iter().collect(),
            by_len: by_len.into_iter().collect(),
            free,
        })
    }

    pub(crate) fn free_units(&self) -> u64 {
        self.free
    }

    pub(crate) fn largest_free(&self) -> u64 {
        self.by_len.iter().next_back().map_or(0, |&(l, _)| l)
    }

    fn insert_run(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
        self.free += len;
    }

    fn remove_run(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
        self.free -= len;
    }

    /// Best-fit allocation of `units` contiguous units; returns the start unit.
    pub(crate) fn alloc(&mut self, units: u64) -> Option<u64> {
        if units == 0 {
            return None;
        }
        let &(len, start) = self.by_len.range((units, 0)..).next()?;
        self.remove_run(start, len);
        if len > units {
            self.insert_run(start + units, len - units);
        }
        Some(start)
    }

    /// Mark `[start, start+units)` used (recovery). False, and no change, unless the whole
    /// range is currently free.
    pub(crate) fn reserve(&mut self, start: u64, units: u64) -> bool {
        if units == 0 || start.checked_add(units).is_none_or(|e| e > self.total) {
            return false;
        }
        let Some((&rs, &rl)) = self.by_start.range(..=start).next_back() else {
            return false;
        };
        if start + units > rs + rl {
            return false;
        }
        self.remove_run(rs, rl);
        if start > rs {
            self.insert_run(rs, start - rs);
        }
        let end = start + units;
        if rs + rl > end {
            self.insert_run(end, rs + rl - end);
        }
        true
    }

    /// Return `[start, start+units)` to the free pool, merging with neighbours. False, and
    /// no change, if any part of the range is already free or out of bounds.
    pub(crate) fn free(&mut self, start: u64, units: u64) -> bool {
        let Some(end) = start.checked_add(units) else {
            return false;
        };
        if units == 0 || end > self.total {
            return false;
        }
        let prev = self.by_start.range(..=start).next_back().map(|(&s, &l)| (s, l));
        if let Some((ps, pl)) = prev
            && ps + pl > start
        {
            return false;
        }
        let next = self.by_start.range(start..).next().map(|(&s, &l)| (s, l));
        if let Some((ns, _)) = next
            && ns < end
        {
            return false;
        }
        let (mut s, mut e) = (start, end);
        if let Some((ps, pl)) = prev
            && ps + pl == start
        {
            self.remove_run(ps, pl);
            s = ps;
        }
        if let Some((ns, nl)) = next
            && ns == end
        {
            self.remove_run(ns, nl);
            e = ns + nl;
        }
        self.insert_run(s, e - s);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference model: one bool per unit.
    struct Model {
        used: Vec<bool>,
    }

    impl Model {
        fn longest_free_run(&self) -> u64 {
            let (mut best, mut cur) = (0u64, 0u64);
            for &u in &self.used {
                if u {
                    cur = 0;
                } else {
                    cur += 1;
                    best = best.max(cur);
                }
            }
            best
        }
        fn is_free(&self, s: u64, n: u64) -> bool {
            (s..s + n).all(|i| !self.used[i as usize])
        }
        fn set(&mut self, s: u64, n: u64, v: bool) {
            for i in s..s + n {
                self.used[i as usize] = v;
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
        Reserve(u64, u64),
        BogusFree(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..40).prop_map(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
            1 => (0u64..260, 1u64..20).prop_map(|(s, n)| Op::Reserve(s, n)),
            1 => (0u64..260, 1u64..20).prop_map(|(s, n)| Op::BogusFree(s, n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn allocator_matches_model(total in 1u64..256, ops in proptest::collection::vec(op(), 1..200)) {
            let mut a = ExtentAllocator::new(total);
            let mut m = Model { used: vec![false; total as usize] };
            let mut live: Vec<(u64, u64)> = Vec::new();
            for o in ops {
                match o {
                    Op::Alloc(n) => {
                        let longest = m.longest_free_run();
                        match a.alloc(n) {
                            Some(s) => {
                                prop_assert!(s + n <= total);
                                prop_assert!(m.is_free(s, n), "double allocation");
                                m.set(s, n, true);
                                live.push((s, n));
                            }
                            None => prop_assert!(longest < n, "alloc failed with a free run of {longest} >= {n}"),
                        }
                    }
                    Op::Free(i) => {
                        if !live.is_empty() {
                            let (s, n) = live.swap_remove(i % live.len());
                            prop_assert!(a.free(s, n));
                            m.set(s, n, false);
                        }
                    }
                    Op::Reserve(s, n) => {
                        let ok = s + n <= total && m.is_free(s, n);
                        prop_assert_eq!(a.reserve(s, n), ok);
                        if ok {
                            m.set(s, n, true);
                            live.push((s, n));
                        }
                    }
                    Op::BogusFree(s, n) => {
                        // Freeing a range that is (partly) free must be refused.
                        if s + n <= total && !(s..s + n).all(|i| m.used[i as usize]) {
                            prop_assert!(!a.free(s, n));
                        }
                    }
                }
                let model_free = m.used.iter().filter(|u| !**u).count() as u64;
                prop_assert_eq!(a.free_units(), model_free);
                prop_assert_eq!(a.largest_free(), m.longest_free_run());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Built in one pass from sorted extents == reserved one by one.
        #[test]
        fn from_used_matches_reserve(total in 1u64..300, cuts in proptest::collection::vec((0u64..300, 1u64..12), 0..40)) {
            let mut one = ExtentAllocator::new(total);
            let mut used: Vec<(u64, u64)> = cuts.into_iter().filter(|&(s, n)| one.reserve(s, n)).collect();
            used.sort_unstable();
            let bulk = ExtentAllocator::from_used(total, used.iter().copied());
            prop_assert!(bulk.is_some());
            let bulk = bulk.unwrap_or_else(|| ExtentAllocator::new(0));
            prop_assert_eq!(&bulk.by_start, &one.by_start);
            prop_assert_eq!(&bulk.by_len, &one.by_len);
            prop_assert_eq!(bulk.free, one.free);
            // Overlapping or unsorted input is refused.
            if used.len() >= 2 {
                let mut bad = used.clone();
                bad.swap(0, 1);
                prop_assert!(ExtentAllocator::from_used(total, bad).is_none());
            }
        }
    }

    #[test]
    fn coalesces() {
        let mut a = ExtentAllocator::new(10);
        let x = a.alloc(3);
        let y = a.alloc(3);
        let z = a.alloc(4);
        assert_eq!((x, y, z), (Some(0), Some(3), Some(6)));
        assert_eq!(a.alloc(1), None);
        assert!(a.free(0, 3));
        assert!(a.free(6, 4));
        assert!(a.free(3, 3));
        assert_eq!(a.largest_free(), 10);
        assert!(!a.free(0, 1));
    }
}
