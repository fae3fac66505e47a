//! The Manager's metadata at millions of resident blocks (issue 25): for each
//! resident-block count a REAL Manager process (the `orbitkv-manager` binary)
//! with an arena of exactly that many 4 KiB blocks is filled through the real
//! client (begin_save + commit_save of whole chains from several connections;
//! the block bytes are not copied: metadata does not depend on them), then
//!
//! - memory: the Manager's `RssAnon` (/proc/PID/status; the arena and the
//!   presence table are shared memory, `RssShmem`, and are left out) before the
//!   fill, once the arena is full (`filled`), and after `--overfill` times the
//!   capacity was saved (`steady`: evictions have filled the policy's ghost
//!   histories and shadows) — bytes per resident block;
//! - breakdown: the same saves replayed into an in-process `CacheState`
//!   (sans-I/O, no arena bytes) whose `heap_bytes()` estimates each structure
//!   (block index, policy with ghosts and shadows, arena allocator, leases),
//!   plus the presence table's shared bytes per block;
//! - latency: lookup + release of a resident 32-block chain (chosen at random
//!   among resident chains), N client threads each with its own connection,
//!   p50/p99 per client count.
//!
//! Baseline in the same run: the first (smallest) block count's figures; each
//! row gives its p99 as a multiple of the baseline's at the same client count.
//!
//! Usage: index_scale [OUT.json] [--blocks 10000,100000,1000000] [--clients 1,8,16]
//!   [--seconds 2] [--overfill 5] [--policy duel] [--fill-threads N]
//!   [--manager PATH] (default: `orbitkv-manager` next to this binary)
//!   [--no-model] (skip the in-process breakdown: it needs as much memory again)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use orbitkv_client::{Client, Namespace};
use orbitkv_core::policy::PolicyKind;
use orbitkv_core::{BlockHash, CacheState, Fingerprint, HeapBytes, NamespaceKey};

#[path = "common/json_out.rs"]
mod json_out;

const BLOCK: u64 = 4096;
const CHAIN: usize = 32;
const FP: [u8; 32] = [0x25; 32];
const SEGMENT: u64 = 1 << 30;

type Res<T> = Result<T, String>;

struct Opts {
    out: String,
    blocks: Vec<u64>,
    clients: Vec<usize>,
    seconds: f64,
    overfill: f64,
    policy: PolicyKind,
    fill_threads: usize,
    manager: PathBuf,
    model: bool,
}

fn list<T: std::str::FromStr>(v: Option<String>, what: &str) -> Res<Vec<T>> {
    let v = v.ok_or(format!("{what} needs a list"))?;
    v.split(',')
        .map(|x| x.trim().parse().map_err(|_| format!("bad {what} value {x:?}")))
        .collect()
}

fn parse_args() -> Res<Opts> {
    let mut o = Opts {
        out: "bench-results/index_scale.json".into(),
        blocks: vec![10_000, 100_000, 1_000_000],
        clients: vec![1, 8, 16],
        seconds: 2.0,
        overfill: 5.0,
        policy: PolicyKind::Duel,
        fill_threads: std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(2, 8),
        manager: std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("orbitkv-manager"),
        model: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--blocks" => o.blocks = list(args.next(), "--blocks")?,
            "--clients" => o.clients = list(args.next(), "--clients")?,
            "--seconds" => o.seconds = list(args.next(), "--seconds")?.first().copied().unwrap_or(2.0),
            "--overfill" => {
                o.overfill = list(args.next(), "--overfill")?.first().copied().unwrap_or(5.0);
            }
            "--fill-threads" => {
                o.fill_threads = list(args.next(), "--fill-threads")?.first().copied().unwrap_or(2);
            }
            "--policy" => o.policy = args.next().ok_or("--policy needs a name")?.parse()?,
            "--manager" => o.manager = PathBuf::from(args.next().ok_or("--manager needs a path")?),
            "--no-model" => o.model = false,
            other if !other.starts_with("--") => o.out = other.to_string(),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if o.blocks.is_empty() || o.clients.is_empty() {
        return Err("--blocks and --clients need at least one value".into());
    }
    o.overfill = o.overfill.max(1.0);
    o.fill_threads = o.fill_threads.max(1);
    Ok(o)
}

/// Chain `c`'s block hashes (distinct for every chain and position).
fn chain(c: u64) -> Vec<BlockHash> {
    (0..CHAIN as u64)
        .map(|i| {
            let mut h = [0u8; 32];
            h[..8].copy_from_slice(&c.to_le_bytes());
            h[8..16].copy_from_slice(&i.to_le_bytes());
            h[16..24].copy_from_slice(&(c ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(i + 1).to_le_bytes());
            h
        })
        .collect()
}

/// `RssAnon` and `RssShmem` of `pid` in bytes.
fn rss(pid: u32) -> Res<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let field = |name: &str| -> Res<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or(format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("RssAnon:")?, field("RssShmem:")?))
}

