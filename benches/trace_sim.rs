//! Cache-policy simulator: replays prefix-block traces (the public Mooncake FAST25
//! format, one JSON object per line with `hash_ids`, one id per 512-token block)
//! through the sans-I/O core (`CacheState`, the Manager's own policy code, no
//! sockets) and through two references computed in the same run: LRU and the
//! offline optimum (Belady with bypass on the same prefix lookups).
//!
//! Per request: `lookup` (the longest present prefix is served and its lease
//! released), then `begin_save` + `commit_save` of the blocks after the hit,
//! as an engine does. Capacity is counted in blocks (64 KiB each). Hit rate =
//! blocks served / blocks requested.
//!
//!   cargo run --release -p orbitkv-benches --bin trace_sim -- \
//!       --trace conversation.jsonl --trace synthetic.jsonl --capacity 4096,16384 \
//!       [--policy s3fifo,...] [--out bench-results/trace_sim.json]
//!
//! Traces are read from files the user provides; nothing is downloaded.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use orbitkv_core::policy::{Policy, PolicyKind};
use orbitkv_core::{AcquireStep, BlockRef, CacheState, NsId, SessionId, SpillPolicy, TierKey};

const BLOCK: u64 = 64 << 10;

#[path = "common/json_out.rs"]
mod json_out;
#[path = "common/trace.rs"]
mod trace;
use trace::{Tally, hash_of, open_replay, parse_trace, run_opt, run_opt_with};

/// Saves and commits `hashes` (what an engine does after computing them).
fn save(cache: &mut CacheState, s: SessionId, ns: NsId, hashes: &[[u8; 32]]) -> Result<(), String> {
    let (id, _) = cache.begin_save(s, ns, hashes).map_err(|e| e.to_string())?;
    cache.commit_save(s, id).map(drop).map_err(|e| e.to_string())
}

/// The Manager's policy code: `CacheState` with `policy`, `capacity` blocks of DRAM.
fn run_core(trace: &[Vec<u64>], capacity: u64, policy: Policy<BlockRef>) -> Result<Tally, String> {
    let mut cache = CacheState::with_policy_instance(&[capacity * BLOCK], policy);
    let (s, ns) = open_replay(&mut cache, BLOCK)?;
    let mut t = Tally::default();
    for req in trace {
        let hashes: Vec<[u8; 32]> = req.iter().map(|&id| hash_of(id)).collect();
        let r = cache.lookup(s, ns, &hashes).map_err(|e| e.to_string())?;
        t.requested += hashes.len() as u64;
        t.served += u64::from(r.hit_blocks);
        if let Some(l) = r.lease {
            cache.release(s, l).map_err(|e| e.to_string())?;
        }
        let rest = &hashes[r.hit_blocks as usize..];
        if rest.is_empty() {
            continue;
        }
        save(&mut cache, s, ns, rest)?;
    }
    Ok(t)
}

/// Hit rates of a two-tier replay: all served blocks, and those read from SSD.
#[derive(Default, Clone, Copy, Debug)]
struct TierTally {
    requested: u64,
    served: u64,
    from_ssd: u64,
    spilled: u64,
    dropped_from_ssd: u64,
    /// DRAM evictions of blocks the SSD would have kept, before their spill was written.
    evicted_unspilled: u64,
    /// Lookups whose hit could not be staged (no DRAM room): recomputed.
    unserved: u64,
}

/// The SSD store's side of the Manager (`orbitkv-ssd`): a capacity in blocks,
/// least recently written or read copies proposed first when it is full.
struct SsdStore {
    capacity: u64,
    stamp: HashMap<TierKey, u64>,
    order: std::collections::BTreeMap<u64, TierKey>,
    clock: u64,
}

impl SsdStore {
    fn touch(&mut self, k: TierKey) {
        self.clock += 1;
        if let Some(old) = self.stamp.insert(k, self.clock) {
            self.order.remove(&old);
        }
        self.order.insert(self.clock, k);
    }

    fn remove(&mut self, k: &TierKey) {
        if let Some(old) = self.stamp.remove(k) {
            self.order.remove(&old);
        }
    }

    fn oldest(&self, n: usize) -> Vec<TierKey> {
        self.order.values().take(n).copied().collect()
    }
}

