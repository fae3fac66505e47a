//! DRAM-path benchmark: save (allocate → copy → commit) and restore (lookup →
//! acquire → copy → release) GB/s through a real Manager, beside single-thread
//! memcpy of the same blocks measured in the same run.
//!
//! Usage: dram_path [OUT.json] [--total-mib N] [--trials N] [--hugepages off|2MiB|1GiB]
//! (`ORBITKV_COPY_THREADS=1` measures one copy thread.)
//! Bytes are counted once (bytes delivered), as for memcpy.

use std::hint::black_box;
use std::time::{Duration, Instant};

use orbitkv_client::Client;
use orbitkv_manager::{Manager, ManagerConfig};

#[path = "common/args.rs"]
mod args;
#[path = "common/json_out.rs"]
mod json_out;
#[path = "common/stats.rs"]
mod stats;
use args::Args;
use stats::{gbps, median};

fn hash(size_idx: u8, trial: u32, i: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0] = size_idx;
    h[1..5].copy_from_slice(&trial.to_le_bytes());
    h[5..9].copy_from_slice(&i.to_le_bytes());
    h
}

fn main() {
    let args = Args::from_env();
    let out = args.out("bench-results/dram_path.json");
    let total = args.usize("--total-mib", 256) << 20;
    let trials = args.usize("--trials", 9).max(1);
    let hugepages = args.value("--hugepages").unwrap_or("off").to_string();

    let dir = std::env::temp_dir().join(format!("orbitkv-bench-{}", std::process::id()));
    let sock = dir.join("m.sock");
    let arena = ((total * 3).max(64 << 20)).next_multiple_of(1 << 30);
    let cfg = ManagerConfig::from_argv([
        "bench".to_string(),
        "--socket".into(),
        sock.display().to_string(),
        "--dram-size".into(),
        arena.to_string(),
        "--segment-size".into(),
        "256MiB".into(),
        "--metrics-addr".into(),
        "off".into(),
        "--log-level".into(),
        "warn".into(),
        "--hugepages".into(),
        hugepages.clone(),
    ])
    .unwrap_or_else(|e| panic!("config: {e}"));
    let manager = Manager::start(cfg).unwrap_or_else(|e| panic!("manager: {e}"));
    let client =
        Client::connect(&sock, None, Duration::from_secs(30)).unwrap_or_else(|e| panic!("connect: {e}"));

    let sizes: [usize; 5] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
    let mut rows = Vec::new();
    println!(
        "{:>9} {:>7} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "block", "blocks", "memcpy", "save", "restore", "save/mc", "rest/mc"
    );
    for (si, &bs) in sizes.iter().enumerate() {
        let n = (total / bs).max(1);
        let src: Vec<Vec<u8>> = (0..n)
            .map(|i| (0..bs).map(|j| (i * 131 + j * 7) as u8).collect())
            .collect();
        let mut dst: Vec<Vec<u8>> = (0..n).map(|_| vec![1u8; bs]).collect();
        let ns = client
            .register_namespace([si as u8 + 1; 32], bs as u64, 0, [0; 32])
            .unwrap_or_else(|e| panic!("ns: {e}"));

        // Interleaved per trial, so drift on a shared machine hits all three alike:
        // baseline (single-thread memcpy of the same blocks), save, restore.
        let mut memcpy = Vec::new();
        let mut save = Vec::new();
        let mut restore = Vec::new();
        for t in 0..trials as u32 {
            let t0 = Instant::now();
            for (d, s) in dst.iter_mut().zip(&src) {
                d.copy_from_slice(s);
            }
            black_box(&dst);
            memcpy.push(gbps(n * bs, t0.elapsed()));

            let hashes: Vec<[u8; 32]> = (0..n as u32).map(|i| hash(si as u8, t, i)).collect();
            let srcs: Vec<&[u8]> = src.iter().map(|v| v.as_slice()).collect();
            let t0 = Instant::now();
            let r = client
                .save(&ns, &hashes, &srcs)
                .unwrap_or_else(|e| panic!("save: {e}"));
            save.push(gbps(r.bytes_copied as usize, t0.elapsed()));
            assert_eq!(r.stored as usize, n, "arena too small for the bench");

            for d in dst.iter_mut() {
                d.fill(0);
            }
            let mut dsts: Vec<&mut [u8]> = dst.iter_mut().map(|v| v.as_mut_slice()).collect();
            let t0 = Instant::now();
            let got = client
                .restore(&ns, &hashes, &mut dsts)
                .unwrap_or_else(|e| panic!("restore: {e}"));
            restore.push(gbps(got as usize * bs, t0.elapsed()));
            assert_eq!(got as usize, n);
            assert!(dst == src, "restored bytes differ");
        }
        let (m, s, r) = (median(memcpy), median(save), median(restore));
        println!(
            "{:>8}K {:>7} {:>10.2} {:>10.2} {:>10.2} {:>8.2} {:>8.2}",
            bs >> 10,
            n,
            m,
            s,
            r,
            s / m,
            r / m
        );
        rows.push(serde_json::json!({
            "block_bytes": bs, "blocks": n, "trials": trials,
            "memcpy_gbps": m, "save_gbps": s, "restore_gbps": r,
            "save_ratio": s / m, "restore_ratio": r / m,
        }));
    }
    drop(client);
    manager.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    let doc = serde_json::json!({
        "bench": "dram_path",
        "what": "save = begin_save + copy + commit; restore = lookup + acquire + copy + release; one client, one thread; median of interleaved trials; bytes counted once",
        "baseline": "single-thread memcpy (copy_from_slice) of the same blocks, same process, same run",
        "total_bytes_per_trial": total,
        "arena_pages": hugepages,
        "copy_threads": std::env::var("ORBITKV_COPY_THREADS").unwrap_or_else(|_| "default".into()),
        "results": rows,
    });
    json_out::write_json(&out, &doc).unwrap_or_else(|e| panic!("{e}"));
}