/// The first number under a key ending in `name` anywhere in `v`.
fn find_num(v: &serde_json::Value, name: &str) -> Option<u64> {
    match v {
        serde_json::Value::Object(m) => m.iter().find_map(|(k, x)| {
            if k.ends_with(name)
                && let Some(n) = x.as_u64()
            {
                return Some(n);
            }
            find_num(x, name)
        }),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_num(x, name)),
        _ => None,
    }
}

struct ManagerProc {
    child: Child,
    socket: PathBuf,
    dir: PathBuf,
}

impl ManagerProc {
    fn start(bin: &Path, blocks: u64, policy: PolicyKind) -> Res<ManagerProc> {
        let dir = std::env::temp_dir().join(format!("orbitkv-index-scale-{}-{blocks}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let socket = dir.join("m.sock");
        let dram = blocks * BLOCK;
        let segment = dram.min(SEGMENT);
        let child = Command::new(bin)
            .arg("--socket")
            .arg(&socket)
            .args(["--dram-size", &dram.to_string()])
            .args(["--segment-size", &segment.to_string()])
            .args(["--metrics-addr", "off", "--log-level", "warn"])
            .args(["--cache-policy", policy.name(), "--cache-policy-seed", "1"])
            .args(["--max-connections", "256"])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "spawning {}: {e} (build it: cargo build --release -p orbitkv-manager)",
                    bin.display()
                )
            })?;
        let mut m = ManagerProc { child, socket, dir };
        let t0 = Instant::now();
        // A large arena is populated at start: allow time.
        while t0.elapsed() < Duration::from_secs(600) {
            if let Ok(Some(st)) = m.child.try_wait() {
                return Err(format!("manager exited at start: {st}"));
            }
            if std::os::unix::net::UnixStream::connect(&m.socket).is_ok() {
                return Ok(m);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = m.child.kill();
        Err("manager did not come up".into())
    }

    fn client(&self) -> Res<Client> {
        Client::connect(&self.socket, None, Duration::from_secs(60)).map_err(|e| format!("connect: {e}"))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn namespace(c: &Client) -> Res<Namespace> {
    c.register_namespace(FP, BLOCK, 0, [0; 32])
        .map_err(|e| format!("ns: {e}"))
}

/// Save chains `from..to` from `threads` connections, chains interleaved.
fn fill(m: &ManagerProc, from: u64, to: u64, threads: usize) -> Res<u64> {
    let next = Arc::new(AtomicU64::new(from));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let next = next.clone();
            let c = m.client();
            std::thread::spawn(move || -> Res<u64> {
                let c = c?;
                let ns = namespace(&c)?;
                let mut stored = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= to {
                        break;
                    }
                    let save = c
                        .begin_save(&ns, &chain(i))
                        .map_err(|e| format!("begin_save: {e}"))?;
                    stored += u64::from(c.commit_save(save.id).map_err(|e| format!("commit: {e}"))?);
                }
                c.close().map_err(|e| e.to_string())?;
                Ok(stored)
            })
        })
        .collect();
    let mut stored = 0;
    for h in handles {
        stored += h.join().map_err(|_| "fill thread panicked")??;
    }
    Ok(stored)
}

