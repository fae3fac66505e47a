//! Tensor-parallel query control against a real Manager process (contracts T1,
//! T2 on one host): one TP lookup per request from a control-only session, the
//! common prefix of every shard pinned under one TP lease, each rank's worker
//! redeeming its own shard's part with the token and copying it out, the lease
//! ending with the last rank, its owner's session or its deadline.

mod support;

use orbitkv_client::{Client, Namespace};
use orbitkv_proto::ErrorCode;
use support::*;

const BB: usize = 4096;
const FP: [u8; 32] = [0x5a; 32];

/// Rank `r`'s bytes for block `i` (distinct per shard: a wrong shard shows).
fn shard_block(r: u8, i: u8) -> Vec<u8> {
    block(r.wrapping_mul(64).wrapping_add(i), BB)
}

/// Worker sessions (one per rank) with shard `r` holding blocks `0..present[r]`.
fn ranks(m: &ManagerProc, present: &[u8]) -> Vec<(Client, Namespace)> {
    present
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            let c = m.client();
            let ns = c.register_namespace(FP, BB as u64, r as u32, b"").expect("ns");
            let hs: Vec<_> = (0..n).map(|i| hash(1, i)).collect();
            let bufs: Vec<Vec<u8>> = (0..n).map(|i| shard_block(r as u8, i)).collect();
            let src: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
            c.save(&ns, &hs, &src).expect("save");
            (c, ns)
        })
        .collect()
}

fn shard_nss(c: &Client, n: u32) -> Vec<Namespace> {
    (0..n)
        .map(|r| c.register_namespace(FP, BB as u64, r, b"").expect("ns"))
        .collect()
}

/// A Manager started with `args`, worker sessions as [`ranks`] makes them for
/// `present`, and the scheduler's control-only session with a namespace per shard.
fn group(args: &[&str], present: &[u8]) -> (ManagerProc, Vec<(Client, Namespace)>, Client, Vec<Namespace>) {
    let m = ManagerProc::start(args);
    let workers = ranks(&m, present);
    let sched = control(&m);
    let nss = shard_nss(&sched, present.len() as u32);
    (m, workers, sched, nss)
}

/// The token of a TP lookup of `hs` that must hit.
fn hit_token(sched: &Client, nss: &[Namespace], hs: &[[u8; 32]]) -> [u8; 16] {
    sched.lookup_tp(nss, hs).expect("lookup").token.expect("hit")
}

#[test]
fn query_control_is_refused_unless_the_manager_enables_it() {
    let m = ManagerProc::start(&[]);
    let c = control(&m);
    let nss = shard_nss(&c, 2);
    let e = c.lookup_tp(&nss, &[hash(1, 0)]).expect_err("off by default");
    assert_eq!(server_code(&e), Some(ErrorCode::InvalidArgument));
    assert!(e.to_string().contains("--enable-query-control"), "{e}");
}

#[test]
fn every_rank_restores_its_own_shard_from_one_lookup() {
    for tp in [2u8, 4] {
        let present: Vec<u8> = (0..tp).map(|r| if r == 1 { 3 } else { 5 }).collect();
        let (m, workers, sched, nss) = group(&["--enable-query-control"], &present);
        let hs: Vec<_> = (0..5).map(|i| hash(1, i)).collect();
        let hit = sched.lookup_tp(&nss, &hs).expect("lookup_tp");
        assert_eq!(
            hit.hit_blocks, 3,
            "rank 1 lacks blocks 3..5: the common prefix is 3"
        );
        let token = hit.token.expect("token");
        let st = m.stats();
        assert_eq!(st["live_tp_leases"], 1);
        assert_eq!(st["live_leases"], u64::from(tp), "one part per shard");
        assert_eq!(st["lookups_total"], 0, "no per-rank lookup");
        for (r, (c, ns)) in workers.iter().enumerate() {
            let lease = c.redeem_tp(token, ns).expect("redeem");
            assert_eq!(lease.hit_blocks, 3);
            let slots = c.acquire(lease.lease).expect("acquire");
            let mut out = vec![vec![0u8; BB]; 3];
            let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
            c.copy_out(&slots, BB as u64, 0, &mut dst).expect("copy");
            for (i, got) in out.iter().enumerate() {
                assert_eq!(got, &shard_block(r as u8, i as u8), "tp {tp} rank {r} block {i}");
            }
            // A second redeem of the same part is refused; the first stands.
            let e = c.redeem_tp(token, ns).expect_err("once per shard");
            assert_eq!(server_code(&e), Some(ErrorCode::InvalidArgument), "{e}");
            c.release(lease.lease).expect("release");
            let e = c.release(lease.lease).expect_err("a duplicate report");
            assert_eq!(server_code(&e), Some(ErrorCode::NotFound), "{e}");
        }
        let st = m.stats();
        assert_eq!(st["live_tp_leases"], 0, "every rank reported: the TP lease ended");
        assert_eq!(st["live_leases"], 0);
        assert_eq!(st["dram_pinned_blocks"], 0);
        assert_eq!(st["tp_leases_completed_total"], 1);
        assert_eq!(st["tp_parts_redeemed_total"], u64::from(tp));
        assert_eq!(st["lookups_total"], 0, "no rank looked up again");
        // The owner's release after completion: nothing left to end.
        assert!(!sched.release_tp(token).expect("already ended"));
    }
}

