//! The SSD tier's choice of what to spill at millions of blocks: how long one
//! `CacheState::spill_candidates` call takes (the Manager's SSD worker makes it
//! under the exclusive cache lock, which stalls every lookup meanwhile) with the
//! default `evict` spill policy and the two tiers decided as one capacity, as
//! `orbitkv serve --ssd-dir` runs them. In-process, no I/O: every spill is
//! reported written at once.
//!
//! For each block count: an arena of exactly that many 4 KiB blocks is filled
//! with 32-block chains to twice its capacity, the SSD worker's pass
//! (`spill_candidates(64)`, then `spill_done` for each job) made every 32 saves;
//! reported: the pass's mean and worst time over the second half of the fill
//! (the arena full), and an idle pass (nothing new saved). Baseline in the same
//! run and process: one lookup + release of a resident 32-block chain (what the
//! exclusive lock holds up), mean over 10,000.
//!
//! Usage: spill_scale [OUT.json] [--blocks 100000,1000000]

use std::time::Instant;

use orbitkv_core::policy::PolicyKind;
use orbitkv_core::{CacheState, Fingerprint, NamespaceKey, SpillPolicy};

#[path = "common/chain.rs"]
mod chain;
#[path = "common/json_out.rs"]
mod json_out;
use chain::synthetic_chain;

const BLOCK: u64 = 4096;
const SEGMENT: u64 = 1 << 30;
const CHAIN: u64 = 32;
const BATCH: usize = 64;

fn run(blocks: u64) -> Result<serde_json::Value, String> {
    let dram = blocks * BLOCK;
    let segs: Vec<u64> = (0..dram.div_ceil(SEGMENT))
        .map(|i| (dram - i * SEGMENT).min(SEGMENT))
        .collect();
    let mut c = CacheState::with_policy_seed(&segs, PolicyKind::Duel, Some(1));
    let key = NamespaceKey {
        fingerprint: Fingerprint([7; 32]),
        shard: 0,
        salt: [0; 32],
    };
    let (ns, _) = c.register_namespace(key, BLOCK).map_err(|e| e.to_string())?;
    c.enable_ssd_tiers(0, SpillPolicy::Evict, 4 * dram);
    let s = c.open_session();
    let chains = blocks / CHAIN * 2;
    let (mut sum, mut worst, mut passes, mut spilled) = (0f64, 0f64, 0u64, 0u64);
    // The worst pass, whether it completed a walk of the cold end, and the worst
    // pass that did not.
    let (mut worst_completed_walk, mut worst_plain) = (false, 0f64);
    for i in 0..chains {
        let hs = synthetic_chain(i, CHAIN);
        let (id, _) = c.begin_save(s, ns, &hs).map_err(|e| e.to_string())?;
        c.commit_save(s, id).map_err(|e| e.to_string())?;
        if i % 32 == 0 {
            let plans_before = c.counters().spill_plans;
            let t = Instant::now();
            let jobs = c.spill_candidates(BATCH);
            let dt = t.elapsed().as_secs_f64();
            let completed_walk = c.counters().spill_plans > plans_before;
            for j in &jobs {
                c.spill_done(j, true);
            }
            spilled += jobs.len() as u64;
            if i >= chains / 2 {
                sum += dt;
                if dt > worst {
                    worst = dt;
                    worst_completed_walk = completed_walk;
                }
                passes += 1;
                if !completed_walk {
                    worst_plain = worst_plain.max(dt);
                }
            }
        }
    }
    let t = Instant::now();
    let idle_passes = 10;
    for _ in 0..idle_passes {
        for j in &c.spill_candidates(BATCH) {
            c.spill_done(j, true);
        }
    }
    let idle = t.elapsed().as_secs_f64() / f64::from(idle_passes);
    // Baseline: lookup + release of resident chains (the newest ones are resident).
    let n = 10_000u64;
    let t = Instant::now();
    for k in 0..n {
        let hit = c
            .lookup(s, ns, &synthetic_chain(chains - 1 - k % 64, CHAIN))
            .map_err(|e| e.to_string())?;
        if let Some(l) = hit.lease {
            c.release(s, l).map_err(|e| e.to_string())?;
        }
    }
    let lookup = t.elapsed().as_secs_f64() / n as f64;
    let mean = sum / passes.max(1) as f64;
    let counters = c.counters();
    let (plans, unspilled) = (counters.spill_plans, counters.evicted_unspilled);
    println!(
        "blocks {blocks:>9}: spill pass mean {:.2} ms, worst {:.2} ms (completing a walk: {worst_completed_walk}; worst of the others {:.2} ms) ({passes} passes, {spilled} spilled, {plans} walks, {unspilled} evicted unspilled), idle pass {:.2} ms; lookup+release {:.1} us: a pass = {:.0} lookups",
        mean * 1e3,
        worst * 1e3,
        worst_plain * 1e3,
        idle * 1e3,
        lookup * 1e6,
        mean / lookup
    );
    Ok(serde_json::json!({
        "blocks": blocks, "spill_pass_mean_s": mean, "spill_pass_worst_s": worst, "passes": passes,
        "spilled": spilled, "idle_pass_s": idle, "baseline_lookup_release_s": lookup,
        "pass_in_lookups": mean / lookup, "spill_plans": plans, "evicted_unspilled": unspilled,
        "worst_pass_completed_walk": worst_completed_walk, "worst_pass_not_completing_a_walk_s": worst_plain,
    }))
}

fn main() -> Result<(), String> {
    let mut out = String::from("spill_scale.json");
    let mut blocks = vec![100_000u64, 1_000_000];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--blocks" => {
                let v = args.next().ok_or("--blocks needs a list")?;
                blocks = v
                    .split(',')
                    .map(|x| x.trim().parse().map_err(|_| format!("bad block count {x:?}")))
                    .collect::<Result<_, _>>()?;
            }
            a if a.starts_with("--") => return Err(format!("unknown option {a}")),
            a => out = a.to_string(),
        }
    }
    let rows = blocks.iter().map(|&b| run(b)).collect::<Result<Vec<_>, _>>()?;
    let doc = serde_json::json!({
        "bench": "spill_scale",
        "what": "CacheState::spill_candidates(64) (evict policy, tiers as one capacity) vs lookup+release, in-process",
        "rows": rows,
    });
    json_out::write_json(&out, &doc)
}