/// Up to `want` chains among `from..to` that are fully resident now.
fn resident_chains(c: &Client, ns: &Namespace, from: u64, to: u64, want: usize) -> Res<Vec<u64>> {
    let mut out = Vec::new();
    let span = to - from;
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..want * 4 {
        if out.len() >= want {
            break;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = from + x % span;
        let hit = c.lookup(ns, &chain(i)).map_err(|e| format!("lookup: {e}"))?;
        if hit.lease != 0 {
            c.release(hit.lease).map_err(|e| format!("release: {e}"))?;
        }
        if hit.hit_blocks as usize == CHAIN && !out.contains(&i) {
            out.push(i);
        }
    }
    Ok(out)
}

struct Lat {
    clients: usize,
    ops_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
}

fn latency(m: &ManagerProc, chains: &Arc<Vec<u64>>, clients: usize, seconds: f64) -> Res<Lat> {
    let start = Arc::new(Barrier::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|w| {
            let (start, chains) = (start.clone(), chains.clone());
            let c = m.client();
            std::thread::spawn(move || -> Res<Vec<u32>> {
                let c = c?;
                let ns = namespace(&c)?;
                let hashes: Vec<Vec<BlockHash>> = chains.iter().map(|&i| chain(i)).collect();
                let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ (w as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut lat = Vec::with_capacity(1 << 20);
                start.wait();
                let t0 = Instant::now();
                while t0.elapsed().as_secs_f64() < seconds {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let hs = &hashes[(x % hashes.len() as u64) as usize];
                    let t = Instant::now();
                    let hit = c.lookup(&ns, hs).map_err(|e| format!("lookup: {e}"))?;
                    if hit.lease != 0 {
                        c.release(hit.lease).map_err(|e| format!("release: {e}"))?;
                    }
                    lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    if hit.hit_blocks as usize != CHAIN {
                        return Err(format!("a resident chain hit {} blocks", hit.hit_blocks));
                    }
                }
                c.close().map_err(|e| e.to_string())?;
                Ok(lat)
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().map_err(|_| "latency thread panicked")??);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    if all.is_empty() {
        return Err("no lookups measured".into());
    }
    let n = all.len();
    all.sort_unstable();
    let q = |p: f64| all[((n as f64 * p) as usize).min(n - 1)] as f64 / 1e3;
    Ok(Lat {
        clients,
        ops_per_s: n as f64 / elapsed,
        p50_us: q(0.50),
        p99_us: q(0.99),
        p999_us: q(0.999),
    })
}

/// The same saves into an in-process `CacheState`: estimated heap by structure
/// after `filled` and after all `total` chains.
fn model(blocks: u64, policy: PolicyKind, filled: u64, total: u64) -> Res<(HeapBytes, HeapBytes, u64)> {
    let dram = blocks * BLOCK;
    let segs: Vec<u64> = (0..dram.div_ceil(SEGMENT))
        .map(|i| (dram - i * SEGMENT).min(SEGMENT))
        .collect();
    let mut c = CacheState::with_policy_seed(&segs, policy, Some(1));
    let key = NamespaceKey {
        fingerprint: Fingerprint(FP),
        shard: 0,
        salt: [0; 32],
    };
    let (ns, _) = c.register_namespace(key, BLOCK).map_err(|e| e.to_string())?;
    let s = c.open_session();
    let mut at_fill = HeapBytes::default();
    for i in 0..total {
        if i == filled {
            at_fill = c.heap_bytes();
        }
        let (id, _) = c.begin_save(s, ns, &chain(i)).map_err(|e| e.to_string())?;
        c.commit_save(s, id).map_err(|e| e.to_string())?;
    }
    if filled >= total {
        at_fill = c.heap_bytes();
    }
    Ok((at_fill, c.heap_bytes(), c.gauges().visible_blocks))
}

fn heap_json(h: &HeapBytes, resident: u64) -> serde_json::Value {
    let per = |b: u64| b as f64 / resident.max(1) as f64;
    serde_json::json!({
        "bytes": {
            "index": h.index, "policy_tracked": h.policy.tracked, "policy_ghost": h.policy.ghost,
            "policy_shadows": h.policy.shadows, "arena_allocator": h.arena, "leases": h.leases,
            "other": h.other, "total": h.total(),
        },
        "per_block": {
            "index": per(h.index), "policy_tracked": per(h.policy.tracked), "policy_ghost": per(h.policy.ghost),
            "policy_shadows": per(h.policy.shadows), "arena_allocator": per(h.arena), "leases": per(h.leases),
            "other": per(h.other), "total": per(h.total()),
        },
    })
}

fn one(o: &Opts, blocks: u64) -> Res<serde_json::Value> {
    let cap_chains = blocks / CHAIN as u64;
    let total_chains = ((blocks as f64 * o.overfill) as u64)
        .div_ceil(CHAIN as u64)
        .max(cap_chains);
    let m = ManagerProc::start(&o.manager, blocks, o.policy)?;
    let ctl = m.client()?;
    let ns = namespace(&ctl)?;
    let (anon0, shm0) = rss(m.pid())?;

    let t0 = Instant::now();
    let stored_fill = fill(&m, 0, cap_chains, o.fill_threads)?;
    let fill_s = t0.elapsed().as_secs_f64();
    let stats = serde_json::from_str::<serde_json::Value>(&ctl.stats_json().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let resident_fill = find_num(&stats, "visible_blocks").unwrap_or(stored_fill);
    let (anon1, _) = rss(m.pid())?;

    let t1 = Instant::now();
    fill(&m, cap_chains, total_chains, o.fill_threads)?;
    let overfill_s = t1.elapsed().as_secs_f64();
    let stats = serde_json::from_str::<serde_json::Value>(&ctl.stats_json().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let resident = find_num(&stats, "visible_blocks").unwrap_or(0);
    let presence_slots = find_num(&stats, "presence_slots").unwrap_or(0);
    let (anon2, shm2) = rss(m.pid())?;

    // Chains saved last are resident (nothing was hit: eviction is FIFO-like).
    let from = total_chains
        .saturating_sub(cap_chains * 8 / 10)
        .max(total_chains.saturating_sub(cap_chains));
    let chains = Arc::new(resident_chains(&ctl, &ns, from, total_chains, 4096)?);
    if chains.is_empty() {
        return Err("no fully resident chain found".into());
    }
    let mut lat = Vec::new();
    for &n in &o.clients {
        lat.push(latency(&m, &chains, n, o.seconds)?);
    }
    let (anon3, _) = rss(m.pid())?;
    let _ = ctl.close();
    drop(m);

    let per = |a: u64, b: u64, n: u64| (b.saturating_sub(a)) as f64 / n.max(1) as f64;
    let model = if o.model {
        let (f, s, vis) = model(blocks, o.policy, cap_chains, total_chains)?;
        Some(serde_json::json!({
            "resident_blocks": vis,
            "filled": heap_json(&f, resident_fill),
            "steady": heap_json(&s, vis),
        }))
    } else {
        None
    };
    Ok(serde_json::json!({
        "blocks": blocks,
        "arena_bytes": blocks * BLOCK,
        "chains_saved": total_chains,
        "fill_seconds": fill_s,
        "overfill_seconds": overfill_s,
        "manager": {
            "rss_anon_start": anon0,
            "rss_anon_filled": anon1,
            "rss_anon_steady": anon2,
            "rss_anon_after_lookups": anon3,
            "rss_shmem_start": shm0,
            "rss_shmem_steady": shm2,
            "resident_filled": resident_fill,
            "resident_steady": resident,
            "anon_per_block_filled": per(anon0, anon1, resident_fill),
            "anon_per_block_steady": per(anon0, anon2, resident),
            "anon_per_block_after_lookups": per(anon0, anon3, resident),
        },
        "presence": {
            "slots": presence_slots,
            "shared_bytes": presence_slots * 8,
            "shared_per_block": (presence_slots * 8) as f64 / resident.max(1) as f64,
        },
        "model": model,
        "latency": lat.iter().map(|l| serde_json::json!({
            "clients": l.clients, "ops_per_s": l.ops_per_s,
            "p50_us": l.p50_us, "p99_us": l.p99_us, "p999_us": l.p999_us,
        })).collect::<Vec<_>>(),
        "lookup_chains": chains.len(),
    }))
}

fn main() -> Res<()> {
    let o = parse_args()?;
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for &b in &o.blocks {
        eprintln!("index_scale: {b} blocks ...");
        let row = one(&o, b)?;
        let mg = &row["manager"];
        let md = &row["model"]["steady"]["per_block"];
        println!(
            "blocks {:>9}: resident {:>9}  RssAnon/block filled {:>6.1} B steady {:>6.1} B  model steady {:>6.1} B \
             (index {:.1}, policy {:.1}+ghost {:.1}+shadows {:.1}, arena {:.2}, leases {:.2})  presence {:.1} B shm",
            b,
            mg["resident_steady"],
            mg["anon_per_block_filled"].as_f64().unwrap_or(0.0),
            mg["anon_per_block_steady"].as_f64().unwrap_or(0.0),
            md["total"].as_f64().unwrap_or(f64::NAN),
            md["index"].as_f64().unwrap_or(f64::NAN),
            md["policy_tracked"].as_f64().unwrap_or(f64::NAN),
            md["policy_ghost"].as_f64().unwrap_or(f64::NAN),
            md["policy_shadows"].as_f64().unwrap_or(f64::NAN),
            md["arena_allocator"].as_f64().unwrap_or(f64::NAN),
            md["leases"].as_f64().unwrap_or(f64::NAN),
            row["presence"]["shared_per_block"].as_f64().unwrap_or(0.0),
        );
        rows.push(row);
    }
    // Baseline: the first block count's p99 at the same client count.
    let base: Vec<(u64, f64)> = rows[0]["latency"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| Some((l["clients"].as_u64()?, l["p99_us"].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    println!(
        "{:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>12}",
        "blocks", "clients", "ops/s", "p50 us", "p99 us", "p999 us", "p99/base"
    );
    for row in rows.iter_mut() {
        let blocks = row["blocks"].as_u64().unwrap_or(0);
        if let Some(lat) = row["latency"].as_array_mut() {
            for l in lat.iter_mut() {
                let c = l["clients"].as_u64().unwrap_or(0);
                let p99 = l["p99_us"].as_f64().unwrap_or(0.0);
                let ratio = base.iter().find(|b| b.0 == c).map(|b| p99 / b.1);
                l["p99_vs_baseline"] = serde_json::json!(ratio);
                println!(
                    "{:>9} {:>7} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>12.2}",
                    blocks,
                    c,
                    l["ops_per_s"].as_f64().unwrap_or(0.0),
                    l["p50_us"].as_f64().unwrap_or(0.0),
                    p99,
                    l["p999_us"].as_f64().unwrap_or(0.0),
                    ratio.unwrap_or(f64::NAN),
                );
            }
        }
    }
    let doc = serde_json::json!({
        "bench": "index_scale",
        "what": "Manager metadata and lookup latency vs resident 4 KiB blocks; a real orbitkv-manager process per block count, filled by begin_save+commit_save of 32-block chains (no byte copies)",
        "memory": "RssAnon of the Manager (arena and presence table are shared memory, excluded) before fill, when the arena is full (filled) and after overfill x capacity saved (steady: ghost histories and shadows full); per resident block",
        "model": "the same saves into an in-process CacheState; heap_bytes() estimates per structure (allocated capacity x entry size)",
        "latency": "lookup + release of a resident 32-block chain (random among up to 4096), each client thread its own connection; p50/p99/p999 in microseconds",
        "baseline": "the first block count's p99 at the same client count (p99_vs_baseline)",
        "budget": {"bytes_per_block": 200, "p99_ratio_at_8_clients": 1.25},
        "policy": o.policy.name(),
        "overfill": o.overfill,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "seconds_per_point": o.seconds,
        "rows": rows,
    });
    json_out::write_json(&o.out, &doc)
}
