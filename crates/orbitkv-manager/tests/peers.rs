//! Peer Managers (issue 12, contract D3) with real Manager processes on
//! loopback: restore through B what was saved on A (from A's DRAM, from A's
//! SSD, after A restarts), A killed mid-transfer, source leases ended by
//! completion / connection loss / timeout / shutdown, garbage from either
//! side, mutual TLS with a wrong certificate, three Managers, and a bulk fill
//! (checksums on the helper thread) with one bad block or a cut.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use orbitkv_proto::peer::{BlockQuery, PeerRequest, PeerResponse, decode_peer_request, decode_peer_response};
use orbitkv_proto::{read_frame, write_frame};
use support::*;

const BB: usize = 64 << 10;
const FP: [u8; 32] = [7; 32];

fn wait_port(port: u16) {
    eventually(&format!("peer listener on {port}"), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// A Manager serving peers on `port`, asking `peers`, with `extra` flags.
fn manager(port: Option<u16>, peers: &[u16], extra: &[&str]) -> ManagerProc {
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    if let Some(p) = port {
        args.push("--peer-listen".into());
        args.push(format!("127.0.0.1:{p}"));
    }
    for p in peers {
        args.push("--peer".into());
        args.push(format!("127.0.0.1:{p}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = ManagerProc::start(&refs);
    if let Some(p) = port {
        wait_port(p);
    }
    m
}

/// A source A serving peers on a free port and B asking it: (A's port, A, B).
fn a_and_b() -> (u16, ManagerProc, ManagerProc) {
    let pa = free_port();
    let a = manager(Some(pa), &[], &[]);
    let b = manager(None, &[pa], &[]);
    (pa, a, b)
}

fn blocks(seed: u8, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| block(seed.wrapping_add(i as u8), BB)).collect()
}

fn hashes(chain: u8, n: usize) -> Vec<[u8; 32]> {
    (0..n).map(|i| hash(chain, i as u8)).collect()
}

fn save(m: &ManagerProc, chain: u8, data: &[Vec<u8>]) {
    save_blocks(m, FP, BB, &hashes(chain, data.len()), data);
}

/// Restore `n` blocks of `chain` through `m`: (blocks hit, their bytes).
fn restore(m: &ManagerProc, chain: u8, n: usize) -> (usize, Vec<Vec<u8>>) {
    restore_blocks(m, FP, BB, &hashes(chain, n))
}

/// A restore through `b` that hit `hit` blocks must be a miss that stored
/// nothing, after one peer error (`ctx` ends the messages): B's stats.
fn assert_a_miss_storing_nothing(b: &ManagerProc, hit: usize, ctx: &str) -> serde_json::Value {
    assert_eq!(hit, 0, "a miss{ctx}");
    let s = b.stats();
    assert_eq!(s["blocks_committed_total"], 0, "nothing stored{ctx}");
    assert_eq!(s["dram_visible_blocks"], 0);
    assert_eq!(peer_stat(b, "errors"), 1);
    s
}

fn peer_stat(m: &ManagerProc, field: &str) -> u64 {
    let s = m.stats();
    s["peers"]["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .map(|p| p[field].as_u64().expect("u64"))
        .sum()
}

fn source_stat(m: &ManagerProc, field: &str) -> u64 {
    m.stats()["peers"]["source"][field].as_u64().expect("u64")
}

#[test]
fn restore_through_b_is_byte_exact_from_a_dram() {
    let (pa, a, b) = a_and_b();
    let data = blocks(10, 6);
    save(&a, 1, &data);
    let (hit, got) = restore(&b, 1, 6);
    assert_eq!(hit, 6, "all blocks came from A");
    assert_eq!(got, data, "byte-exact");
    assert_eq!(source_stat(&a, "blocks_sent"), 6);
    assert_eq!(peer_stat(&b, "blocks"), 6);
    eventually("A's source lease ended by B's completion report", || {
        source_stat(&a, "leases_open") == 0 && a.stats()["live_leases"] == 0
    });
    assert_eq!(source_stat(&a, "leases_done"), 1);
    assert_eq!(b.stats()["latency_us"]["peer_fill"]["count"], 1, "B's fill timed");
    // Now a local hit on B: nothing more crosses.
    let (hit, got) = restore(&b, 1, 6);
    assert_eq!((hit, got), (6, data));
    assert_eq!(source_stat(&a, "blocks_sent"), 6);
    assert_eq!(
        b.stats()["latency_us"]["peer_fill"]["count"],
        1,
        "no fill for a local hit"
    );
    // Status shows the peer and its health.
    let st = b.stats();
    let p = &st["peers"]["peers"][0];
    assert_eq!(p["addr"], format!("127.0.0.1:{pa}"));
    assert_eq!(p["health"], "up");
    assert_eq!(p["bytes"], (6 * BB) as u64);
    assert_eq!(st["peers"]["tls"], false);
}

#[test]
fn a_partial_local_hit_is_completed_from_a_peer() {
    let (_, a, b) = a_and_b();
    let data = blocks(20, 5);
    save(&a, 2, &data);
    save(&b, 2, &data[..2]);
    let (hit, got) = restore(&b, 2, 5);
    assert_eq!(hit, 5);
    assert_eq!(got, data);
    assert_eq!(
        source_stat(&a, "blocks_sent"),
        3,
        "only the missing suffix crossed"
    );
    // A miss everywhere stays a miss.
    assert_eq!(restore(&b, 99, 3).0, 0);
}

#[test]
fn restore_through_b_from_a_ssd_after_a_restarts() {
    let ssd = tempfile::tempdir().expect("ssd dir");
    let dir = ssd.path().to_str().expect("utf8").to_string();
    let ssd_flags = [
        "--ssd-dir",
        dir.as_str(),
        "--ssd-capacity",
        "64MiB",
        "--ssd-mode",
        "kernel",
        "--ssd-write-policy",
        "eager",
    ];
    let pa = free_port();
    let data = blocks(30, 8);
    {
        let a = manager(Some(pa), &[], &ssd_flags);
        save(&a, 3, &data);
        eventually("A spilled every block", || a.stats()["ssd_blocks"] == 8);
        let mut a = a;
        // SIGTERM: a clean stop; the SSD copies are durable already.
        Command::new("kill")
            .arg(a.child.id().to_string())
            .status()
            .expect("kill");
        let _ = a.child.wait();
    }
    let a = manager(Some(pa), &[], &ssd_flags);
    assert_eq!(
        a.stats()["dram_visible_blocks"],
        0,
        "after the restart A holds them on SSD only"
    );
    let b = manager(None, &[pa], &[]);
    let (hit, got) = restore(&b, 3, 8);
    assert_eq!(hit, 8, "served from A's SSD");
    assert_eq!(got, data, "byte-exact");
    eventually("A's source lease released", || a.stats()["live_leases"] == 0);
}

#[test]
fn a_killed_mid_transfer_is_a_miss_never_wrong_bytes() {
    let pa = free_port();
    // A pauses after the first block of a transfer (fault injection), so the
    // kill lands mid-transfer deterministically.
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("a.sock");
    let mut a = std::process::Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .args(["--socket", sock.to_str().expect("utf8"), "--dram-size", "8MiB"])
        .args([
            "--metrics-addr",
            "off",
            "--log-level",
            "warn",
            "--enable-fault-injection",
        ])
        .args(["--peer-listen", &format!("127.0.0.1:{pa}")])
        .env("ORBITKV_PEER_STALL_MS", "30000")
        .spawn()
        .expect("spawn A");
    wait_port(pa);
    let a_client =
        || orbitkv_client::Client::connect(&sock, None, Duration::from_secs(5)).expect("connect A");
    let c = a_client();
    let ns = c.register_namespace(FP, BB as u64, 0, b"").expect("ns");
    let data = blocks(40, 4);
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    c.save(&ns, &hashes(4, 4), &src).expect("save");
    c.close().expect("close");
    let b = manager(None, &[pa], &["--peer-timeout-ms", "20000"]);
    let b_sock = b.socket().to_path_buf();
    let reader = std::thread::spawn(move || {
        let c = orbitkv_client::Client::connect(&b_sock, None, Duration::from_secs(60)).expect("connect B");
        let ns = c.register_namespace(FP, BB as u64, 0, b"").expect("ns");
        let hit = c.lookup(&ns, &hashes(4, 4)).expect("lookup").hit_blocks;
        c.close().expect("close");
        hit
    });
    eventually("A holds a source lease mid-transfer", || {
        let c = a_client();
        let s: serde_json::Value = serde_json::from_str(&c.stats_json().expect("stats")).expect("json");
        c.close().expect("close");
        s["peers"]["source"]["leases_open"] == 1
    });
    a.kill().expect("SIGKILL A");
    let _ = a.wait();
    let t0 = Instant::now();
    let hit = reader.join().expect("reader");
    assert_eq!(hit, 0, "a transfer cut short is a miss");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "noticed at once, not by timeout"
    );
    let s = b.stats();
    assert_eq!(s["blocks_committed_total"], 0, "nothing stored on B");
    assert_eq!(s["dram_visible_blocks"], 0);
    assert_eq!(peer_stat(&b, "errors"), 1);
    assert_eq!(s["peers"]["peers"][0]["health"], "down");
    // B still serves its own blocks, and a restore through B is still a miss.
    assert_eq!(restore(&b, 4, 4).0, 0);
    save(&b, 5, &blocks(50, 2));
    assert_eq!(restore(&b, 5, 2), (2, blocks(50, 2)));
}

/// A Fetch of `n` blocks of `chain` in namespace `FP`.
fn fetch(chain: u8, n: usize) -> PeerRequest {
    PeerRequest::Fetch(BlockQuery {
        fingerprint: FP,
        shard: 0,
        salt: orbitkv_client::namespace_salt(b""),
        block_bytes: BB as u64,
        generation: 0,
        hashes: hashes(chain, n),
    })
}

/// A plain TCP connection to the peer port `port`, reads timing out after 10 s.
fn peer_conn(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s
}

/// Speak the peer protocol to a source by hand: Fetch, read the blocks.
fn fetch_by_hand(port: u16, chain: u8, n: usize) -> (TcpStream, u64, Vec<Vec<u8>>) {
    let mut s = peer_conn(port);
    let req = fetch(chain, n);
    write_frame(&mut s, req.kind(), 1, &req.encode()).expect("send");
    let (h, body) = read_frame(&mut s).expect("leased");
    let PeerResponse::Leased { lease, blocks, .. } = decode_peer_response(h.kind, &body).expect("decode")
    else {
        panic!("expected Leased");
    };
    let mut out = Vec::new();
    for _ in 0..blocks {
        let mut b = vec![0u8; BB];
        s.read_exact(&mut b).expect("bytes");
        out.push(b);
    }
    let (h, body) = read_frame(&mut s).expect("sent");
    assert!(matches!(
        decode_peer_response(h.kind, &body),
        Ok(PeerResponse::Sent { .. })
    ));
    (s, lease, out)
}

#[test]
fn the_source_lease_lives_until_completion_and_no_longer() {
    let pa = free_port();
    let a = manager(Some(pa), &[], &["--peer-timeout-ms", "3000"]);
    let data = blocks(60, 3);
    save(&a, 6, &data);

    // Completion: pinned until Done; a duplicate Done counts once.
    let (mut s, lease, got) = fetch_by_hand(pa, 6, 3);
    assert_eq!(got, data);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        a.stats()["live_leases"],
        1,
        "pinned until the reader reports completion"
    );
    let done = PeerRequest::Done { lease, stored: true };
    write_frame(&mut s, done.kind(), 2, &done.encode()).expect("done");
    eventually("released on Done", || a.stats()["live_leases"] == 0);
    write_frame(&mut s, done.kind(), 3, &done.encode()).expect("duplicate done");
    let (_s2, _, again) = {
        // The connection still works after the duplicate (it counted nothing).
        let req = fetch(6, 1);
        write_frame(&mut s, req.kind(), 4, &req.encode()).expect("send");
        let (h, body) = read_frame(&mut s).expect("leased");
        let Ok(PeerResponse::Leased { blocks: 1, .. }) = decode_peer_response(h.kind, &body) else {
            panic!("expected one block");
        };
        let mut b = vec![0u8; BB];
        s.read_exact(&mut b).expect("bytes");
        read_frame(&mut s).expect("sent");
        let Ok(PeerResponse::Leased { lease, .. }) = decode_peer_response(h.kind, &body) else {
            unreachable!()
        };
        let done = PeerRequest::Done { lease, stored: true };
        write_frame(&mut s, done.kind(), 5, &done.encode()).expect("done");
        (s, 0u64, b)
    };
    assert_eq!(again, data[0]);
    eventually("released", || a.stats()["live_leases"] == 0);
    assert_eq!(source_stat(&a, "leases_done"), 2);

    // Cancel: the reader reports it did not keep the bytes; released at once.
    let (mut s3, lease, _) = fetch_by_hand(pa, 6, 3);
    eventually("pinned", || a.stats()["live_leases"] == 1);
    let cancel = PeerRequest::Done { lease, stored: false };
    write_frame(&mut s3, cancel.kind(), 2, &cancel.encode()).expect("cancel");
    eventually("released on cancel", || a.stats()["live_leases"] == 0);
    assert_eq!(source_stat(&a, "leases_done"), 3);
    drop(s3);

    // Connection loss: released at once.
    let (s, _, _) = fetch_by_hand(pa, 6, 3);
    eventually("pinned", || a.stats()["live_leases"] == 1);
    let t0 = Instant::now();
    drop(s);
    eventually("released when the reader's connection dropped", || {
        a.stats()["live_leases"] == 0
    });
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "at once, not by the 3 s deadline"
    );

    // A reader that never reports: released within the peer timeout of the last byte.
    let (_quiet, _, _) = fetch_by_hand(pa, 6, 3);
    let t0 = Instant::now();
    eventually("released by the completion deadline", || {
        a.stats()["live_leases"] == 0
    });
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert_eq!(source_stat(&a, "leases_dropped"), 2);
}

#[test]
fn shutdown_ends_source_leases_in_bounded_time() {
    let pa = free_port();
    let mut a = manager(Some(pa), &[], &["--peer-timeout-ms", "60000"]);
    save(&a, 7, &blocks(70, 2));
    let (mut s, _, _) = fetch_by_hand(pa, 7, 2);
    eventually("pinned", || a.stats()["live_leases"] == 1);
    let t0 = Instant::now();
    Command::new("kill")
        .arg(a.child.id().to_string())
        .status()
        .expect("SIGTERM");
    let status = a.child.wait().expect("wait");
    assert!(status.success(), "clean exit: {status}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The reader sees its connection closed.
    let mut buf = [0u8; 1];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
}

#[test]
fn garbage_to_a_source_is_disconnected_and_serving_goes_on() {
    let pa = free_port();
    let a = manager(Some(pa), &[], &[]);
    save(&a, 8, &blocks(80, 2));
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0u8; 64][..],
        &[0xffu8; 20000][..],
    ] {
        let mut s = peer_conn(pa);
        let _ = s.write_all(garbage);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink); // returns once A closed the connection
    }
    // A client kind on the peer port is refused too (a valid frame, wrong protocol).
    let mut s = TcpStream::connect(("127.0.0.1", pa)).expect("connect");
    write_frame(&mut s, 0x0a, 1, &[]).expect("send");
    let (h, body) = read_frame(&mut s).expect("error reply");
    assert!(matches!(
        decode_peer_response(h.kind, &body),
        Ok(PeerResponse::Error { .. })
    ));
    assert!(source_stat(&a, "bad_frames") >= 3);
    assert_eq!(a.stats()["live_leases"], 0);
    let b = manager(None, &[pa], &[]);
    assert_eq!(restore(&b, 8, 2), (2, blocks(80, 2)), "A still serves peers");
}