/// `run_core` with an SSD tier of `ssd` blocks behind `dram` blocks of DRAM, with
/// the Manager's default spill policy (`evict`: the coldest eighth of DRAM is
/// copied to SSD once free DRAM falls under an eighth, so eviction demotes it).
/// Every spill completes before the next request: a disk that keeps up, which the
/// real replay's disk does not (`docs/performance.md`); this isolates the policy.
fn run_core_tiered(
    trace: &[Vec<u64>],
    dram: u64,
    ssd: u64,
    policy: Policy<BlockRef>,
    joint: bool,
    writes_per_request: u64,
) -> Result<TierTally, String> {
    let mut cache = CacheState::with_policy_instance(&[dram * BLOCK], policy);
    if joint {
        cache.enable_ssd_tiers(0, SpillPolicy::Evict, ssd * BLOCK);
    } else {
        cache.enable_ssd_with(0, SpillPolicy::Evict);
    }
    let mut store = SsdStore {
        capacity: ssd,
        stamp: HashMap::new(),
        order: std::collections::BTreeMap::new(),
        clock: 0,
    };
    let (s, ns) = open_replay(&mut cache, BLOCK)?;
    let mut t = TierTally::default();
    for req in trace {
        let hashes: Vec<[u8; 32]> = req.iter().map(|&id| hash_of(id)).collect();
        let r = cache.lookup(s, ns, &hashes).map_err(|e| e.to_string())?;
        t.requested += hashes.len() as u64;
        if let Some(l) = r.lease {
            let mut served = true;
            loop {
                match cache.acquire(s, l) {
                    Ok(AcquireStep::Stage(jobs)) => {
                        for j in &jobs {
                            store.touch(j.tier_key());
                            cache.finish_stage(j, true);
                        }
                    }
                    Ok(AcquireStep::Ready(_)) => break,
                    Ok(AcquireStep::Wait) | Ok(AcquireStep::Lost { .. }) | Err(_) => {
                        served = false; // no room to stage: the engine recomputes
                        t.unserved += 1;
                        break;
                    }
                }
            }
            if served {
                t.served += u64::from(r.hit_blocks);
                t.from_ssd += r.ssd_blocks.len() as u64;
            }
            cache.release(s, l).map_err(|e| e.to_string())?;
            if !served {
                // Save what was not served, as an engine would after recomputing.
                save(&mut cache, s, ns, &hashes)?;
            }
        }
        let rest = &hashes[r.hit_blocks as usize..];
        if !rest.is_empty() {
            save(&mut cache, s, ns, rest)?;
        }
        // A disk that keeps up writes every candidate; a slow one only
        // `writes_per_request` per request (the rest wait, and DRAM may evict them
        // unwritten first).
        let mut budget = if writes_per_request == 0 {
            u64::MAX
        } else {
            writes_per_request
        };
        while budget > 0 {
            let jobs = cache.spill_candidates(budget.min(1024) as usize);
            budget -= jobs.len() as u64;
            // Room made for these spills (copies the policy gave up) is freed first.
            for k in cache.take_ssd_removals() {
                store.remove(&k);
            }
            if jobs.is_empty() {
                break;
            }
            for j in &jobs {
                if store.stamp.len() as u64 >= store.capacity {
                    let proposed = store.oldest(64);
                    for k in cache.ssd_droppable(&proposed) {
                        store.remove(&k);
                        t.dropped_from_ssd += 1;
                    }
                }
                let fits = (store.stamp.len() as u64) < store.capacity;
                if fits {
                    store.touch(j.tier_key());
                    t.spilled += 1;
                }
                cache.spill_done(j, fits);
            }
        }
        for k in cache.take_ssd_removals() {
            store.remove(&k);
        }
    }
    t.evicted_unspilled = cache.counters().evicted_unspilled;
    Ok(t)
}

/// Least-recently-used residency of block ids, `capacity` at most.
struct Lru {
    capacity: u64,
    stamp: HashMap<u64, u64>,
    order: BTreeSet<(u64, u64)>,
    clock: u64,
}

impl Lru {
    fn new(capacity: u64) -> Self {
        Self {
            capacity,
            stamp: HashMap::new(),
            order: BTreeSet::new(),
            clock: 0,
        }
    }

    fn contains(&self, id: &u64) -> bool {
        self.stamp.contains_key(id)
    }

    /// Make `id` the most recent, inserting it (and evicting the least recent when
    /// over capacity) if absent.
    fn touch(&mut self, id: u64) {
        self.clock += 1;
        if let Some(old) = self.stamp.insert(id, self.clock) {
            self.order.remove(&(old, id));
        } else if self.stamp.len() as u64 > self.capacity
            && let Some((_, victim)) = self.order.pop_first()
        {
            self.stamp.remove(&victim);
        }
        self.order.insert((self.clock, id));
    }
}

/// Plain LRU on the same flow: hit prefix touched (in chain order), missing blocks
/// inserted (in chain order), least recently used evicted.
fn run_lru(trace: &[Vec<u64>], capacity: u64) -> Tally {
    let mut lru = Lru::new(capacity);
    let mut t = Tally::default();
    for req in trace {
        let hit = req.iter().take_while(|id| lru.contains(id)).count();
        t.requested += req.len() as u64;
        t.served += hit as u64;
        for (i, id) in req.iter().enumerate() {
            let present = lru.contains(id);
            if i >= hit && present {
                continue; // present after the first miss: not part of the served prefix, not touched
            }
            lru.touch(*id);
        }
    }
    t
}

/// Belady with bypass: evict the block whose next request lies farthest ahead
/// (never again = infinity); a missing block whose next use is farther than every
/// resident's is not admitted.
/// The generators' seeded random numbers (a 64-bit LCG) and fresh block ids.
struct Gen {
    x: u64,
    next_id: u64,
}

impl Gen {
    fn new(state: u64, first_id: u64) -> Self {
        Gen {
            x: state,
            next_id: first_id,
        }
    }

    /// A number in `0..m` (0 when `m` is 0).
    fn rnd(&mut self, m: u64) -> u64 {
        self.x = self
            .x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.x >> 33) % m.max(1)
    }

    /// `k` block ids never used before.
    fn fresh(&mut self, k: u64) -> Vec<u64> {
        let v = (self.next_id..self.next_id + k).collect();
        self.next_id += k;
        v
    }
}

