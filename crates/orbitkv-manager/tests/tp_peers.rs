//! Tensor parallelism across Managers (contract T1 across hosts, issue 12)
//! with real Manager processes on loopback: the scheduler's Manager answers one
//! TP lookup for ranks whose workers are clients of other Managers, fanning out
//! to them in parallel, returning the common prefix and pinning every selected
//! shard; remote ranks redeem their part at their own Manager with the token.

mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use orbitkv_client::{Client, Namespace};
use orbitkv_proto::ErrorCode;
use support::*;

const BB: usize = 4096;
const FP: [u8; 32] = [0x6b; 32];

/// A Manager with query control, serving peers on `port` (if any), with `extra` flags.
fn manager(port: Option<u16>, extra: &[String]) -> ManagerProc {
    let mut args: Vec<String> = vec!["--enable-query-control".into()];
    if let Some(p) = port {
        args.push("--peer-listen".into());
        args.push(format!("127.0.0.1:{p}"));
    }
    args.extend(extra.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = ManagerProc::start(&refs);
    if let Some(p) = port {
        eventually(&format!("peer listener on {p}"), || {
            TcpStream::connect(("127.0.0.1", p)).is_ok()
        });
    }
    m
}

/// `--tp-shard-peer SHARD=127.0.0.1:PORT` for each pair.
fn placement(shards: &[(u32, u16)]) -> Vec<String> {
    shards
        .iter()
        .flat_map(|(s, p)| ["--tp-shard-peer".to_string(), format!("{s}=127.0.0.1:{p}")])
        .collect()
}

/// Rank `r`'s bytes for block `i` (distinct per shard: a wrong shard shows).
fn shard_block(r: u32, i: u8) -> Vec<u8> {
    block((r as u8).wrapping_mul(64).wrapping_add(i), BB)
}

/// The worker of rank `r`, a client of `m`, its shard holding blocks `0..n`.
fn rank(m: &ManagerProc, r: u32, n: u8) -> (Client, Namespace) {
    let c = m.client();
    let ns = c.register_namespace(FP, BB as u64, r, b"").expect("ns");
    let hs: Vec<_> = (0..n).map(|i| hash(1, i)).collect();
    let bufs: Vec<Vec<u8>> = (0..n).map(|i| shard_block(r, i)).collect();
    let src: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
    c.save(&ns, &hs, &src).expect("save");
    (c, ns)
}

/// The scheduler: a control-only session of `m` naming shards `0..tp`.
fn scheduler(m: &ManagerProc, tp: u32) -> (Client, Vec<Namespace>) {
    let c = control(m);
    let nss = (0..tp)
        .map(|r| c.register_namespace(FP, BB as u64, r, b"").expect("ns"))
        .collect();
    (c, nss)
}

fn hashes(n: u8) -> Vec<[u8; 32]> {
    (0..n).map(|i| hash(1, i)).collect()
}

fn stat(m: &ManagerProc, field: &str) -> u64 {
    m.stats()[field].as_u64().expect("u64 stat")
}

fn tp_stat(m: &ManagerProc, field: &str) -> u64 {
    m.stats()["peers"]["tp"][field].as_u64().expect("u64 tp stat")
}

/// Redeem, copy out and check `hit` blocks of rank `r`'s part; then report done
/// (twice: the duplicate counts nothing).
fn restore_part(w: &(Client, Namespace), r: u32, token: [u8; 16], hit: u32) {
    let (c, ns) = w;
    let lease = c.redeem_tp(token, ns).expect("redeem");
    assert_eq!(lease.hit_blocks, hit, "rank {r}'s part is the common prefix");
    let slots = c.acquire(lease.lease).expect("acquire");
    let mut out = vec![vec![0u8; BB]; hit as usize];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    c.copy_out(&slots, BB as u64, 0, &mut dst).expect("copy");
    for (i, got) in out.iter().enumerate() {
        assert_eq!(got, &shard_block(r, i as u8), "rank {r} block {i}");
    }
    c.release(lease.lease).expect("done");
    let e = c.release(lease.lease).expect_err("a duplicate report");
    assert_eq!(server_code(&e), Some(ErrorCode::NotFound), "{e}");
}

#[test]
fn tp2_on_two_managers_returns_the_common_prefix_both_directions() {
    // (blocks of rank 0 on A, blocks of rank 1 on B, common prefix)
    for (na, nb, common) in [(5u8, 3u8, 3u32), (2, 5, 2)] {
        let pb = free_port();
        let b = manager(Some(pb), &[]);
        let a = manager(None, &placement(&[(1, pb)]));
        let w0 = rank(&a, 0, na);
        let w1 = rank(&b, 1, nb);
        let (sched, nss) = scheduler(&a, 2);
        let hit = sched.lookup_tp(&nss, &hashes(6)).expect("lookup_tp");
        assert_eq!(hit.hit_blocks, common, "A holds {na}, B holds {nb}");
        let token = hit.token.expect("token");
        // Every selected shard is pinned, each to the common prefix only.
        for (m, who) in [(&a, "A"), (&b, "B")] {
            assert_eq!(stat(m, "live_tp_leases"), 1, "{who}");
            assert_eq!(stat(m, "dram_pinned_blocks"), u64::from(common), "{who}");
            assert_eq!(stat(m, "lookups_total"), 0, "{who}: no per-rank lookup");
        }
        assert_eq!(tp_stat(&a, "pins"), 1);
        assert_eq!(tp_stat(&b, "served_pins"), 1);
        restore_part(&w0, 0, token, common);
        restore_part(&w1, 1, token, common);
        for (m, who) in [(&a, "A"), (&b, "B")] {
            assert_eq!(stat(m, "live_tp_leases"), 0, "{who}: its rank reported");
            assert_eq!(stat(m, "live_leases"), 0, "{who}");
            assert_eq!(stat(m, "dram_pinned_blocks"), 0, "{who}");
            assert_eq!(stat(m, "tp_leases_completed_total"), 1, "{who}: counted once");
            assert_eq!(stat(m, "tp_parts_redeemed_total"), 1, "{who}");
        }
        // The scheduler's release after completion finds nothing left to pin.
        sched.release_tp(token).expect("release after completion");
        assert_eq!(tp_stat(&a, "remote_leases"), 0);
        assert_eq!(stat(&b, "dram_pinned_blocks"), 0);
    }
}

#[test]
fn tp4_over_three_managers_pins_every_shard_at_its_holder() {
    let (pb, pc) = (free_port(), free_port());
    let b = manager(Some(pb), &[]);
    let c = manager(Some(pc), &[]);
    let a = manager(None, &placement(&[(1, pb), (3, pb), (2, pc)]));
    let workers = [
        (0, rank(&a, 0, 5)),
        (1, rank(&b, 1, 4)),
        (2, rank(&c, 2, 3)),
        (3, rank(&b, 3, 5)),
    ];
    let (sched, nss) = scheduler(&a, 4);
    let hit = sched.lookup_tp(&nss, &hashes(5)).expect("lookup_tp");
    assert_eq!(hit.hit_blocks, 3, "rank 2 on C holds 3");
    let token = hit.token.expect("token");
    assert_eq!(stat(&b, "dram_pinned_blocks"), 6, "B pins its two shards");
    assert_eq!(stat(&c, "dram_pinned_blocks"), 3);
    assert_eq!(tp_stat(&a, "pins"), 2, "one query per holder, not per shard");
    for (r, w) in &workers {
        restore_part(w, *r, token, 3);
    }
    assert_eq!(tp_stat(&a, "remote_leases"), 1, "until the scheduler ends it");
    sched.release_tp(token).expect("release");
    assert_eq!(tp_stat(&a, "remote_leases"), 0);
    eventually("the release forwarded to B and C", || {
        tp_stat(&a, "releases") == 2
    });
    for m in [&a, &b, &c] {
        assert_eq!(stat(m, "dram_pinned_blocks"), 0);
        assert_eq!(stat(m, "live_tp_leases"), 0);
    }
    // Chain 2's first block is on every shard but rank 2's (on C): a miss for
    // every rank, and what B pinned meanwhile is released before the answer.
    let d = block(200, BB);
    for (r, (w, ns)) in &workers {
        if *r != 2 {
            w.save(ns, &[hash(2, 0)], &[d.as_slice()]).expect("save");
        }
    }
    let releases = tp_stat(&a, "releases");
    let hit = sched.lookup_tp(&nss, &[hash(2, 0)]).expect("lookup");
    assert_eq!((hit.hit_blocks, hit.token), (0, None));
    for m in [&a, &b, &c] {
        assert_eq!(stat(m, "dram_pinned_blocks"), 0);
        assert_eq!(stat(m, "live_tp_leases"), 0);
    }
    assert_eq!(tp_stat(&a, "releases"), releases + 1, "B's part ended");
    assert_eq!(tp_stat(&a, "remote_leases"), 0);
}

#[derive(Debug, Clone, Copy)]
enum End {
    OwnerRelease,
    OwnerVanishes,
    Deadline,
    SchedulersManagerKilled,
}

#[test]
fn a_remote_rank_that_never_reports_keeps_its_part_pinned_until_the_lease_ends() {
    for end in [
        End::OwnerRelease,
        End::OwnerVanishes,
        End::Deadline,
        End::SchedulersManagerKilled,
    ] {
        let ttl = if matches!(end, End::Deadline) {
            "1500"
        } else {
            "60000"
        };
        let pb = free_port();
        let b = manager(Some(pb), &[]);
        let mut extra = placement(&[(1, pb)]);
        extra.extend(["--tp-lease-ttl-ms".to_string(), ttl.to_string()]);
        let mut a = manager(None, &extra);
        let w0 = rank(&a, 0, 2);
        let w1 = rank(&b, 1, 2);
        let w1_late = {
            let c = b.client();
            let ns = c.register_namespace(FP, BB as u64, 1, b"").expect("ns");
            (c, ns)
        };
        let (sched, nss) = scheduler(&a, 2);
        let token = sched
            .lookup_tp(&nss, &hashes(2))
            .expect("lookup")
            .token
            .expect("hit");
        restore_part(&w0, 0, token, 2);
        // Rank 1 never comes: B keeps its part pinned (the link idles meanwhile).
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(stat(&b, "dram_pinned_blocks"), 2, "{end:?}: still pinned on B");
        assert_eq!(stat(&b, "live_tp_leases"), 1, "{end:?}");
        match end {
            End::OwnerRelease => {
                // Rank 1's worker on B took its part before the release: it stays.
                let lease = w1.0.redeem_tp(token, &w1.1).expect("redeem");
                w1.0.acquire(lease.lease).expect("acquire");
                assert!(sched.release_tp(token).expect("owner release"));
                std::thread::sleep(Duration::from_millis(200));
                assert_eq!(stat(&b, "dram_pinned_blocks"), 2, "redeemed: the worker's now");
                w1.0.release(lease.lease).expect("done");
            }
            End::OwnerVanishes => sched.abandon(),
            End::Deadline => {}
            End::SchedulersManagerKilled => {
                let _ = a.child.kill();
                let _ = a.child.wait();
            }
        }
        eventually(&format!("{end:?}: B's part released"), || {
            stat(&b, "dram_pinned_blocks") == 0 && stat(&b, "live_tp_leases") == 0
        });
        assert_eq!(stat(&b, "live_leases"), 0, "{end:?}");
        if matches!(end, End::Deadline) {
            assert_eq!(stat(&b, "tp_leases_expired_total"), 1);
        }
        if !matches!(end, End::OwnerRelease) {
            // Too late: a miss for rank 1, never a wrong read.
            let e = w1_late.0.redeem_tp(token, &w1_late.1).expect_err("ended");
            assert_eq!(server_code(&e), Some(ErrorCode::NotFound), "{end:?}: {e}");
        }
        if !matches!(end, End::SchedulersManagerKilled) {
            eventually(&format!("{end:?}: A forgot it"), || {
                tp_stat(&a, "remote_leases") == 0
            });
        }
    }
}

#[test]
fn a_holder_down_silent_garbled_or_without_query_control_is_a_miss_in_bounded_time() {
    let no_qc_port = free_port();
    let no_qc = ManagerProc::start(&["--peer-listen", &format!("127.0.0.1:{no_qc_port}")]);
    eventually("no-qc listener", || {
        TcpStream::connect(("127.0.0.1", no_qc_port)).is_ok()
    });
    let _no_qc_rank = {
        let c = no_qc.client();
        let ns = c.register_namespace(FP, BB as u64, 1, b"").expect("ns");
        let d = shard_block(1, 0);
        c.save(&ns, &[hash(1, 0)], &[d.as_slice()]).expect("save");
        c
    };
    let cases = [
        ("down", free_port()),
        ("silent", fake_peer(None)),
        (
            "garbage",
            fake_peer(Some(
                b"HTTP/1.1 418 not a Manager\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxx",
            )),
        ),
        ("query control off", no_qc_port),
    ];
    for (what, port) in cases {
        let mut extra = placement(&[(1, port)]);
        extra.extend(["--peer-timeout-ms".to_string(), "500".to_string()]);
        let a = manager(None, &extra);
        let _w0 = rank(&a, 0, 3);
        let (sched, nss) = scheduler(&a, 2);
        for round in 0..2 {
            let t0 = Instant::now();
            let hit = sched
                .lookup_tp(&nss, &hashes(3))
                .expect("an answer, not an error");
            let took = t0.elapsed();
            assert_eq!(
                (hit.hit_blocks, hit.token),
                (0, None),
                "{what}: a miss, never a hit"
            );
            // Bound: a connect and one frame each way, each within the peer timeout,
            // at most once retried on a broken link.
            assert!(took < Duration::from_secs(3), "{what} round {round}: {took:?}");
            assert_eq!(stat(&a, "dram_pinned_blocks"), 0, "{what}: nothing pinned on A");
            assert_eq!(stat(&a, "live_leases"), 0, "{what}");
            assert_eq!(stat(&a, "live_tp_leases"), 0, "{what}");
        }
        assert!(tp_stat(&a, "errors") >= 2, "{what}: counted");
        let st = a.stats();
        assert!(
            st["peers"]["peers"].as_array().is_some(),
            "{what}: status lists peers"
        );
    }
    assert_eq!(
        stat(&no_qc, "dram_pinned_blocks"),
        0,
        "the refusing holder pinned nothing"
    );
    assert_eq!(stat(&no_qc, "live_tp_leases"), 0);
}

#[test]
fn holders_are_queried_in_parallel_up_to_the_configured_bound() {
    // Two silent holders: each query costs the peer timeout (1.5 s).
    let (p1, p2) = (fake_peer(None), fake_peer(None));
    for (parallel, sequential) in [("2", false), ("1", true)] {
        let mut extra = placement(&[(1, p1), (2, p2)]);
        extra.extend([
            "--peer-timeout-ms".to_string(),
            "1500".to_string(),
            "--tp-peer-parallel".to_string(),
            parallel.to_string(),
        ]);
        let a = manager(None, &extra);
        let _w0 = rank(&a, 0, 2);
        let (sched, nss) = scheduler(&a, 3);
        let t0 = Instant::now();
        let hit = sched.lookup_tp(&nss, &hashes(2)).expect("lookup");
        let took = t0.elapsed();
        assert_eq!(hit.hit_blocks, 0);
        if sequential {
            assert!(took >= Duration::from_millis(3000), "one at a time: {took:?}");
        } else {
            assert!(took < Duration::from_millis(2900), "both at once: {took:?}");
        }
        assert_eq!(stat(&a, "dram_pinned_blocks"), 0);
    }
}

#[test]
fn an_idle_link_keeps_its_parts_and_a_link_closed_for_idleness_is_replaced() {
    // B closes peer connections idle for 300 ms (fault injection), except a
    // link whose TP leases are still live.
    let pb = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("b.sock");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .arg("--socket")
        .arg(&socket)
        .args(quiet_flags("8MiB"))
        .args(["--enable-query-control", "--enable-fault-injection"])
        .args(["--peer-listen", &format!("127.0.0.1:{pb}")])
        .env("ORBITKV_PEER_IDLE_MS", "300")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn B");
    let b = ManagerProc { child, socket, dir };
    eventually("B up", || {
        std::os::unix::net::UnixStream::connect(b.socket()).is_ok()
            && TcpStream::connect(("127.0.0.1", pb)).is_ok()
    });
    let a = manager(None, &placement(&[(1, pb)]));
    let w0 = rank(&a, 0, 2);
    let w1 = rank(&b, 1, 2);
    let (sched, nss) = scheduler(&a, 2);
    let conns = || b.stats()["peers"]["source"]["connections"].as_u64().expect("u64");
    let before = conns(); // the readiness probe's
    let token = sched
        .lookup_tp(&nss, &hashes(2))
        .expect("lookup")
        .token
        .expect("hit");
    // Several idle periods pass: the link stays, so does rank 1's part.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(stat(&b, "dram_pinned_blocks"), 2, "not released for idleness");
    restore_part(&w0, 0, token, 2);
    restore_part(&w1, 1, token, 2);
    sched.release_tp(token).expect("release");
    // Now the link has nothing to keep: B closes it when idle; the next lookup
    // reconnects and still answers a hit.
    std::thread::sleep(Duration::from_millis(1000));
    let hit = sched.lookup_tp(&nss, &hashes(2)).expect("lookup");
    assert_eq!(hit.hit_blocks, 2, "a fresh link after the idle close");
    sched.release_tp(hit.token.expect("token")).expect("release");
    eventually("B's part released", || stat(&b, "dram_pinned_blocks") == 0);
    assert_eq!(conns() - before, 2, "the idle link was closed and replaced once");
}

#[test]
fn tp_across_managers_over_mutual_tls_and_a_holder_with_a_foreign_certificate_is_a_miss() {
    let pki = pki::loopback_pki(&["a", "b"]);
    let d = pki.path();
    let (pb, px) = (free_port(), free_port());
    let b = manager(Some(pb), &pki::tls_flags(d, "b", "ca"));
    // A holder whose certificate chains to another CA.
    let x = manager(Some(px), &pki::tls_flags(d, "x", "other"));
    let mut extra = placement(&[(1, pb)]);
    extra.extend(pki::tls_flags(d, "a", "ca"));
    let a = manager(None, &extra);
    assert_eq!(a.stats()["peers"]["tls"], true);
    let w0 = rank(&a, 0, 4);
    let w1 = rank(&b, 1, 3);
    let (sched, nss) = scheduler(&a, 2);
    let hit = sched.lookup_tp(&nss, &hashes(4)).expect("lookup over mutual TLS");
    assert_eq!(hit.hit_blocks, 3);
    let token = hit.token.expect("token");
    restore_part(&w0, 0, token, 3);
    restore_part(&w1, 1, token, 3);
    sched.release_tp(token).expect("release");
    assert_eq!(stat(&b, "dram_pinned_blocks"), 0);
    // The same group with shard 1 placed on the foreign-CA holder: refused, a miss.
    let _x1 = rank(&x, 1, 3);
    let mut extra = placement(&[(1, px)]);
    extra.extend(pki::tls_flags(d, "a", "ca"));
    let a2 = manager(None, &extra);
    let _w0 = rank(&a2, 0, 4);
    let (sched2, nss2) = scheduler(&a2, 2);
    let hit = sched2.lookup_tp(&nss2, &hashes(4)).expect("an answer");
    assert_eq!((hit.hit_blocks, hit.token), (0, None));
    assert_eq!(stat(&a2, "dram_pinned_blocks"), 0);
    assert_eq!(
        stat(&x, "dram_pinned_blocks"),
        0,
        "nothing pinned for a refused peer"
    );
    assert!(x.stats()["peers"]["source"]["refused"].as_u64().expect("u64") >= 1);
}