/// A fake source on `port`: answers every Fetch with `reply(request)`, each
/// connection on a thread of its own (a split fetch opens several at once).
fn fake_source(reply: fn(&PeerRequest) -> Vec<u8>) -> u16 {
    fake_source_writing(reply, 0)
}

/// [`fake_source`] writing each reply in pieces of `piece` bytes (0: whole),
/// pausing after each, so the reader receives every block in many parts.
fn fake_source_writing(reply: fn(&PeerRequest) -> Vec<u8>, piece: usize) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                while let Ok((h, body)) = read_frame(&mut s) {
                    let Ok(req) = decode_peer_request(h.kind, &body) else {
                        break;
                    };
                    let out = reply(&req);
                    let sent = if piece == 0 {
                        s.write_all(&out)
                    } else {
                        out.chunks(piece).try_for_each(|c| {
                            let r = s.write_all(c).and_then(|()| s.flush());
                            std::thread::sleep(Duration::from_micros(300));
                            r
                        })
                    };
                    if sent.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn a_peer_sending_garbage_or_wrong_bytes_stores_nothing() {
    // Plain garbage instead of a reply.
    let garbage = fake_source(|_| b"\x00\x01not a frame at all".to_vec());
    // A well-formed transfer whose first block's checksum does not match its bytes.
    let lying = fake_source(|req| transfer(req, Some(0), |_| vec![0x5a; BB]));
    // More blocks than asked for.
    let greedy = fake_source(|_| {
        let mut out = Vec::new();
        let head = PeerResponse::Leased {
            lease: 1,
            blocks: 1000,
            block_bytes: BB as u64,
        };
        write_frame(&mut out, head.kind(), 0, &head.encode()).expect("frame");
        out
    });
    for port in [garbage, lying, greedy] {
        let b = manager(None, &[port], &[]);
        let s = assert_a_miss_storing_nothing(&b, restore(&b, 9, 3).0, "");
        assert!(s["peers"]["peers"][0]["last_error"].is_string());
    }
}

/// A well-formed transfer of every block asked for (`bytes(i)` each), with
/// the right xxh3-64 per block except for block `wrong`.
fn transfer(req: &PeerRequest, wrong: Option<usize>, bytes: fn(usize) -> Vec<u8>) -> Vec<u8> {
    let PeerRequest::Fetch(BlockQuery { hashes, .. }) = req else {
        return Vec::new();
    };
    let blocks: Vec<Vec<u8>> = (0..hashes.len()).map(bytes).collect();
    sent_blocks(&blocks, BB, wrong)
}

/// A source's whole answer carrying `blocks` (announced as `block_bytes`
/// each): `Leased`, the bytes, `Sent` with their checksums (block `wrong`'s
/// off by one bit).
fn sent_blocks(blocks: &[Vec<u8>], block_bytes: usize, wrong: Option<usize>) -> Vec<u8> {
    let mut out = Vec::new();
    let head = PeerResponse::Leased {
        lease: 1,
        blocks: blocks.len() as u32,
        block_bytes: block_bytes as u64,
    };
    write_frame(&mut out, head.kind(), 0, &head.encode()).expect("frame");
    let mut checksums = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let sum = xxhash_rust::xxh3::xxh3_64(b);
        checksums.push(if Some(i) == wrong { sum ^ 1 } else { sum });
        out.extend_from_slice(b);
    }
    let tail = PeerResponse::Sent { checksums };
    write_frame(&mut out, tail.kind(), 0, &tail.encode()).expect("frame");
    out
}

