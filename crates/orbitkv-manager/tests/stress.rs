//! Randomised multi-client stress against one real Manager process with a
//! tiny DRAM arena and a tiny SSD tier, so eviction, demotion, staging, SSD-full
//! drops and concurrent staging all happen constantly. Every restored block is
//! checked against bytes derived from its hash: wrong bytes fail the test.
//! Bounded: a fixed number of operations per client.

mod support;

use std::sync::Arc;
use std::time::Duration;

use orbitkv_client::{Client, ClientError};
use orbitkv_proto::ErrorCode;
use support::*;

const BB: usize = 16 * 1024;
const CHAINS: u8 = 48;
const DEPTH: u8 = 8;
const OPS: usize = 600;

fn content(h: &[u8; 32]) -> Vec<u8> {
    h.iter()
        .cycle()
        .take(BB)
        .enumerate()
        .map(|(i, b)| b ^ (i as u8))
        .collect()
}

/// A tiny deterministic generator (no extra dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn run_client(sock: std::path::PathBuf, seed: u64) -> (usize, usize) {
    let c = Client::connect(&sock, None, Duration::from_secs(10)).expect("connect");
    let ns = c
        .register_namespace([0x5a; 32], BB as u64, 0, [0; 32])
        .expect("ns");
    let mut rng = Rng(seed);
    let (mut restored, mut failed) = (0, 0);
    for _ in 0..OPS {
        let chain = rng.below(u64::from(CHAINS)) as u8;
        let len = 1 + rng.below(u64::from(DEPTH)) as usize;
        let hashes: Vec<[u8; 32]> = (0..len as u8).map(|i| hash(chain, i)).collect();
        match rng.below(3) {
            0 => {
                let data: Vec<Vec<u8>> = hashes.iter().map(content).collect();
                let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
                c.save(&ns, &hashes, &src)
                    .expect("save is best effort, never an error");
            }
            1 => {
                let mut out = vec![vec![0u8; BB]; len];
                let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
                match c.restore(&ns, &hashes, &mut dst) {
                    Ok(n) => {
                        for i in 0..n as usize {
                            assert_eq!(
                                out[i],
                                content(&hashes[i]),
                                "wrong bytes for chain {chain} block {i}"
                            );
                        }
                        restored += n as usize;
                    }
                    // Staging can find no unpinned DRAM while other clients hold leases.
                    Err(ClientError::Server {
                        code: ErrorCode::RestoreFailed,
                        message,
                    }) => {
                        assert!(message.contains("no DRAM space to stage"), "{message}");
                        failed += 1;
                    }
                    Err(e) => panic!("restore: {e}"),
                }
            }
            _ => {
                // A lookup whose lease the engine does not select.
                let hit = c.lookup(&ns, &hashes).expect("lookup");
                if hit.lease != 0 {
                    c.release(hit.lease).expect("release");
                }
            }
        }
    }
    c.close().expect("close");
    (restored, failed)
}

#[test]
fn many_clients_tiny_tiers_never_serve_wrong_bytes() {
    let dir = tempfile::tempdir().expect("tmp");
    let ssd = dir.path().join("ssd");
    let ssd_s = ssd.to_string_lossy().to_string();
    for policy in ["evict", "eager"] {
        let m = ManagerProc::start(&[
            "--dram-size",
            "1MiB",
            "--segment-size",
            "256KiB",
            "--ssd-dir",
            &ssd_s,
            "--ssd-capacity",
            "3MiB",
            "--ssd-write-policy",
            policy,
        ]);
        let sock = Arc::new(m.socket().to_path_buf());
        let handles: Vec<_> = (0..4u64)
            .map(|i| {
                let s = sock.as_ref().clone();
                std::thread::spawn(move || run_client(s, 0x9e37_79b9_7f4a_7c15 ^ (i + 1)))
            })
            .collect();
        let mut restored = 0;
        for h in handles {
            restored += h.join().expect("client thread").0;
        }
        assert!(restored > 0, "{policy}: some restores must have hit");
        let st = m.stats();
        assert_eq!(st["live_leases"], 0, "{policy}");
        assert_eq!(st["live_saves"], 0, "{policy}");
        assert_eq!(st["dram_pinned_blocks"], 0, "{policy}");
        assert_eq!(st["ssd_checksum_failures_total"], 0, "{policy}");
        assert_eq!(st["ssd_header_failures_total"], 0, "{policy}");
        assert_eq!(st["ssd_stage_failures_total"], 0, "{policy}");
        assert!(
            st["ssd_spilled_blocks_total"].as_u64().unwrap_or(0) > 0,
            "{policy}: SSD used"
        );
        println!("{policy}: {st}");
        drop(m);
        let _ = std::fs::remove_dir_all(&ssd);
    }
}