#[test]
fn a_rank_missing_the_first_block_makes_a_miss_for_every_rank() {
    let (m, _workers, sched, nss) = group(&["--enable-query-control"], &[4, 0]);
    let hit = sched.lookup_tp(&nss, &[hash(1, 0), hash(1, 1)]).expect("lookup");
    assert_eq!((hit.hit_blocks, hit.token), (0, None));
    assert_eq!(m.stats()["live_leases"], 0, "nothing pinned");
}

#[test]
fn the_token_is_bound_to_its_shards_and_redeemed_only_by_arena_sessions() {
    let (m, workers, sched, nss) = group(&["--enable-query-control"], &[2, 2]);
    let token = hit_token(&sched, &nss, &[hash(1, 0)]);
    // Another fingerprint's namespace is not a shard of this lease.
    let other = workers[0]
        .0
        .register_namespace([9; 32], BB as u64, 0, b"")
        .expect("ns");
    let e = workers[0]
        .0
        .redeem_tp(token, &other)
        .expect_err("foreign namespace");
    assert_eq!(server_code(&e), Some(ErrorCode::InvalidArgument), "{e}");
    // A guessed token names nothing.
    let mut guess = token;
    guess[0] ^= 1;
    let e = workers[0].0.redeem_tp(guess, &workers[0].1).expect_err("forged");
    assert_eq!(server_code(&e), Some(ErrorCode::NotFound), "{e}");
    // A control-only session cannot take a part (it could never copy it).
    let e = sched.redeem_tp(token, &nss[0]).expect_err("control-only");
    assert!(e.to_string().contains("control-only"), "{e}");
    // Only the owner ends the TP lease.
    let e = workers[0].0.release_tp(token).expect_err("not the owner");
    assert_eq!(server_code(&e), Some(ErrorCode::NotOwner), "{e}");
    assert!(sched.release_tp(token).expect("owner release"));
    assert_eq!(m.stats()["live_leases"], 0);
    assert_eq!(m.stats()["tp_leases_released_total"], 1);
}

#[test]
fn the_owner_vanishing_releases_unredeemed_parts_and_redeemed_ones_stay_with_their_rank() {
    let (m, workers, sched, nss) = group(&["--enable-query-control"], &[2, 2]);
    let token = hit_token(&sched, &nss, &[hash(1, 0), hash(1, 1)]);
    let (c0, ns0) = &workers[0];
    let lease = c0.redeem_tp(token, ns0).expect("redeem");
    c0.acquire(lease.lease).expect("acquire");
    sched.abandon(); // the scheduler's connection drops without Close
    eventually("the owner's unredeemed part released", || {
        let st = m.stats();
        st["live_tp_leases"] == 0 && st["live_leases"] == 1 && st["dram_pinned_blocks"] == 2
    });
    // Rank 1 comes too late: its part is gone, a miss, never a wrong read.
    let e = workers[1].0.redeem_tp(token, &workers[1].1).expect_err("ended");
    assert_eq!(server_code(&e), Some(ErrorCode::NotFound));
    // Rank 0's copy is still valid until it reports.
    let slots = c0.acquire(lease.lease).expect("still acquired");
    let mut out = vec![vec![0u8; BB]; 2];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    c0.copy_out(&slots, BB as u64, 0, &mut dst).expect("copy");
    assert_eq!(out[1], shard_block(0, 1));
    c0.release(lease.lease).expect("release");
    assert_eq!(m.stats()["live_leases"], 0);
}

#[test]
fn a_part_never_redeemed_expires() {
    let (m, workers, sched, nss) = group(&["--enable-query-control", "--tp-lease-ttl-ms", "300"], &[2, 2]);
    let token = hit_token(&sched, &nss, &[hash(1, 0)]);
    let lease = workers[0].0.redeem_tp(token, &workers[0].1).expect("redeem");
    workers[0].0.release(lease.lease).expect("release");
    // Rank 1 died before loading: its part is released by the deadline.
    eventually("expiry", || {
        let st = m.stats();
        st["tp_leases_expired_total"] == 1 && st["live_leases"] == 0 && st["live_tp_leases"] == 0
    });
    assert!(!sched.release_tp(token).expect("expired: nothing left to end"));
}