/// Transfers of 4 MiB or more take their checksums on a helper thread on each
/// side while the next block moves (`--peer-hash-thread on`), or inline
/// (`off`): byte-exact from a real source either way, and nothing stored when
/// one block's checksum is wrong or the source stops half-way.
#[test]
fn a_bulk_fill_is_byte_exact_and_one_bad_block_or_a_cut_stores_nothing() {
    const N: usize = 72; // 4.5 MiB of 64 KiB blocks
    // Right bytes, but the 50th block's checksum is off by one bit.
    let one_bad = fake_source(|req| transfer(req, Some(49), |i| block(i as u8, BB)));
    // Half of the blocks, then the connection closes.
    let cut = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let Ok((h, body)) = read_frame(&mut s) else {
                    continue;
                };
                let Ok(req) = decode_peer_request(h.kind, &body) else {
                    continue;
                };
                let all = transfer(&req, None, |i| block(i as u8, BB));
                let _ = s.write_all(&all[..all.len() / 2]);
            }
        });
        port
    };
    for mode in ["on", "off"] {
        let flag = ["--peer-hash-thread", mode];
        let pa = free_port();
        let a = manager(Some(pa), &[], &flag);
        let b = manager(None, &[pa], &flag);
        assert_eq!(b.stats()["peers"]["hash_thread"], mode == "on");
        let data = blocks(60, N);
        save(&a, 11, &data);
        let (hit, got) = restore(&b, 11, N);
        assert_eq!(hit, N, "every block through the peer ({mode})");
        assert!(got == data, "byte-exact ({mode})");
        assert_eq!(peer_stat(&b, "blocks"), N as u64);
        for port in [one_bad, cut] {
            let b = manager(None, &[port], &flag);
            let s = assert_a_miss_storing_nothing(&b, restore(&b, 12, N).0, &format!(" ({mode})"));
            assert!(s["peers"]["peers"][0]["last_error"].is_string());
        }
    }
}

