//! Parallel peer asks on a local miss (issue 12): with several peers to ask,
//! a Manager probes them at once (at most `--peer-fill-parallel` in flight),
//! fetches from the longest hit and releases the other hits' source leases;
//! real Manager processes on loopback.

mod support;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use orbitkv_proto::peer::{BlockQuery, PeerRequest, PeerResponse, decode_peer_response};
use orbitkv_proto::{read_frame, write_frame};
use support::*;

const BB: usize = 16 << 10;
const FP: [u8; 32] = [0x3c; 32];

fn manager(port: Option<u16>, peers: &[u16], extra: &[&str]) -> ManagerProc {
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    if let Some(p) = port {
        args.extend(["--peer-listen".to_string(), format!("127.0.0.1:{p}")]);
    }
    for p in peers {
        args.extend(["--peer".to_string(), format!("127.0.0.1:{p}")]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = ManagerProc::start(&refs);
    if let Some(p) = port {
        eventually("peer listener", || TcpStream::connect(("127.0.0.1", p)).is_ok());
    }
    m
}

fn data(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| block(90 + i as u8, BB)).collect()
}

fn hashes(n: usize) -> Vec<[u8; 32]> {
    (0..n).map(|i| hash(5, i as u8)).collect()
}

fn save(m: &ManagerProc, d: &[Vec<u8>]) {
    let c = m.client();
    let ns = c.register_namespace(FP, BB as u64, 0, b"").expect("ns");
    let src: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
    c.save(&ns, &hashes(d.len()), &src).expect("save");
    c.close().expect("close");
}

fn restore(m: &ManagerProc, n: usize) -> (usize, Vec<Vec<u8>>) {
    restore_blocks(m, FP, BB, &hashes(n))
}

fn source(m: &ManagerProc, field: &str) -> u64 {
    m.stats()["peers"]["source"][field].as_u64().expect("u64")
}

#[test]
fn the_longest_hit_wins_and_the_other_hits_are_released() {
    let d = data(6);
    // Whatever the rendezvous order, the holder of all six blocks serves them.
    for short in [1usize, 3, 5] {
        let (pa, pc) = (free_port(), free_port());
        let a = manager(Some(pa), &[], &[]);
        let c = manager(Some(pc), &[], &[]);
        save(&a, &d[..short]);
        save(&c, &d);
        let b = manager(None, &[pa, pc], &[]);
        assert_eq!(restore(&b, 6), (6, d.clone()), "A holds {short}, C all 6");
        assert_eq!(source(&c, "blocks_sent"), 6);
        assert_eq!(source(&a, "blocks_sent"), 0, "the shorter hit sends nothing");
        assert_eq!((source(&a, "probes"), source(&a, "probes_released")), (1, 1));
        for m in [&a, &c] {
            eventually("every source lease ended", || {
                m.stats()["live_leases"] == 0 && source(m, "leases_open") == 0
            });
        }
        // One at a time (`--peer-fill-parallel 1`) still restores byte-exact.
        let b1 = manager(None, &[pa, pc], &["--peer-fill-parallel", "1"]);
        let (hit, got) = restore(&b1, 6);
        assert!(hit >= short, "{hit}");
        assert_eq!(got, d[..hit].to_vec());
    }
}

/// A large winner of a probe is fetched split over several connections
/// (`--peer-fill-streams`), its probed lease held until that fetch ends:
/// byte-exact, one range per connection, the probe and every range's source
/// lease ended; the shorter hit is released and sends nothing. A winner of
/// less than two ranges' worth sends on its probe's connection as before.
#[test]
fn a_large_probed_winner_is_fetched_over_several_connections() {
    const BIG: usize = 1 << 20;
    const N: usize = 36; // four ranges of 9 MiB
    let fp = [0x3d; 32];
    let big_hashes = |n: usize| -> Vec<[u8; 32]> { (0..n).map(|i| hash(6, i as u8)).collect() };
    let d: Vec<Vec<u8>> = (0..N).map(|i| block(40 + i as u8, BIG)).collect();
    let save_big = |m: &ManagerProc, n: usize| {
        let c = m.client();
        let ns = c.register_namespace(fp, BIG as u64, 0, b"").expect("ns");
        let src: Vec<&[u8]> = d[..n].iter().map(|v| v.as_slice()).collect();
        assert_eq!(
            c.save(&ns, &big_hashes(n), &src).expect("save").stored as usize,
            n
        );
        c.close().expect("close");
    };
    let arena = ["--dram-size", "96MiB"];
    let (pa, pc) = (free_port(), free_port());
    let a = manager(Some(pa), &[], &arena);
    let c = manager(Some(pc), &[], &arena);
    save_big(&a, N);
    save_big(&c, 5);
    let b = manager(
        None,
        &[pa, pc],
        &["--dram-size", "96MiB", "--peer-fill-streams", "4"],
    );
    let (hit, got) = restore_blocks(&b, fp, BIG, &big_hashes(N));
    assert_eq!(hit, N, "every block through the longest hit");
    assert!(got == d, "byte-exact");
    // One probe and four ranges asked of A; the probe released by Done.
    assert_eq!(source(&a, "probes"), 1);
    assert_eq!(source(&a, "fetches"), 5, "the probe and four ranges");
    assert_eq!(source(&a, "blocks_sent"), N as u64);
    eventually("A's probe lease released after the split fetch", || {
        source(&a, "probes_released") == 1
    });
    assert_eq!(source(&c, "blocks_sent"), 0, "the shorter hit sends nothing");
    assert_eq!(source(&c, "probes_released"), 1);
    for m in [&a, &c] {
        eventually("every source lease ended", || {
            m.stats()["live_leases"] == 0 && source(m, "leases_open") == 0
        });
    }
    // Eight blocks (8 MiB): one range's worth, sent on the probe's connection.
    let b = manager(
        None,
        &[pa, pc],
        &["--dram-size", "96MiB", "--peer-fill-streams", "4"],
    );
    let (hit, got) = restore_blocks(&b, fp, BIG, &big_hashes(8));
    assert_eq!(hit, 8);
    assert!(got[..] == d[..8], "byte-exact");
    assert_eq!(source(&a, "fetches"), 6, "one more probe, no split");
    assert_eq!(source(&a, "blocks_sent"), N as u64 + 8);
}

#[test]
fn a_dead_silent_or_garbled_peer_beside_a_good_one_costs_no_hit() {
    // 768 KiB: more than a socket buffer holds while a slow answer is awaited.
    let d = data(48);
    for (what, bad) in [
        ("down", free_port()),
        ("silent", fake_peer(None)),
        ("garbage", fake_peer(Some(b"garbage garbage garbage garbage!!"))),
    ] {
        let pa = free_port();
        let a = manager(Some(pa), &[], &[]);
        save(&a, &d);
        let b = manager(None, &[bad, pa], &["--peer-timeout-ms", "500"]);
        assert_eq!(restore(&b, 48), (48, d.clone()), "{what}");
        let peers = b.stats()["peers"]["peers"].clone();
        let errors: u64 = peers
            .as_array()
            .expect("peers")
            .iter()
            .map(|p| p["errors"].as_u64().expect("u64"))
            .sum();
        assert_eq!(
            errors, 1,
            "{what}: the bad peer counted, skipped for its back-off"
        );
        eventually("A's lease ended", || a.stats()["live_leases"] == 0);
    }
}

fn probe(s: &mut TcpStream, n: usize) -> (u64, u32) {
    let req = PeerRequest::Probe(BlockQuery {
        fingerprint: FP,
        shard: 0,
        salt: orbitkv_client::namespace_salt(b""),
        block_bytes: BB as u64,
        generation: 0,
        hashes: hashes(n),
    });
    write_frame(s, req.kind(), 1, &req.encode()).expect("probe");
    let (h, body) = read_frame(s).expect("leased");
    match decode_peer_response(h.kind, &body).expect("decode") {
        PeerResponse::Leased { lease, blocks, .. } => (lease, blocks),
        other => panic!("expected Leased, got {other:?}"),
    }
}

#[test]
fn a_probed_lease_is_pinned_until_send_done_timeout_or_disconnect() {
    let pa = free_port();
    let a = manager(Some(pa), &[], &["--peer-timeout-ms", "800"]);
    let d = data(3);
    save(&a, &d);
    let conn = || {
        let s = TcpStream::connect(("127.0.0.1", pa)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s
    };
    // Probe, then Done: pinned in between, nothing sent, released after.
    let mut s = conn();
    let (lease, blocks) = probe(&mut s, 5);
    assert_eq!(blocks, 3, "the hit, no bytes yet");
    assert_eq!(a.stats()["live_leases"], 1);
    let done = PeerRequest::Done { lease, stored: false };
    write_frame(&mut s, done.kind(), 2, &done.encode()).expect("done");
    eventually("released on Done", || a.stats()["live_leases"] == 0);
    assert_eq!(source(&a, "probes_released"), 1);
    assert_eq!(source(&a, "blocks_sent"), 0);
    // Probe, then Send: answered like a Fetch, bytes checked.
    let (lease, _) = probe(&mut s, 3);
    let send = PeerRequest::Send { lease };
    write_frame(&mut s, send.kind(), 3, &send.encode()).expect("send");
    let (h, body) = read_frame(&mut s).expect("leased");
    let Ok(PeerResponse::Leased {
        lease: l2, blocks, ..
    }) = decode_peer_response(h.kind, &body)
    else {
        panic!("expected Leased");
    };
    assert_eq!((l2, blocks), (lease, 3));
    for want in &d {
        let mut got = vec![0u8; BB];
        s.read_exact(&mut got).expect("bytes");
        assert_eq!(&got, want);
    }
    let (h, _) = read_frame(&mut s).expect("sent");
    assert_eq!(h.kind, orbitkv_proto::peer::PEER_SENT);
    let done = PeerRequest::Done { lease, stored: true };
    write_frame(&mut s, done.kind(), 4, &done.encode()).expect("done");
    eventually("released on completion", || a.stats()["live_leases"] == 0);
    // A Send for a lease never probed is a miss.
    let send = PeerRequest::Send { lease: 12345 };
    write_frame(&mut s, send.kind(), 5, &send.encode()).expect("stray send");
    let (h, body) = read_frame(&mut s).expect("answer");
    assert!(matches!(
        decode_peer_response(h.kind, &body),
        Ok(PeerResponse::Leased { blocks: 0, .. })
    ));
    // Probe, then silence: released after --peer-timeout-ms.
    let (_, blocks) = probe(&mut s, 3);
    assert_eq!(blocks, 3);
    assert_eq!(a.stats()["live_leases"], 1);
    eventually("released by the deadline", || a.stats()["live_leases"] == 0);
    // Probe, then the reader vanishes: released at once.
    let mut s = conn();
    probe(&mut s, 3);
    drop(s);
    eventually("released on disconnect", || a.stats()["live_leases"] == 0);
}
