//! Retention hints on traces: replays prefix-block traces with arrival times (the
//! Mooncake FAST25 format) through the Manager's own cache code (`CacheState`, the
//! default `duel` policy, no sockets), with retention hints an application could send,
//! against the offline optimum and LRU computed in the same run.
//!
//! A request *continues* an earlier one when its blocks start with all of that request's
//! blocks but the last (partial) one: the next turn of the same conversation. The
//! application knows which conversation a request belongs to (its own session), so the
//! continuation structure is known at request time; whether and when a conversation
//! returns is not. Hint sources (`--hints`):
//!
//! - `none`: no hints (the Manager as today);
//! - `turns:T`: after each request that continues a conversation (turn 2 on), keep its
//!   chain for T seconds (the application expects the user back; no future knowledge);
//! - `every:T`: the same for every request, first turns included (no future knowledge);
//! - `gap:K`: after each request that continues a conversation, keep its chain for K times
//!   the gap since the conversation's previous turn (no future knowledge);
//! - `first-done[:T]`: first turns `done` (most never return), later turns kept T seconds
//!   (or no hint) (no future knowledge);
//! - `continues:T`: keep for T seconds when the conversation goes on, `done` after its last
//!   turn; `continues-gap:K` the same with K times its previous gap (first turns: K times
//!   the trace's median gap). They know **whether** a conversation goes on, not when: an
//!   agent loop or a chat the user has not closed knows it; for a chat trace it is the
//!   trace's future;
//! - `return-time`: keep until the conversation's next turn arrives (+1 s), `done` after
//!   its last turn: an application that knows when it returns (an agent loop waiting on
//!   a tool call), not a chat. **Uses the trace's future**: a reference for what hints can
//!   reach when the application knows, not a result an online chat could have.
//!
//! Every request: expire hints due at its arrival, `lookup` (the longest present prefix
//! is served), save the blocks after the hit, then the hint on the whole chain.
//!
//!   cargo run --release -p orbitkv-benches --bin hint_sim -- \
//!       --trace conversation.jsonl --capacity 4096,16384 \
//!       --hints none,turns:120,gap:1.5,continues:60,return-time --retain-share 0.8 [--out hint_sim.json]
//!
//! Traces are read from files the user provides; nothing is downloaded.

use std::collections::HashMap;
use std::time::Instant;

use orbitkv_core::policy::{Policy, PolicyKind};
use orbitkv_core::{CacheState, Retain};

#[path = "common/json_out.rs"]
mod json_out;
#[path = "common/trace.rs"]
mod trace;
use trace::{Request, Tally, hash_of, open_replay, parse_requests, run_opt};

const BLOCK: u64 = 64 << 10;

/// Where hints come from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Hints {
    None,
    Turns { keep_ms: u64 },
    Every { keep_ms: u64 },
    Gap { factor: f64 },
    FirstDone { keep_ms: Option<u64> },
    Continues { keep_ms: u64 },
    ContinuesGap { factor: f64 },
    ReturnTime,
}

impl Hints {
    fn parse(s: &str) -> Result<Hints, String> {
        let secs = |t: &str| -> Result<u64, String> {
            let v: f64 = t.parse().map_err(|e| format!("--hints {s}: {e}"))?;
            if !(0.001..=86_400.0).contains(&v) {
                return Err(format!("--hints {s}: seconds must be from 0.001 to 86400"));
            }
            Ok((v * 1000.0) as u64)
        };
        let factor = |k: &str| -> Result<f64, String> {
            match k.parse::<f64>() {
                Ok(v) if (0.1..=100.0).contains(&v) => Ok(v),
                _ => Err(format!("--hints {s}: the factor must be from 0.1 to 100")),
            }
        };
        match s.split_once(':') {
            None if s == "none" => Ok(Hints::None),
            None if s == "return-time" => Ok(Hints::ReturnTime),
            Some(("turns", t)) => Ok(Hints::Turns { keep_ms: secs(t)? }),
            Some(("every", t)) => Ok(Hints::Every { keep_ms: secs(t)? }),
            None if s == "first-done" => Ok(Hints::FirstDone { keep_ms: None }),
            Some(("first-done", t)) => Ok(Hints::FirstDone {
                keep_ms: Some(secs(t)?),
            }),
            Some(("continues", t)) => Ok(Hints::Continues { keep_ms: secs(t)? }),
            Some(("gap", k)) => Ok(Hints::Gap { factor: factor(k)? }),
            Some(("continues-gap", k)) => Ok(Hints::ContinuesGap { factor: factor(k)? }),
            _ => Err(format!(
                "--hints {s:?}: expected none, turns:SECONDS, every:SECONDS, gap:FACTOR, \
                 continues:SECONDS, continues-gap:FACTOR or return-time"
            )),
        }
    }

