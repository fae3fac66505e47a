//! The Manager's shared-lock lookup path in one process, no sockets: N threads
//! each run lookup + release of a 32-block full hit through the same calls a
//! session thread makes (`lookup_shared`, `apply_touches_shared(false)`,
//! `try_release_shared` under the cache `RwLock`'s shared side), beside a
//! policy thread replaying the touch log every millisecond, as
//! `server::policy_replay` does. Baseline in the same run: the 1-thread
//! figure scaled linearly. If this path scales far past what the socket bench
//! reaches, the cache state is not what limits the Manager.
//!
//! Usage: lookup_threads [OUT.json] [--threads 1,8,16,32] [--seconds 1] [--policy duel]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::time::{Duration, Instant};

use orbitkv_core::policy::PolicyKind;
use orbitkv_core::{BlockHash, CacheState, Fingerprint, LeaseId, NamespaceKey, NsId, SessionId};

#[path = "common/chain.rs"]
mod chain;
#[path = "common/json_out.rs"]
mod json_out;
use chain::synthetic_chain;

const BLOCK: u64 = 4096;
const CHAIN: u32 = 32;
const CHAINS: u64 = 64;

struct Point {
    threads: usize,
    ops_per_s: f64,
}

fn run(kind: PolicyKind, threads: usize, seconds: f64) -> Result<Point, String> {
    let cache = Arc::new(RwLock::new(CacheState::with_policy(&[256 << 20], kind)));
    let (ns, sessions) = {
        let mut c = cache.write().map_err(|_| "poisoned")?;
        let key = NamespaceKey {
            fingerprint: Fingerprint([5; 32]),
            shard: 0,
            salt: [0; 32],
        };
        let (ns, _) = c.register_namespace(key, BLOCK).map_err(|e| e.to_string())?;
        let writer = c.open_session();
        for i in 0..CHAINS {
            let hs = synthetic_chain(i, u64::from(CHAIN));
            let (id, _) = c.begin_save(writer, ns, &hs).map_err(|e| e.to_string())?;
            c.commit_save(writer, id).map_err(|e| e.to_string())?;
        }
        let sessions: Vec<SessionId> = (0..threads).map(|_| c.open_session()).collect();
        (ns, sessions)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let replay = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
                if let Ok(c) = cache.read()
                    && c.touches_pending() > 0
                {
                    c.apply_touches_shared(true);
                }
            }
        })
    };
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(w, s)| {
            let (cache, start, stop) = (cache.clone(), start.clone(), stop.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                let hs = synthetic_chain(w as u64 % CHAINS, u64::from(CHAIN));
                start.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let lease = {
                        let c = cache.read().map_err(|_| "poisoned")?;
                        let r = lookup(&c, s, ns, &hs)?;
                        c.apply_touches_shared(false);
                        r
                    };
                    let c = cache.read().map_err(|_| "poisoned")?;
                    if !c.try_release_shared(s, lease).map_err(|e| e.to_string())? {
                        return Err("release needed the exclusive path".into());
                    }
                    n += 1;
                }
                Ok(n)
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut ops = 0;
    for w in workers {
        ops += w.join().map_err(|_| "worker panicked")??;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let _ = replay.join();
    Ok(Point {
        threads,
        ops_per_s: ops as f64 / elapsed,
    })
}

fn lookup(c: &CacheState, s: SessionId, ns: NsId, hs: &[BlockHash]) -> Result<LeaseId, String> {
    let r = c.lookup_shared(s, ns, hs).map_err(|e| e.to_string())?;
    match r.lease {
        Some(l) if r.hit_blocks == CHAIN => Ok(l),
        _ => Err(format!("expected a full hit, got {} blocks", r.hit_blocks)),
    }
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut out = "bench-results/lookup_threads.json".to_string();
    let mut threads = vec![1usize, 8, 16, 32];
    let mut seconds = 1.0;
    let mut policy = PolicyKind::Duel;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => {
                threads = args
                    .next()
                    .ok_or("--threads needs a list")?
                    .split(',')
                    .map(|x| x.parse().map_err(|_| format!("bad thread count {x:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|x| x.parse().ok())
                    .ok_or("--seconds needs a number")?;
            }
            "--policy" => {
                let name = args.next().ok_or("--policy needs a name")?;
                policy = name.parse()?;
            }
            other if !other.starts_with("--") => out = other.to_string(),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let mut rows = Vec::new();
    let mut base = None;
    for &n in &threads {
        let p = run(policy, n, seconds)?;
        let one = *base.get_or_insert(p.ops_per_s / p.threads as f64);
        let row = serde_json::json!({
            "threads": p.threads,
            "ops_per_s": p.ops_per_s,
            "vs_linear": p.ops_per_s / (one * p.threads as f64),
        });
        println!("{row}");
        rows.push(row);
    }
    let doc = serde_json::json!({
        "bench": "lookup_threads",
        "op": "lookup of a 32-block full hit + release, shared lock, in one process (no sockets)",
        "baseline": "the first thread count's rate per thread, scaled linearly",
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "seconds_per_point": seconds,
        "rows": rows,
    });
    json_out::write_json(&out, &doc)
}

/// The tests of the shared bench modules this bench includes (`common/chain.rs`,
/// `common/json_out.rs`): here once, not in every bench that includes them.
#[cfg(test)]
mod common_tests {
    use super::{json_out, synthetic_chain};

    #[test]
    fn distinct_blocks_get_distinct_hashes() {
        let mut seen = std::collections::HashSet::new();
        for c in [0, 1, 2, 1 << 32, u64::MAX] {
            assert!(synthetic_chain(c, 40).into_iter().all(|h| seen.insert(h)));
        }
    }

    #[test]
    fn creates_the_directory_and_names_the_path_on_error() {
        let dir = std::env::temp_dir().join(format!("orbitkv-json-out-{}", std::process::id()));
        let path = dir.join("sub/out.json");
        let path = path.to_str().expect("utf-8 temp path");
        json_out::save_json(path, &serde_json::json!({"a": 1})).expect("write");
        let text = std::fs::read_to_string(path).expect("read back");
        assert_eq!(text, "{\n  \"a\": 1\n}\n");
        let err = json_out::save_json(&format!("{path}/x.json"), &serde_json::json!(null))
            .expect_err("a file as a directory");
        assert!(err.contains(path), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