/// A seeded synthetic serving trace, for workloads beyond the recorded ones:
/// a few shared system prompts (2–8 blocks, Zipf-like popularity), multi-turn
/// chats that come back after long gaps (each turn appends 1–8 blocks plus a
/// fresh partial block; a chat ends with probability 1/4 per turn; up to 3,000
/// open at once), and one-shot documents (8–40 blocks, never reused) in 1 of 4
/// requests.
fn generated(seed: u64, n: usize) -> Vec<Vec<u64>> {
    let mut g = Gen::new(seed ^ 0x9e37_79b9_7f4a_7c15, 0u64);
    let systems: Vec<Vec<u64>> = (0..8).map(|i| g.fresh(2 + (i % 4) * 2)).collect();
    let mut open: Vec<Vec<u64>> = Vec::new(); // chats without their partial block
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let r = g.rnd(100);
        if r < 25 {
            let len = 8 + g.rnd(33);
            out.push(g.fresh(len));
            continue;
        }
        let cont = !open.is_empty() && (r < 70 || open.len() >= 3000);
        let i = if cont {
            g.rnd(open.len() as u64) as usize
        } else {
            open.len()
        };
        let mut chat = if cont {
            open[i].clone()
        } else {
            // Zipf-like: system prompt j with weight 1/(j+1).
            let mut pick = g.rnd(270) as i64; // the weights 100/(j+1), j < 8, sum to 270
            let mut j = 0;
            while j < 7 {
                pick -= (100 / (j + 1)) as i64;
                if pick < 0 {
                    break;
                }
                j += 1;
            }
            systems[j].clone()
        };
        let add = 1 + g.rnd(8);
        chat.extend(g.fresh(add));
        let mut req = chat.clone();
        req.extend(g.fresh(1)); // the partial last block: its id changes next turn
        out.push(req);
        let ends = cont && g.rnd(4) == 0;
        if !cont {
            open.push(chat);
        } else if ends {
            open.swap_remove(i);
        } else {
            open[i] = chat;
        }
    }
    out
}

/// A seeded agent-shaped trace (tool-calling sessions; modelled on the shape of
/// agent traffic, not fitted to a recorded trace): four shared tool-definition
/// prefixes (8–24 blocks, Zipf-like popularity); sessions that come back quickly
/// (60 % of requests continue one of the 16 most recently used sessions, 15 % an
/// older one), each turn appending 1–4 blocks of tool output plus a fresh partial
/// block, ending with probability 1/10 per turn (up to 2,000 open); one-shot
/// documents (20–60 blocks, never reused) in 1 of 10 requests.
fn generated_toolagent(seed: u64, n: usize) -> Vec<Vec<u64>> {
    let mut g = Gen::new(seed ^ 0x5851_f42d_4c95_7f2d, 1u64 << 40); // apart from `generated`'s ids
    let tools: Vec<Vec<u64>> = (0..4).map(|i| g.fresh(8 + i * 5)).collect();
    // Open sessions, most recently used last.
    let mut open: Vec<Vec<u64>> = Vec::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let r = g.rnd(100);
        if r < 10 {
            let len = 20 + g.rnd(41);
            out.push(g.fresh(len));
            continue;
        }
        let pick = if open.is_empty() || r >= 85 {
            None
        } else if r < 70 {
            let recent = open.len().min(16) as u64;
            Some(open.len() - 1 - g.rnd(recent) as usize)
        } else {
            Some(g.rnd(open.len() as u64) as usize)
        };
        let mut chat = match pick {
            Some(i) => open.remove(i),
            None => {
                let w = g.rnd(100);
                let j = if w < 48 {
                    0
                } else if w < 72 {
                    1
                } else if w < 88 {
                    2
                } else {
                    3
                };
                tools[j].clone()
            }
        };
        let add = 1 + g.rnd(4);
        chat.extend(g.fresh(add));
        let mut req = chat.clone();
        req.extend(g.fresh(1));
        out.push(req);
        if pick.is_none() || g.rnd(10) != 0 {
            open.push(chat);
            if open.len() > 2000 {
                open.remove(0);
            }
        }
    }
    out
}

/// A seeded trace of interleaved sessions (many agent loops or chats served at
/// once; not fitted to a recorded trace): five shared tool-definition prefixes
/// of 12 blocks; `open_sessions` sessions at once (50 for `--generate-sessions`),
/// each request continuing one of them picked uniformly, so a session returns
/// about every `open_sessions` requests with its whole, growing context. A
/// session starts with 4 blocks of its own, appends 3 blocks per turn plus a
/// fresh partial block, and ends after 5–30 turns (or past 200 blocks), when a
/// new one opens. LRU suits it; a policy that leaves holes in the sessions'
/// chains does not.
fn generated_sessions(seed: u64, n: usize, open_sessions: usize) -> Vec<Vec<u64>> {
    let mut g = Gen::new(seed ^ 0x2545_f491_4f6c_dd1d, 2u64 << 40); // apart from the other generators' ids
    let tools: Vec<Vec<u64>> = (0..5).map(|_| g.fresh(12)).collect();
    // (chain without its partial block, turns left)
    let mut open: Vec<(Vec<u64>, u64)> = Vec::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        while open.len() < open_sessions.max(1) {
            let mut chain = tools[g.rnd(5) as usize].clone();
            chain.extend(g.fresh(4));
            open.push((chain, 5 + g.rnd(26)));
        }
        let i = g.rnd(open.len() as u64) as usize;
        let (chain, left) = &mut open[i];
        let mut req = chain.clone();
        req.extend(g.fresh(1));
        out.push(req);
        chain.extend(g.fresh(3));
        *left -= 1;
        if *left == 0 || chain.len() > 200 {
            open.swap_remove(i);
        }
    }
    out
}