    fn name(self) -> String {
        match self {
            Hints::None => "none".into(),
            Hints::Turns { keep_ms } => format!("turns:{}", keep_ms as f64 / 1000.0),
            Hints::Every { keep_ms } => format!("every:{}", keep_ms as f64 / 1000.0),
            Hints::Gap { factor } => format!("gap:{factor}"),
            Hints::FirstDone { keep_ms: None } => "first-done".into(),
            Hints::FirstDone { keep_ms: Some(k) } => format!("first-done:{}", k as f64 / 1000.0),
            Hints::Continues { keep_ms } => format!("continues:{}", keep_ms as f64 / 1000.0),
            Hints::ContinuesGap { factor } => format!("continues-gap:{factor}"),
            Hints::ReturnTime => "return-time".into(),
        }
    }

    /// What the source knows of the trace's future: nothing, whether the conversation
    /// goes on (not when), or when it returns.
    fn knows(self) -> &'static str {
        match self {
            Hints::None
            | Hints::Turns { .. }
            | Hints::Every { .. }
            | Hints::Gap { .. }
            | Hints::FirstDone { .. } => "nothing",
            Hints::Continues { .. } | Hints::ContinuesGap { .. } => "whether",
            Hints::ReturnTime => "when",
        }
    }

    fn uses_future(self) -> bool {
        self.knows() != "nothing"
    }
}

/// Per request: the earlier request it continues (its previous turn), if any, and the
/// later request that continues it (its next turn), if any.
struct Turns {
    prev: Vec<Option<usize>>,
    next: Vec<Option<usize>>,
    /// The median gap between consecutive turns (ms): the keep of a first turn that goes
    /// on under `continues-gap` (the deployment's typical gap, known from its history).
    median_gap_ms: u64,
}

fn turns(trace: &[Request]) -> Turns {
    let mix = |h: u64, id: u64| (h ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) ^ (h >> 7);
    // Chain hash of a request's blocks but the last -> the latest such request.
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut prev = vec![None; trace.len()];
    let mut next = vec![None; trace.len()];
    for (i, r) in trace.iter().enumerate() {
        let mut chain = Vec::with_capacity(r.ids.len());
        let mut h = 0x5eed_u64;
        for &id in &r.ids {
            h = mix(h, id);
            chain.push(h);
        }
        // The longest earlier request (at least 2 full blocks: block 0 is shared by
        // nearly every request of the conversation trace) whose full blocks start this one.
        for len in (2..=r.ids.len()).rev() {
            if let Some(&p) = open.get(&chain[len - 1]) {
                prev[i] = Some(p);
                if next[p].is_none() {
                    next[p] = Some(i);
                }
                break;
            }
        }
        if r.ids.len() >= 3 {
            open.insert(chain[r.ids.len() - 2], i);
        }
    }
    let mut gaps: Vec<u64> = (0..trace.len())
        .filter_map(|i| prev[i].map(|p| trace[i].t_ms.saturating_sub(trace[p].t_ms)))
        .collect();
    gaps.sort_unstable();
    let median_gap_ms = gaps.get(gaps.len() / 2).copied().unwrap_or(60_000);
    Turns {
        prev,
        next,
        median_gap_ms,
    }
}

#[derive(Default)]
struct Run {
    tally: Tally,
    hints_sent: u64,
    stats: orbitkv_core::HintStats,
}