/// The reader hashes each block as it lands, receive by receive (inline
/// checksums): a block dribbled in odd-sized pieces is stored byte-exact; one
/// byte changed in the middle of a block (its checksum that of the right
/// bytes) is a miss with nothing stored.
#[test]
fn a_block_in_many_receives_is_exact_and_a_byte_changed_mid_block_stores_nothing() {
    const N: usize = 6;
    let dribbled = fake_source_writing(|req| transfer(req, None, |i| block(i as u8, BB)), 4093);
    let flipped = fake_source_writing(
        |req| {
            let mut out = transfer(req, None, |i| block(i as u8, BB));
            // Block 3's middle byte (after the Leased frame and blocks 0..3).
            let at = out.len() - (N - 3) * BB - sent_frame_len(N) + BB / 2;
            out[at] ^= 0x40;
            out
        },
        4093,
    );
    for mode in ["off", "on"] {
        let flag = ["--peer-hash-thread", mode];
        let b = manager(None, &[dribbled], &flag);
        let (hit, got) = restore(&b, 13, N);
        assert_eq!(hit, N, "every block ({mode})");
        let want: Vec<Vec<u8>> = (0..N).map(|i| block(i as u8, BB)).collect();
        assert!(got == want, "byte-exact ({mode})");
        let b = manager(None, &[flipped], &flag);
        let s = assert_a_miss_storing_nothing(&b, restore(&b, 13, N).0, &format!(" ({mode})"));
        assert!(
            s["peers"]["peers"][0]["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("checksums differ")),
            "{s}"
        );
    }
}

/// Bytes of the `Sent` frame that ends a transfer of `n` blocks.
fn sent_frame_len(n: usize) -> usize {
    let tail = PeerResponse::Sent {
        checksums: vec![0; n],
    };
    let mut out = Vec::new();
    write_frame(&mut out, tail.kind(), 0, &tail.encode()).expect("frame");
    out.len()
}

const BIG: usize = 1 << 20;
const BIG_FP: [u8; 32] = [8; 32];

fn big_hashes(n: usize) -> Vec<[u8; 32]> {
    (0..n).map(|i| hash(0x5b, i as u8)).collect()
}

/// Save the 1 MiB blocks `data` as `hashes` on `m`: the blocks stored.
fn save_big(m: &ManagerProc, hashes: &[[u8; 32]], data: &[Vec<u8>]) -> usize {
    let c = m.client();
    let ns = c.register_namespace(BIG_FP, BIG as u64, 0, b"").expect("ns");
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    let stored = c.save(&ns, hashes, &src).expect("save").stored as usize;
    c.close().expect("close");
    stored
}

/// A transfer of 1 MiB blocks: the range whose first hash is block 18's gets
/// a wrong checksum for its first block (the third of four ranges of 9).
fn big_transfer_third_range_lies(req: &PeerRequest) -> Vec<u8> {
    let PeerRequest::Fetch(BlockQuery { hashes, .. }) = req else {
        return Vec::new();
    };
    let first = usize::from(hashes.first().map_or(0, |h| h[1]));
    let blocks: Vec<Vec<u8>> = hashes.iter().map(|h| block(h[1], BIG)).collect();
    sent_blocks(&blocks, BIG, (first == 18).then_some(0))
}

/// A large fetch from one peer is split over several connections
/// (`--peer-fill-streams`), each a contiguous range with a source lease of its
/// own: byte-exact, every source lease ended by completion; one range's bad
/// checksum stores nothing of any range; a source holding only the first part
/// fills that prefix; one without the first range is asked for nothing else.
#[test]
fn a_split_fetch_is_exact_and_one_bad_range_stores_nothing() {
    const N: usize = 36; // 36 MiB: four ranges of 9 MiB
    let big = ["--dram-size", "96MiB"];
    let pa = free_port();
    let a = manager(Some(pa), &[], &big);
    let data: Vec<Vec<u8>> = (0..N).map(|i| block(i as u8, BIG)).collect();
    assert_eq!(save_big(&a, &big_hashes(N), &data), N);
    let restore_big = |m: &ManagerProc, n: usize| restore_blocks(m, BIG_FP, BIG, &big_hashes(n));
    let streams = ["--dram-size", "96MiB", "--peer-fill-streams", "4"];
    let b = manager(None, &[pa], &streams);
    assert_eq!(b.stats()["peers"]["fill_streams"], 4);
    let (hit, got) = restore_big(&b, N);
    assert_eq!(hit, N, "every block through the peer");
    assert!(got == data, "byte-exact");
    assert_eq!(source_stat(&a, "fetches"), 4, "four ranges, four fetches");
    eventually("every source lease ended by completion", || {
        source_stat(&a, "leases_done") == 4 && source_stat(&a, "leases_open") == 0
    });
    assert_eq!(peer_stat(&b, "blocks"), N as u64);

    // The third range's first checksum is wrong: no range is stored.
    let liar = fake_source(big_transfer_third_range_lies);
    let b = manager(None, &[liar], &streams);
    assert_a_miss_storing_nothing(&b, restore_big(&b, N).0, "");

    // A source holding only the first 20 blocks: the first two ranges whole,
    // the third's prefix (2 blocks), the fourth a miss.
    let pc = free_port();
    let c_src = manager(Some(pc), &[], &big);
    assert_eq!(save_big(&c_src, &big_hashes(20), &data[..20]), 20);
    let b = manager(None, &[pc], &streams);
    let (hit, got) = restore_big(&b, N);
    assert_eq!(hit, 20, "the leading whole ranges and the third's prefix");
    assert!(got[..] == data[..20], "byte-exact prefix");
    eventually("every source lease of the split fetch ended", || {
        source_stat(&c_src, "leases_open") == 0
    });

    // A source without the first range (blocks 9.. only): asked for the first
    // range alone, a miss, no other range requested.
    let pd = free_port();
    let d_src = manager(Some(pd), &[], &big);
    let stored = save_big(&d_src, &big_hashes(N)[9..], &data[9..]);
    assert_eq!(stored, N - 9);
    let b = manager(None, &[pd], &streams);
    assert_eq!(restore_big(&b, N).0, 0, "a miss");
    assert_eq!(source_stat(&d_src, "fetches"), 1, "only the first range asked");
    assert_eq!(b.stats()["blocks_committed_total"], 0, "nothing stored");
}

#[test]
fn three_managers_each_find_the_others_blocks() {
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let a = manager(Some(pa), &[pb, pc], &[]);
    let b = manager(Some(pb), &[pa, pc], &[]);
    let c = manager(Some(pc), &[pa, pb], &[]);
    save(&a, 11, &blocks(110, 3));
    save(&b, 12, &blocks(120, 3));
    assert_eq!(restore(&c, 11, 3), (3, blocks(110, 3)));
    assert_eq!(restore(&c, 12, 3), (3, blocks(120, 3)));
    assert_eq!(restore(&a, 12, 3), (3, blocks(120, 3)));
    assert_eq!(restore(&b, 11, 3), (3, blocks(110, 3)));
}

#[test]
fn off_loopback_without_tls_is_refused_at_start() {
    for args in [
        vec!["--peer-listen", "0.0.0.0:7470"],
        vec!["--peer", "10.1.2.3:7470"],
        vec!["--peer", "localhost:7470"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
            .args(["--socket", "/nonexistent/x.sock", "--metrics-addr", "off"])
            .args(&args)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("requires mutual TLS"), "{args:?}: {err}");
    }
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn mutual_tls_serves_and_a_wrong_certificate_is_refused() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED: the openssl command (to make test certificates) is not installed");
        return;
    }
    let pki = tempfile::tempdir().expect("tempdir");
    pki::make_pki(pki.path(), "ca", &[("a", "127.0.0.1"), ("b", "127.0.0.1")]);
    pki::make_pki(pki.path(), "rogue", &[("c", "127.0.0.1")]);
    let pa = free_port();
    let fa = pki::tls_flags(pki.path(), "a", "ca");
    let fb = pki::tls_flags(pki.path(), "b", "ca");
    let fc = pki::tls_flags(pki.path(), "c", "rogue");
    let a = manager(Some(pa), &[], &refs(&fa));
    save(&a, 13, &blocks(130, 4));
    let b = manager(None, &[pa], &refs(&fb));
    assert_eq!(restore(&b, 13, 4), (4, blocks(130, 4)), "over mutual TLS");
    assert_eq!(b.stats()["peers"]["tls"], true);
    assert_eq!(source_stat(&a, "refused"), 0);
    // C's certificate chains to another CA: A refuses it (and C refuses A's).
    let c = manager(None, &[pa], &refs(&fc));
    assert_eq!(restore(&c, 13, 4).0, 0, "refused: a miss");
    assert_eq!(c.stats()["blocks_committed_total"], 0);
    assert_eq!(peer_stat(&c, "errors"), 1);
    assert_eq!(source_stat(&a, "refused"), 1, "C's handshake refused");
    // A plain-TCP client on the TLS port gets nothing either.
    let mut s = peer_conn(pa);
    let req = fetch(13, 4);
    let _ = write_frame(&mut s, req.kind(), 1, &req.encode());
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    assert!(
        sink.windows(BB.min(64)).all(|w| w != &blocks(130, 1)[0][..64]),
        "no block bytes to a peer without a certificate"
    );
    // A key readable by others is refused at start-up.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(pki.path().join("b.pk8"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let mut args = vec![
        "--socket".to_string(),
        "/nonexistent/x.sock".into(),
        "--metrics-addr".into(),
        "off".into(),
    ];
    args.extend(["--peer".into(), format!("127.0.0.1:{pa}")]);
    args.extend(fb);
    let out = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .args(&args)
        .output()
        .expect("run");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn plain_loopback_refuses_a_peer_of_another_uid() {
    let is_root = orbitkv_shm::peer::my_uid() == 0;
    let has_setpriv = Command::new("setpriv").arg("--version").output().is_ok();
    if !is_root || !has_setpriv {
        eprintln!(
            "SKIPPED: needs root and setpriv to connect as another uid (root: {is_root}, setpriv: {has_setpriv})"
        );
        return;
    }
    let pa = free_port();
    let a = manager(Some(pa), &[], &[]);
    save(&a, 14, &blocks(140, 2));
    // uid 65534 connects to A's plain peer port and sends a valid Fetch.
    let req = fetch(14, 2);
    let mut frame = Vec::new();
    write_frame(&mut frame, req.kind(), 1, &req.encode()).expect("frame");
    let dir = tempfile::tempdir().expect("tempdir");
    let f = file_with_mode(dir.path(), "fetch.bin", &frame, 0o644);
    chmod(dir.path(), 0o755);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c"])
        .arg(format!(
            "exec 3<>/dev/tcp/127.0.0.1/{pa}; cat {} >&3; timeout 5 cat <&3 | wc -c",
            f.display()
        ))
        .output()
        .expect("setpriv");
    let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(got, "0", "no reply bytes to another uid: {out:?}");
    assert_eq!(source_stat(&a, "refused"), 1);
    assert_eq!(source_stat(&a, "fetches"), 0);
    assert_eq!(a.stats()["live_leases"], 0);
}

#[test]
fn a_restarted_source_is_reached_again_on_a_fresh_connection() {
    let (pa, mut a, b) = a_and_b();
    save(&a, 15, &blocks(150, 2));
    assert_eq!(restore(&b, 15, 2), (2, blocks(150, 2)));
    // B keeps that connection pooled; A dies and comes back on the same port.
    a.child.kill().expect("SIGKILL A");
    let _ = a.child.wait();
    let a = manager(Some(pa), &[], &[]);
    save(&a, 16, &blocks(160, 3));
    assert_eq!(
        restore(&b, 16, 3),
        (3, blocks(160, 3)),
        "the dead pooled connection is replaced, not reported as a miss"
    );
    assert_eq!(peer_stat(&b, "errors"), 0);
}