/// Write generated traces as `DIR/<name>.jsonl` in the public format (one request
/// per line; `timestamp` is the request's index in milliseconds, `input_length`
/// its blocks × 512 tokens), so `benches/trace_replay.py` can replay the same
/// requests through real Managers.
fn write_generated(dir: &str, inputs: &[(String, Vec<Vec<u64>>)]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
    for (name, trace) in inputs {
        let path = std::path::Path::new(dir).join(format!("{name}.jsonl"));
        let mut text = String::new();
        for (i, req) in trace.iter().enumerate() {
            let line = serde_json::json!({"timestamp": i, "input_length": req.len() * 512,
                "output_length": 0, "hash_ids": req});
            text.push_str(&line.to_string());
            text.push('\n');
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Where the optimum's hits come from at `capacity` blocks: each hit block's
/// LRU stack distance (distinct blocks requested since its previous request) is
/// within the capacity (LRU could have kept it), or beyond it on a block that
/// was requested more than once before (frequency evidence existed), or beyond
/// it on its *first* return (nothing online told it from a one-time block).
#[derive(Default, Clone, Copy, Debug)]
struct OptHits {
    total: u64,
    within: u64,
    beyond_seen_again: u64,
    beyond_first_return: u64,
}

fn optimum_hit_sources(trace: &[Vec<u64>], capacity: u64) -> OptHits {
    // Per access (request, position): stack distance and accesses before it.
    let total: usize = trace.iter().map(Vec::len).sum();
    let mut fenwick = vec![0i64; total + 1];
    let add = |f: &mut Vec<i64>, mut i: usize, v: i64| {
        i += 1;
        while i < f.len() {
            f[i] += v;
            i += i & i.wrapping_neg();
        }
    };
    let sum = |f: &Vec<i64>, mut i: usize| -> i64 {
        // sum of positions [0, i)
        let mut s = 0;
        while i > 0 {
            s += f[i];
            i -= i & i.wrapping_neg();
        }
        s
    };
    let mut last: HashMap<u64, (usize, u64)> = HashMap::new(); // id -> (time, accesses)
    let mut info: Vec<Vec<(u64, u64)>> = trace.iter().map(|r| vec![(u64::MAX, 0); r.len()]).collect();
    let mut t = 0usize;
    for (r, req) in trace.iter().enumerate() {
        for (i, id) in req.iter().enumerate() {
            let (dist, seen) = match last.get(id) {
                Some(&(t0, n)) => {
                    let d = sum(&fenwick, t) - sum(&fenwick, t0 + 1);
                    add(&mut fenwick, t0, -1);
                    (d as u64, n)
                }
                None => (u64::MAX, 0),
            };
            info[r][i] = (dist, seen);
            add(&mut fenwick, t, 1);
            last.insert(*id, (t, seen + 1));
            t += 1;
        }
    }
    let mut out = OptHits::default();
    run_opt_with(trace, capacity, |r, i| {
        let (dist, seen) = info[r][i];
        out.total += 1;
        if dist < capacity {
            out.within += 1;
        } else if seen >= 2 {
            out.beyond_seen_again += 1;
        } else {
            out.beyond_first_return += 1;
        }
    });
    out
}

/// LRU (chain order: a hit prefix is touched deepest first, so the head is the
/// most recent) that admits only blocks the trace will request again: recency
/// with a perfect one-bit reuse predictor. Not an online policy; it bounds what
/// admission alone can add to recency.
fn run_oracle_admit_lru(trace: &[Vec<u64>], capacity: u64) -> Tally {
    let mut reused: HashMap<u64, u64> = HashMap::new();
    let mut later: Vec<Vec<bool>> = trace.iter().map(|r| vec![false; r.len()]).collect();
    for (r, req) in trace.iter().enumerate().rev() {
        for (i, id) in req.iter().enumerate() {
            later[r][i] = reused.contains_key(id);
        }
        for id in req {
            reused.insert(*id, r as u64);
        }
    }
    let mut lru = Lru::new(capacity);
    let mut t = Tally::default();
    for (r, req) in trace.iter().enumerate() {
        let hit = req.iter().take_while(|id| lru.contains(id)).count();
        t.requested += req.len() as u64;
        t.served += hit as u64;
        for (i, id) in req.iter().enumerate().rev() {
            let present = lru.contains(id);
            if (i >= hit && present) || (!present && !later[r][i]) {
                continue;
            }
            lru.touch(*id);
        }
    }
    t
}

/// In-process cost of the Manager's lookup op under each policy: a full-hit lookup
/// of a 32-block chain + release on a full cache (the work done under the cache
/// lock for `benches/manager_scaling.py`'s `lookup`), nanoseconds per op, best of
/// three rounds. With `ssd_blocks`, an SSD tier of that size decided with DRAM
/// (`enable_ssd_tiers`: every hit also touches the tiers' policy).
fn lookup_cost(kind: PolicyKind, ssd_blocks: u64) -> Result<f64, String> {
    const CHAINS: u64 = 128;
    let cap = CHAINS * 32;
    let mut cache = CacheState::with_policy_instance(&[cap * BLOCK], Policy::new(kind, cap * BLOCK));
    if ssd_blocks > 0 {
        cache.enable_ssd_tiers(0, SpillPolicy::Evict, ssd_blocks * BLOCK);
    }
    let (s, ns) = open_replay(&mut cache, BLOCK)?;
    let chains: Vec<Vec<[u8; 32]>> = (0..CHAINS)
        .map(|c| (0..32).map(|j| hash_of(c * 1000 + j)).collect())
        .collect();
    for c in &chains {
        save(&mut cache, s, ns, c)?;
    }
    let mut best = f64::MAX;
    for _ in 0..3 {
        let n = 100_000u64;
        let t0 = Instant::now();
        for i in 0..n {
            let c = &chains[(i.wrapping_mul(2654435761) % CHAINS) as usize];
            let r = cache.lookup(s, ns, c).map_err(|e| e.to_string())?;
            if r.hit_blocks != 32 {
                return Err(format!("{kind}: cost probe missed ({} of 32)", r.hit_blocks));
            }
            if let Some(l) = r.lease {
                cache.release(s, l).map_err(|e| e.to_string())?;
            }
        }
        best = best.min(t0.elapsed().as_nanos() as f64 / n as f64);
    }
    Ok(best)
}

/// One kind's runs (one per seed) as one JSON object: the single run's fields, or
/// with several seeds the lowest and highest hit rate and every run.
fn summarize(mut runs: Vec<serde_json::Value>) -> serde_json::Value {
    if runs.len() == 1 {
        return runs.swap_remove(0);
    }
    let rates: Vec<f64> = runs.iter().filter_map(|r| r["hit_rate"].as_f64()).collect();
    let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let max = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    serde_json::json!({"hit_rate_min": min, "hit_rate_max": max, "runs": runs})
}

fn main() {
    trace::exit_on_error("trace_sim", real_main());
}

fn real_main() -> Result<(), String> {
    let mut traces = Vec::new();
    let mut caps = vec![4096u64, 16384];
    let mut kinds: Vec<PolicyKind> = PolicyKind::ALL.to_vec();
    let mut out = None;
    let mut sweep = false;
    let mut generate: Vec<u64> = Vec::new();
    let mut cost = false;
    let mut ssd = 0u64;
    let mut analyze = false;
    let mut ssd_writes = 0u64;
    let mut toolagent: Vec<u64> = Vec::new();
    let mut sessions: Vec<u64> = Vec::new();
    let mut write_traces: Option<String> = None;
    // Seeds of `duel`'s sample and `tinylfu`'s sketch; `None` alone: random per process (the Manager's default).
    let mut seeds: Vec<Option<u64>> = vec![None];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--trace" => traces.push(val()?),
            "--capacity" => caps = trace::parse_capacities(&val()?)?,
            "--policy" => {
                kinds = val()?
                    .split(',')
                    .map(|p| p.parse::<PolicyKind>())
                    .collect::<Result<_, _>>()?
            }
            "--out" => out = Some(val()?),
            "--write-traces" => write_traces = Some(val()?),
            "--generate" => generate.push(val()?.parse::<u64>().map_err(|e| format!("--generate: {e}"))?),
            "--sweep" => sweep = true,
            "--analyze" => analyze = true,
            "--ssd-writes" => ssd_writes = val()?.parse::<u64>().map_err(|e| format!("--ssd-writes: {e}"))?,
            "--generate-toolagent" => toolagent.push(
                val()?
                    .parse::<u64>()
                    .map_err(|e| format!("--generate-toolagent: {e}"))?,
            ),
            "--generate-sessions" => sessions.push(
                val()?
                    .parse::<u64>()
                    .map_err(|e| format!("--generate-sessions: {e}"))?,
            ),
            "--cost" => cost = true,
            "--seed" => {
                seeds = val()?
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse::<u64>()
                            .map(Some)
                            .map_err(|e| format!("--seed {c}: {e}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--ssd" => ssd = val()?.parse::<u64>().map_err(|e| format!("--ssd: {e}"))?,
            "-h" | "--help" => {
                println!(
                    "usage: trace_sim --trace FILE [--trace FILE...] [--generate SEED...] [--generate-toolagent SEED...] [--generate-sessions SEED...] [--write-traces DIR] [--capacity N,N] [--policy a,b] [--ssd BLOCKS [--ssd-writes N]] [--seed S,S...] [--sweep] [--analyze] [--cost] [--out JSON]"
                );
                println!(
                    "policies: {}",
                    PolicyKind::ALL
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if cost {
        let mut doc = serde_json::json!({"bench": "trace_sim --cost", "chain_blocks": 32, "ssd_blocks": ssd, "ns_per_lookup_release": {}});
        for &k in &kinds {
            let ns = lookup_cost(k, ssd)?;
            println!(
                "{:>16}: {ns:.0} ns per 32-block lookup + release{}",
                k.name(),
                if ssd > 0 { " (DRAM + SSD tiers)" } else { "" }
            );
            doc["ns_per_lookup_release"][k.name()] = serde_json::json!(ns);
        }
        if let Some(path) = &out {
            json_out::save_json(path, &doc)?; // --cost prints its figures, not `wrote PATH`
        }
        return Ok(());
    }
    if traces.is_empty() && generate.is_empty() && toolagent.is_empty() && sessions.is_empty() {
        return Err(
            "give at least one --trace FILE (the Mooncake FAST25 JSONL format) or --generate SEED".into(),
        );
    }
    let mut inputs: Vec<(String, Vec<Vec<u64>>)> = Vec::new();
    for path in &traces {
        let name = std::path::Path::new(path)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(path);
        inputs.push((name.to_string(), parse_trace(path)?));
    }
    for seed in generate {
        inputs.push((format!("generated-{seed}"), generated(seed, 20_000)));
    }
    for seed in toolagent {
        inputs.push((format!("toolagent-gen-{seed}"), generated_toolagent(seed, 20_000)));
    }
    for seed in sessions {
        inputs.push((
            format!("sessions-gen-{seed}"),
            generated_sessions(seed, 20_000, 50),
        ));
    }
    if let Some(dir) = &write_traces {
        write_generated(dir, &inputs[traces.len()..])?;
    }
    let mut rows = Vec::new();
    for (name, trace) in &inputs {
        let trace = trace.as_slice();
        for &cap in &caps {
            // With an SSD tier the references get DRAM + SSD as one capacity.
            let total = cap + ssd;
            let lru = run_lru(trace, total).rate();
            let opt = run_opt(trace, total).rate();
            let oracle = run_oracle_admit_lru(trace, total).rate();
            print!(
                "{name:>14} cap {cap:>6} ssd {ssd:>6}  lru {lru:.3}  opt {opt:.3}  oracle-admit-lru {oracle:.3}"
            );
            let mut row = serde_json::json!({"trace": name, "capacity_blocks": cap, "ssd_blocks": ssd, "ssd_writes_per_request": ssd_writes,
                "requests": trace.len(), "lru": lru, "optimum": opt, "oracle_admission_lru": oracle,
                "policies": {}, "separate": {}, "sweep": {}});
            if analyze {
                let h = optimum_hit_sources(trace, total);
                let f = |n: u64| n as f64 / h.total.max(1) as f64;
                print!(
                    "\n    optimum's hits: {:.2} within LRU's reach (stack distance < capacity), beyond it {:.2} on blocks requested twice or more before, {:.2} on first returns",
                    f(h.within),
                    f(h.beyond_seen_again),
                    f(h.beyond_first_return)
                );
                row["optimum_hits"] = serde_json::json!({"within_capacity": f(h.within),
                    "beyond_reused_before": f(h.beyond_seen_again), "beyond_first_return": f(h.beyond_first_return)});
            }
            if ssd > 0 {
                for (joint, field) in [(true, "policies"), (false, "separate")] {
                    print!(
                        "\n    {}:",
                        if joint {
                            "joint tiers"
                        } else {
                            "separate tiers (before)"
                        }
                    );
                    for &k in &kinds {
                        let mut runs = Vec::new();
                        for &seed in &seeds {
                            let t = run_core_tiered(
                                trace,
                                cap,
                                ssd,
                                Policy::seeded(k, cap * BLOCK, seed),
                                joint,
                                ssd_writes,
                            )?;
                            let (r, from_ssd) = (
                                t.served as f64 / t.requested.max(1) as f64,
                                t.from_ssd as f64 / t.requested.max(1) as f64,
                            );
                            print!(
                                "  {}{} {r:.3} (dram {:.3} + ssd {from_ssd:.3}; {:.2}×opt, {} spilled, {} evicted unspilled, {} store drops, {} unserved)",
                                k.name(),
                                seed.map_or(String::new(), |s| format!("[seed {s}]")),
                                r - from_ssd,
                                r / opt,
                                t.spilled,
                                t.evicted_unspilled,
                                t.dropped_from_ssd,
                                t.unserved
                            );
                            runs.push(
                                serde_json::json!({"seed": seed, "hit_rate": r, "hit_rate_ssd": from_ssd,
                                "hit_rate_dram": r - from_ssd, "vs_optimum": r / opt, "vs_lru": r / lru,
                                "spilled_blocks": t.spilled, "ssd_store_dropped_blocks": t.dropped_from_ssd,
                                "evicted_unspilled_blocks": t.evicted_unspilled,
                                "unserved_lookups": t.unserved}),
                            );
                        }
                        row[field][k.name()] = summarize(runs);
                    }
                }
                println!();
                rows.push(row);
                continue;
            }
            if analyze {
                print!("\n   ");
            }
            for &k in &kinds {
                let mut runs = Vec::new();
                for &seed in &seeds {
                    let t0 = Instant::now();
                    let r = run_core(trace, cap, Policy::seeded(k, cap * BLOCK, seed))?.rate();
                    print!(
                        "  {}{} {r:.3} ({:.2}×opt)",
                        k.name(),
                        seed.map_or(String::new(), |s| format!("[seed {s}]")),
                        r / opt
                    );
                    runs.push(
                        serde_json::json!({"seed": seed, "hit_rate": r, "vs_optimum": r / opt,
                        "vs_lru": r / lru, "seconds": t0.elapsed().as_secs_f64()}),
                    );
                }
                row["policies"][k.name()] = summarize(runs);
            }
            println!();
            if sweep {
                for small in [5u64, 10, 20, 40] {
                    for ghost_x in [1u64, 4, 16] {
                        for deep in [false, true] {
                            let p = Policy::s3fifo_tuned(cap * BLOCK, small, ghost_x * cap * BLOCK, deep);
                            let r = run_core(trace, cap, p)?.rate();
                            println!(
                                "    s3fifo small {small:>2}% ghost {ghost_x:>2}x deepest_first {deep:<5} {r:.3} ({:.2}×opt)",
                                r / opt
                            );
                            row["sweep"][format!("s3fifo/small{small}/ghost{ghost_x}x/deep{deep}")] =
                                serde_json::json!(r);
                        }
                    }
                }
                for window in [1u64, 5, 20, 50] {
                    for sample_x in [2u64, 8, 32] {
                        for deep in [false, true] {
                            let p = Policy::tinylfu_tuned(cap * BLOCK, window, sample_x, deep);
                            let r = run_core(trace, cap, p)?.rate();
                            println!(
                                "    tinylfu window {window:>2}% sample {sample_x:>2}x deepest_first {deep:<5} {r:.3} ({:.2}×opt)",
                                r / opt
                            );
                            row["sweep"][format!("tinylfu/window{window}/sample{sample_x}x/deep{deep}")] =
                                serde_json::json!(r);
                        }
                    }
                }
            }
            rows.push(row);
        }
    }
    if let Some(path) = out {
        let doc = serde_json::json!({"bench": "trace_sim", "block_bytes": BLOCK, "rows": rows});
        json_out::write_json(&path, &doc)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Multi-turn chats sharing a system block: turn k+1 extends turn k's blocks.
    fn chats(seed: u64, n: usize) -> Vec<Vec<u64>> {
        let mut x = seed;
        let mut rnd = move |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let mut open: Vec<Vec<u64>> = Vec::new();
        let mut next_id = 1;
        let mut out = Vec::new();
        for _ in 0..n {
            let i = rnd(open.len() as u64 + 4) as usize;
            let mut req = if i < open.len() { open[i].clone() } else { vec![0] };
            for _ in 0..1 + rnd(6) {
                req.push(next_id);
                next_id += 1;
            }
            if i < open.len() && req.len() > 24 {
                open.swap_remove(i); // the chat ends; requests stay far shorter than any capacity tested
            } else if i < open.len() {
                open[i] = req.clone();
            } else {
                open.push(req.clone());
            }
            out.push(req);
        }
        out
    }

    /// Where every request fits the cache many times over. (A request longer than the
    /// cache differs on purpose: `begin_save` refuses the blocks it cannot place
    /// without evicting the same save's own, so the Manager keeps a chain's head
    /// where plain LRU keeps its useless tail.)
    #[test]
    fn the_core_driven_lru_matches_the_reference_lru_block_for_block() {
        let trace = chats(7, 3000);
        for cap in [128, 512, 2048] {
            let reference = run_lru(&trace, cap);
            let core = run_core(&trace, cap, Policy::new(PolicyKind::Lru, cap * BLOCK)).expect("replay");
            assert_eq!(
                (core.requested, core.served),
                (reference.requested, reference.served),
                "capacity {cap}"
            );
        }
    }

    #[test]
    fn the_optimum_bounds_every_online_policy_and_grows_with_capacity() {
        let trace = chats(11, 3000);
        let mut last = 0.0;
        for cap in [64, 256, 1024, 100_000] {
            let opt = run_opt(&trace, cap).rate();
            assert!(opt >= last, "optimum fell from {last} to {opt} at capacity {cap}");
            last = opt;
            for k in PolicyKind::ALL {
                let r = run_core(&trace, cap, Policy::new(k, cap * BLOCK))
                    .expect("replay")
                    .rate();
                assert!(r <= opt + 1e-12, "{k} at {cap}: {r} above the optimum {opt}");
            }
        }
        // With room for everything, every policy serves every block seen before.
        let all = run_lru(&trace, 100_000).rate();
        assert!(
            (last - all).abs() < 1e-12 && all > 0.3,
            "infinite cache: optimum {last}, lru {all}"
        );
    }

    #[test]
    fn the_generated_trace_is_seeded_and_has_long_and_one_time_reuse() {
        let a = generated(5, 4000);
        assert_eq!(a, generated(5, 4000), "same seed, same trace");
        assert_ne!(a, generated(6, 4000));
        assert_eq!(a.len(), 4000);
        // Some blocks come back, most of the trace is new blocks, nothing is empty.
        let mut seen = std::collections::HashSet::new();
        let (mut total, mut again) = (0u64, 0u64);
        for req in &a {
            assert!(!req.is_empty());
            for id in req {
                total += 1;
                again += u64::from(!seen.insert(*id));
            }
        }
        assert!(
            again > total / 10 && again < total / 2,
            "{again} of {total} blocks seen before"
        );
    }

    #[test]
    fn oracle_admission_lies_between_lru_and_the_optimum() {
        for (seed, cap) in [(3u64, 256u64), (4, 1024), (5, 4096)] {
            let trace = generated(seed, 5000);
            let lru = run_lru(&trace, cap).rate();
            let oracle = run_oracle_admit_lru(&trace, cap).rate();
            let opt = run_opt(&trace, cap).rate();
            assert!(
                lru < oracle && oracle <= opt + 1e-12,
                "cap {cap}: lru {lru} oracle {oracle} opt {opt}"
            );
        }
    }

    /// `duel` follows whichever of its two policies serves more: on these traces it
    /// is never below LRU (the goal it was built for).
    #[test]
    fn duel_is_not_below_lru_on_generated_traces() {
        for (seed, cap) in [(8u64, 512u64), (9, 2048), (10, 8192)] {
            let trace = generated(seed, 8000);
            let lru = run_lru(&trace, cap).rate();
            let duel = run_core(&trace, cap, Policy::seeded(PolicyKind::Duel, cap * BLOCK, SEED))
                .expect("replay")
                .rate();
            assert!(duel >= lru, "seed {seed} cap {cap}: duel {duel} < lru {lru}");
        }
    }

    /// Interleaved sessions (`generated_sessions`) suit LRU, and an S3-FIFO
    /// candidate leaves holes in the sessions' chains, so it serves less than its
    /// shadow's key hits promise. With shadows scored by the prefix each chain
    /// would be served, `duel` is 0.0035 below LRU on average over these six
    /// points (at worst 0.011); scored by every sampled key present, as before,
    /// it followed S3-FIFO and fell 0.011 below on average (at worst 0.019).
    /// Holes at blocks outside the 1-in-16 sample stay invisible to the shadows:
    /// what is left of the gap.
    #[test]
    fn duel_stays_near_lru_on_interleaved_sessions() {
        let mut diffs = Vec::new();
        for seed in [3u64, 4] {
            let trace = generated_sessions(seed, 20_000, 50);
            for cap in [768u64, 1024, 1536] {
                let lru = run_lru(&trace, cap).rate();
                let duel = run_core(&trace, cap, Policy::seeded(PolicyKind::Duel, cap * BLOCK, SEED))
                    .expect("replay")
                    .rate();
                diffs.push(duel - lru);
            }
        }
        let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
        assert!(
            mean >= -0.005,
            "duel - lru: mean {mean:+.4}, per point {diffs:+.4?}"
        );
    }

    /// `--write-traces` writes what `parse_trace` (and `trace_replay.py`) read back.
    #[test]
    fn written_traces_read_back_the_same() {
        let dir = std::env::temp_dir().join(format!("trace_sim_write_{}", std::process::id()));
        let trace = generated_sessions(9, 300, 20);
        let name = "sessions-gen-9".to_string();
        write_generated(dir.to_str().expect("utf-8 temp dir"), &[(name, trace.clone())]).expect("write");
        let path = dir.join("sessions-gen-9.jsonl");
        let back = parse_trace(path.to_str().expect("utf-8 path")).expect("parse");
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(back, trace);
    }

    /// `duel`'s sample seed in these tests: fixed, so a test sees the same
    /// figures in every run (the Manager's default is random per process).
    const SEED: Option<u64> = Some(1);

    /// DRAM and SSD decided as one capacity: the policy keeps the SSD within its
    /// size (the store never has to drop a copy by its own order), with a disk
    /// that keeps up DRAM evicts almost no block the SSD would have kept before
    /// it was copied (the spill-ahead lists what eviction takes next), and `duel`
    /// through the same two tiers is not below `lru` through them.
    #[test]
    fn joint_tiers_keep_the_ssd_within_its_size_and_duel_is_not_below_lru() {
        for (seed, dram, ssd) in [(13u64, 256u64, 768u64), (14, 512, 1536)] {
            let trace = generated(seed, 6000);
            let run = |kind| {
                run_core_tiered(
                    &trace,
                    dram,
                    ssd,
                    Policy::seeded(kind, dram * BLOCK, SEED),
                    true,
                    0,
                )
                .expect("tiers")
            };
            let (lru, duel) = (run(PolicyKind::Lru), run(PolicyKind::Duel));
            for t in [&lru, &duel] {
                assert_eq!(t.dropped_from_ssd, 0, "seed {seed}: {t:?}");
                assert!(t.from_ssd > 0 && t.unserved == 0, "seed {seed}: {t:?}");
                assert!(
                    t.evicted_unspilled * 20 <= t.spilled,
                    "seed {seed}: more than 5 % of spills lost to eviction with a disk that keeps up: {t:?}"
                );
            }
            assert!(
                duel.served >= lru.served,
                "seed {seed}: duel {duel:?} below lru {lru:?}"
            );
        }
    }

    #[test]
    fn an_ssd_tier_serves_more_than_dram_alone_and_never_above_the_optimum() {
        let trace = generated(12, 6000);
        for kind in [PolicyKind::Duel, PolicyKind::Lru] {
            let dram = run_core(&trace, 256, Policy::new(kind, 256 * BLOCK)).expect("dram");
            let tiered =
                run_core_tiered(&trace, 256, 1024, Policy::new(kind, 256 * BLOCK), true, 0).expect("tiers");
            assert_eq!(tiered.requested, dram.requested);
            assert!(tiered.from_ssd > 0 && tiered.spilled > 0, "{kind}: {tiered:?}");
            assert!(tiered.served > dram.served, "{kind}: {tiered:?} vs {dram:?}");
            assert!(tiered.from_ssd <= tiered.served);
            let opt = run_opt(&trace, 256 + 1024);
            assert!(
                tiered.served <= opt.served,
                "{kind}: {tiered:?} above the optimum {opt:?}"
            );
        }
    }
}