/// `factor` times the gap between a request and the previous turn of its conversation
/// (what the application saw), from 1 s to the longest keep.
fn scaled_gap(trace: &[Request], prev: usize, i: usize, factor: f64) -> u64 {
    keep_of(trace[i].t_ms.saturating_sub(trace[prev].t_ms), factor)
}

/// `factor` times `gap_ms`, from 1 s to the longest keep.
fn keep_of(gap_ms: u64, factor: f64) -> u64 {
    ((gap_ms as f64 * factor) as u64).clamp(1000, orbitkv_core::MAX_RETAIN_TTL_MS)
}

fn replay(
    trace: &[Request],
    t: &Turns,
    capacity: u64,
    hints: Hints,
    share: f64,
    kind: PolicyKind,
) -> Result<Run, String> {
    let policy = Policy::seeded(kind, capacity * BLOCK, Some(1));
    let mut cache = CacheState::with_policy_instance(&[capacity * BLOCK], policy);
    cache.set_retention_cap((capacity as f64 * share) as u64 * BLOCK);
    let (s, ns) = open_replay(&mut cache, BLOCK)?;
    let mut run = Run::default();
    let t0 = trace.first().map_or(0, |r| r.t_ms);
    for (i, req) in trace.iter().enumerate() {
        let now = req.t_ms - t0.min(req.t_ms);
        if cache.hint_expiry_due(now) {
            cache.expire_hints(now);
        }
        let hashes: Vec<[u8; 32]> = req.ids.iter().map(|&id| hash_of(id)).collect();
        let r = cache.lookup(s, ns, &hashes).map_err(|e| e.to_string())?;
        run.tally.requested += hashes.len() as u64;
        run.tally.served += u64::from(r.hit_blocks);
        if let Some(l) = r.lease {
            cache.release(s, l).map_err(|e| e.to_string())?;
        }
        let rest = &hashes[r.hit_blocks as usize..];
        if !rest.is_empty() {
            let (id, _) = cache.begin_save(s, ns, rest).map_err(|e| e.to_string())?;
            cache.commit_save(s, id).map_err(|e| e.to_string())?;
        }
        let what = match hints {
            Hints::None => None,
            Hints::Turns { keep_ms } => t.prev[i].map(|_| Retain::Keep { ttl_ms: keep_ms }),
            Hints::Every { keep_ms } => Some(Retain::Keep { ttl_ms: keep_ms }),
            Hints::Gap { factor } => t.prev[i].map(|p| Retain::Keep {
                ttl_ms: scaled_gap(trace, p, i, factor),
            }),
            Hints::FirstDone { keep_ms } => match (t.prev[i], keep_ms) {
                (None, _) => Some(Retain::Done),
                (Some(_), Some(k)) => Some(Retain::Keep { ttl_ms: k }),
                (Some(_), None) => None,
            },
            Hints::Continues { keep_ms } => Some(match t.next[i] {
                Some(_) => Retain::Keep { ttl_ms: keep_ms },
                None => Retain::Done,
            }),
            Hints::ContinuesGap { factor } => Some(match (t.next[i], t.prev[i]) {
                (Some(_), Some(p)) => Retain::Keep {
                    ttl_ms: scaled_gap(trace, p, i, factor),
                },
                // A first turn that goes on: no gap of its own yet, the typical one.
                (Some(_), None) => Retain::Keep {
                    ttl_ms: keep_of(t.median_gap_ms, factor),
                },
                (None, _) => Retain::Done,
            }),
            Hints::ReturnTime => Some(match t.next[i] {
                Some(n) => Retain::Keep {
                    ttl_ms: (trace[n].t_ms.saturating_sub(req.t_ms) + 1000)
                        .min(orbitkv_core::MAX_RETAIN_TTL_MS),
                },
                None => Retain::Done,
            }),
        };
        if let Some(what) = what {
            cache
                .retain(s, ns, &hashes, what, now)
                .map_err(|e| e.to_string())?;
            run.hints_sent += 1;
        }
    }
    run.stats = cache.hint_stats();
    Ok(run)
}

fn main() {
    trace::exit_on_error("hint_sim", real_main());
}

