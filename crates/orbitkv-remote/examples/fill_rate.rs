//! How fast the store's reads are against a running cluster, by read shape: one `get`
//! at a time, and `get_many` in pipelines of N blocks; every value verified. Rounds
//! alternate the shapes so a noisy machine spreads over all of them.
//!
//!   scripts/redis-cluster.sh start /tmp/rc 21400
//!   cargo run --release -p orbitkv-remote --example fill_rate -- /tmp/rc 21400 4194304 16 5
//!       (cluster directory, base port, block bytes, blocks, rounds)
//!
//! It reads from a spawned thread, as the Manager's sessions do (glibc gives such threads
//! heaps of their own); `DEADLINE_MS` sets the store's deadline (default 2000). Run it
//! under `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=134217728`
//! to read with the settings the Manager applies (`crates/orbitkv-manager/src/malloc.rs`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use orbitkv_remote::store::{RemoteConfig, RemoteStore};
use orbitkv_ssd::SsdKey;

fn main() {
    // The Manager fills from session threads (not the main thread): so does this.
    let t = std::thread::spawn(run);
    if t.join().is_err() {
        std::process::exit(1);
    }
}

fn run() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [dir, port, bytes, blocks, rounds] = &a[..] else {
        eprintln!("fill_rate DIR BASE_PORT BLOCK_BYTES BLOCKS ROUNDS");
        std::process::exit(2);
    };
    let num = |s: &str| s.parse::<u64>().unwrap_or_else(|e| panic!("{s}: {e}"));
    let (base, bytes, blocks, rounds) = (num(port), num(bytes), num(blocks) as usize, num(rounds));
    let cfg = RemoteConfig {
        nodes: (0..6).map(|i| format!("127.0.0.1:{}", base + i)).collect(),
        username: "orbitkv".into(),
        password_file: PathBuf::from(dir).join("password"),
        tls: None,
        key_prefix: "okv:rate:".into(),
        deadline: Duration::from_millis(
            std::env::var("DEADLINE_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2000),
        ),
        breaker_failures: 3,
        breaker_cooldown: Duration::from_millis(300),
    };
    let store = RemoteStore::open(&cfg).expect("store");
    let keys: Vec<SsdKey> = (0..blocks as u32)
        .map(|i| {
            let mut hash = [0u8; 32];
            hash[..4].copy_from_slice(&i.to_le_bytes());
            SsdKey {
                fingerprint: [9; 32],
                shard: 0,
                salt: [0; 32],
                generation: 1,
                hash,
            }
        })
        .collect();
    let payload: Vec<u8> = (0..bytes).map(|j| (j * 31 + 7) as u8).collect();
    for k in &keys {
        assert!(store.put(k, &payload), "put");
    }
    let shapes: Vec<usize> = vec![1, 2, 8, 16];
    let mut best = vec![Vec::new(); shapes.len() + 1];
    for _ in 0..rounds {
        let t = Instant::now();
        for k in &keys {
            store.get(k, bytes).expect("hit");
        }
        best[0].push(t.elapsed().as_secs_f64());
        for (i, &n) in shapes.iter().enumerate() {
            let t = Instant::now();
            for group in keys.chunks(n) {
                for r in store.get_many(group, bytes) {
                    r.expect("hit");
                }
            }
            best[i + 1].push(t.elapsed().as_secs_f64());
        }
    }
    let total = (bytes * blocks as u64) as f64;
    let show = |name: String, s: &mut Vec<f64>| {
        s.sort_by(f64::total_cmp);
        println!(
            "{name:<16} median {:.2} GB/s  best {:.2} GB/s",
            total / s[s.len() / 2] / 1e9,
            total / s[0] / 1e9
        );
    };
    show("get".into(), &mut best[0]);
    for (i, &n) in shapes.iter().enumerate() {
        show(format!("get_many x{n}"), &mut best[i + 1]);
    }
}