fn real_main() -> Result<(), String> {
    let mut traces = Vec::new();
    let mut capacities = vec![4096u64, 16384];
    let mut hints = vec![Hints::None, Hints::Turns { keep_ms: 120_000 }, Hints::ReturnTime];
    let mut shares = vec![0.8];
    let mut kind = PolicyKind::default();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--trace" => traces.push(val()?),
            "--capacity" => capacities = trace::parse_capacities(&val()?)?,
            "--hints" => hints = val()?.split(',').map(Hints::parse).collect::<Result<_, _>>()?,
            "--retain-share" => {
                shares = val()?
                    .split(',')
                    .map(|v| match v.parse::<f64>() {
                        Ok(x) if (0.0..=0.95).contains(&x) => Ok(x),
                        _ => Err(format!("--retain-share {v}: must be from 0 to 0.95")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--policy" => kind = val()?.parse()?,
            "--out" => out = Some(val()?),
            "-h" | "--help" => {
                println!(
                    "hint_sim --trace FILE... [--capacity N,...] [--hints none,turns:S,every:S,gap:K,first-done[:S],continues:S,continues-gap:K,return-time] \
                     [--retain-share X,...] [--policy KIND] [--out FILE.json]"
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if traces.is_empty() {
        return Err("no --trace given (Mooncake FAST25 JSONL with timestamps)".into());
    }
    let mut results = Vec::new();
    for path in &traces {
        let trace = parse_requests(path)?;
        let t = turns(&trace);
        let continued = t.next.iter().filter(|n| n.is_some()).count();
        let ids: Vec<Vec<u64>> = trace.iter().map(|r| r.ids.clone()).collect();
        println!(
            "{path}: {} requests, {continued} continued later, {} continue an earlier one",
            trace.len(),
            t.prev.iter().filter(|p| p.is_some()).count()
        );
        for &cap in &capacities {
            let opt = run_opt(&ids, cap).rate();
            let lru = replay(&trace, &t, cap, Hints::None, 0.0, PolicyKind::Lru)?
                .tally
                .rate();
            println!("  {cap} blocks: optimum {opt:.3}, LRU {lru:.3}");
            for &h in &hints {
                for &share in if h == Hints::None { &[0.0][..] } else { &shares[..] } {
                    let started = Instant::now();
                    let run = replay(&trace, &t, cap, h, share, kind)?;
                    let rate = run.tally.rate();
                    let r = run.stats.retention;
                    println!(
                        "    {kind} hints {:<12} share {share:.2}: {rate:.3} ({:.2}x optimum){}  kept {} refused {} \
                         expired {} displaced {} kept-evicted {} done {}  [{:.1} s]",
                        h.name(),
                        rate / opt,
                        if h.uses_future() {
                            " [future knowledge]"
                        } else {
                            ""
                        },
                        r.kept_total,
                        r.refused_total,
                        r.expired_total,
                        r.displaced_total,
                        r.kept_evicted_total,
                        r.done_total,
                        started.elapsed().as_secs_f64()
                    );
                    results.push(serde_json::json!({
                        "trace": path, "capacity_blocks": cap, "policy": kind.name(), "hints": h.name(),
                        "uses_future": h.uses_future(), "knows": h.knows(), "retain_share": share, "hit_rate": rate,
                        "optimum": opt, "lru": lru, "of_optimum": rate / opt, "hints_sent": run.hints_sent,
                        "kept_blocks_total": r.kept_total, "refused_blocks_total": r.refused_total,
                        "expired_blocks_total": r.expired_total, "displaced_blocks_total": r.displaced_total,
                        "kept_evicted_total": r.kept_evicted_total, "done_blocks_total": r.done_total,
                        "pending_applied_total": run.stats.pending_applied_total,
                    }));
                }
            }
        }
    }
    if let Some(path) = out {
        let doc = serde_json::json!({
            "bench": "hint_sim",
            "baseline": "the offline optimum (Belady with bypass on the same prefix lookups) and LRU, same run",
            "block_bytes": BLOCK,
            "results": results,
        });
        json_out::write_json(&path, &doc)?;
    }
    Ok(())
}
