//! Real Manager process + real client sessions over the Unix socket.

mod support;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use orbitkv_client::{Client, ClientError, SlotStatus};
use orbitkv_proto::{ErrorCode, Kind, Request, Response, decode_response, read_frame, write_frame};
use support::*;

const BB: usize = 64 * 1024;

#[test]
fn two_sessions_share_blocks_byte_exact_with_cold_partial_and_full_hits() {
    let m = ManagerProc::start(&["--dram-size", "16MiB", "--segment-size", "4MiB"]);
    let a = m.client();
    let b = m.client();
    assert_ne!(a.session_id(), b.session_id());
    let ns_a = a.register_namespace([1; 32], BB as u64, 0, [0; 32]).expect("ns");
    let ns_b = b.register_namespace([1; 32], BB as u64, 0, [0; 32]).expect("ns");
    assert_eq!(ns_a.id, ns_b.id, "same identity → same namespace");

    let hashes: Vec<[u8; 32]> = (0..8).map(|i| hash(1, i)).collect();
    let blocks: Vec<Vec<u8>> = (0..8).map(|i| block(i, BB)).collect();

    // Cold miss.
    let miss = b.lookup(&ns_b, &hashes).expect("lookup");
    assert_eq!((miss.hit_blocks, miss.lease), (0, 0));

    // A saves the first 5 blocks.
    let src: Vec<&[u8]> = blocks[..5].iter().map(|v| v.as_slice()).collect();
    let r = a.save(&ns_a, &hashes[..5], &src).expect("save");
    assert_eq!((r.stored, r.already_present, r.refused), (5, 0, 0));

    // Partial hit from B: 5 of 8, byte-exact.
    let mut out = vec![vec![0u8; BB]; 8];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let n = b.restore(&ns_b, &hashes, &mut dst).expect("restore");
    assert_eq!(n, 5);
    for i in 0..5 {
        assert_eq!(out[i], blocks[i], "block {i} differs");
    }
    assert!(
        out[5].iter().all(|&x| x == 0),
        "blocks past the hit are untouched"
    );

    // B saves the rest; saving the first five again is skipped as present.
    let src: Vec<&[u8]> = blocks.iter().map(|v| v.as_slice()).collect();
    let r = b.save(&ns_b, &hashes, &src).expect("save");
    assert_eq!((r.stored, r.already_present), (3, 5));

    // Full hit from A.
    let mut out = vec![vec![0u8; BB]; 8];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    assert_eq!(a.restore(&ns_a, &hashes, &mut dst).expect("restore"), 8);
    assert_eq!(out, blocks);

    // A different chain (other first hash) misses entirely: contiguous prefix only.
    let mut other = hashes.clone();
    other[0] = hash(9, 0);
    assert_eq!(a.lookup(&ns_a, &other).expect("lookup").hit_blocks, 0);

    // Another shard, salt or fingerprint never shares.
    for (fp, shard, salt) in [
        ([2u8; 32], 0, [0u8; 32]),
        ([1; 32], 1, [0; 32]),
        ([1; 32], 0, [5; 32]),
    ] {
        let ns = a.register_namespace(fp, BB as u64, shard, salt).expect("ns");
        assert_ne!(ns.id, ns_a.id);
        assert_eq!(a.lookup(&ns, &hashes).expect("lookup").hit_blocks, 0);
    }
    // Same identity with another block size is a configuration error.
    let e = b
        .register_namespace([1; 32], 4096, 0, [0; 32])
        .expect_err("mismatch");
    assert!(
        matches!(
            e,
            ClientError::Server {
                code: ErrorCode::InvalidArgument,
                ..
            }
        ),
        "{e}"
    );

    a.close().expect("close");
    b.close().expect("close");
    let st = m.stats();
    assert_eq!(st["live_leases"], 0);
    assert_eq!(st["live_saves"], 0);
    assert_eq!(st["blocks_committed_total"], 8);
}

#[test]
fn aborted_and_uncommitted_saves_are_never_visible() {
    let m = ManagerProc::start(&["--dram-size", "4MiB"]);
    let c = m.client();
    let ns = c.register_namespace([3; 32], BB as u64, 0, [0; 32]).expect("ns");
    let hashes = [hash(3, 0), hash(3, 1)];
    let p = c.begin_save(&ns, &hashes).expect("begin");
    assert!(matches!(p.items[0], SlotStatus::Allocated { .. }));
    let other = m.client();
    assert_eq!(
        other.lookup(&ns, &hashes).expect("lookup").hit_blocks,
        0,
        "uncommitted is invisible"
    );
    c.abort_save(p.id).expect("abort");
    assert_eq!(
        other.lookup(&ns, &hashes).expect("lookup").hit_blocks,
        0,
        "aborted is invisible"
    );
    assert!(
        c.commit_save(p.id).is_err(),
        "an aborted save cannot be committed"
    );
    let st = m.stats();
    assert_eq!(st["dram_pending_save_bytes"], 0);
    assert_eq!(st["blocks_aborted_total"], 2);
}

#[test]
fn eviction_under_pressure_spares_leased_blocks_and_refuses_when_all_pinned() {
    // 8 blocks of 64 KiB fit in 512 KiB.
    let m = ManagerProc::start(&["--dram-size", "512KiB", "--segment-size", "256KiB"]);
    let c = m.client();
    let ns = c.register_namespace([4; 32], BB as u64, 0, [0; 32]).expect("ns");
    let first: Vec<[u8; 32]> = (0..4).map(|i| hash(4, i)).collect();
    let data: Vec<Vec<u8>> = (0..4).map(|i| block(100 + i, BB)).collect();
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    assert_eq!(c.save(&ns, &first, &src).expect("save").stored, 4);
    let lease = c.lookup(&ns, &first).expect("lookup");
    assert_eq!(lease.hit_blocks, 4);

    // Write 3x the capacity through other chains while the lease is held.
    for round in 0..6u8 {
        let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(50 + round, i)).collect();
        let d: Vec<Vec<u8>> = (0..4).map(|i| block(round * 4 + i, BB)).collect();
        let s: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let r = c.save(&ns, &hs, &s).expect("save");
        assert_eq!(r.stored + r.refused, 4);
    }
    let st = m.stats();
    assert!(
        st["evictions_total"].as_u64().unwrap_or(0) > 0,
        "pressure evicted something"
    );
    // The leased blocks survived, byte-exact.
    let slots = c.acquire(lease.lease).expect("acquire");
    let mut out = vec![vec![0u8; BB]; 4];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    c.copy_out(&slots, BB as u64, 0, &mut dst).expect("copy");
    assert_eq!(out, data);

    // Pin everything, then a save of new blocks is refused, not an error.
    let mut all = vec![lease.lease];
    for round in 0..6u8 {
        let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(50 + round, i)).collect();
        let l = c.lookup(&ns, &hs).expect("lookup");
        if l.lease != 0 {
            all.push(l.lease);
        }
    }
    let free = m.stats()["dram_free_bytes"].as_u64().unwrap_or(0);
    let want = (free as usize / BB) + 2;
    let hs: Vec<[u8; 32]> = (0..want as u8).map(|i| hash(99, i)).collect();
    let d: Vec<Vec<u8>> = (0..want as u8).map(|i| block(i, BB)).collect();
    let s: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
    let r = c.save(&ns, &hs, &s).expect("save is best effort");
    assert!(r.refused >= 2, "{r:?}");
    for l in all {
        c.release(l).expect("release");
    }
    // Unselected leases released → nothing pinned.
    assert_eq!(m.stats()["dram_pinned_blocks"], 0);
}

fn raw_session(m: &ManagerProc) -> UnixStream {
    let mut s = UnixStream::connect(m.socket()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let hello = Request::Hello {
        pid: std::process::id(),
        flags: 0,
        token: vec![],
    };
    write_frame(&mut s, Kind::Hello as u16, 1, &hello.encode()).expect("hello");
    read_hello(&mut s);
    s
}

fn read_error(s: &mut UnixStream) -> (u16, String) {
    let (h, body) = read_frame(s).expect("reply");
    match decode_response(h.kind, &body).expect("decodes") {
        Response::Error { code, message } => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// An encoded frame header of kind 3 announcing a body of `len` bytes.
fn kind3_header(len: u32, request_id: u32) -> [u8; orbitkv_proto::HEADER_LEN] {
    orbitkv_proto::Header {
        version: orbitkv_proto::PROTOCOL_VERSION,
        kind: 3,
        len,
        request_id,
    }
    .encode()
}

#[test]
fn garbage_truncated_and_oversized_frames_get_clear_errors_and_others_keep_working() {
    let m = ManagerProc::start(&["--dram-size", "4MiB"]);
    let good = m.client();
    let ns = good.register_namespace([5; 32], 4096, 0, [0; 32]).expect("ns");

    // Unknown kind with a valid header: error reply, session stays usable.
    let mut s = raw_session(&m);
    write_frame(&mut s, 0x7777, 2, b"junk").expect("write");
    let (code, msg) = read_error(&mut s);
    assert_eq!(code, ErrorCode::BadFrame as u16);
    assert!(msg.contains("unknown message kind"), "{msg}");
    // Truncated body for a known kind.
    write_frame(&mut s, Kind::Lookup as u16, 3, &[1, 0]).expect("write");
    let (code, msg) = read_error(&mut s);
    assert_eq!(code, ErrorCode::BadFrame as u16);
    assert!(msg.contains("truncated"), "{msg}");
    // Still serving this session.
    write_frame(&mut s, Kind::Stats as u16, 4, &[]).expect("write");
    let (h, _) = read_frame(&mut s).expect("stats");
    assert_eq!(h.kind, Kind::StatsOk as u16);

    // Oversized frame: error, then the connection is dropped.
    let mut s2 = raw_session(&m);
    let mut hdr = kind3_header(0, 5);
    hdr[8..12].copy_from_slice(&(64u32 << 20).to_le_bytes());
    s2.write_all(&hdr).expect("write");
    let (code, msg) = read_error(&mut s2);
    assert_eq!(code, ErrorCode::TooLarge as u16);
    assert!(msg.contains("exceeds"), "{msg}");
    let mut rest = Vec::new();
    assert_eq!(
        s2.read_to_end(&mut rest).expect("eof"),
        0,
        "connection closed after oversized frame"
    );

    // Pure garbage as the first bytes of a connection.
    let mut s3 = UnixStream::connect(m.socket()).expect("connect");
    s3.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s3.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let (code, msg) = read_error(&mut s3);
    assert_eq!(code, ErrorCode::BadFrame as u16);
    assert!(msg.contains("bad magic"), "{msg}");

    // A frame cut off mid-body, then EOF.
    let mut s4 = raw_session(&m);
    let mut hdr = kind3_header(100, 6).to_vec();
    hdr.extend_from_slice(&[0; 10]);
    s4.write_all(&hdr).expect("write");
    drop(s4);

    // The well-behaved session never noticed.
    let hs = [hash(5, 0)];
    let r = good.save(&ns, &hs, &[&block(1, 4096)]).expect("save");
    assert_eq!(r.stored, 1);
    assert_eq!(good.lookup(&ns, &hs).expect("lookup").hit_blocks, 1);
    assert!(m.stats()["bad_frames_total"].as_u64().unwrap_or(0) >= 4);
}

#[test]
fn token_is_required_when_configured() {
    let dir = tempfile::tempdir().expect("tmp");
    let tok = file_with_mode(dir.path(), "token", "0123456789abcdef-secret\n", 0o600);
    let m = ManagerProc::start(&["--token-file", tok.to_str().expect("utf8")]);
    let e = Client::connect(m.socket(), None, Duration::from_secs(5)).expect_err("no token");
    assert!(matches!(e, ClientError::Auth(_)), "{e}");
    let e = Client::connect(
        m.socket(),
        Some(b"0123456789abcdef-wrong"),
        Duration::from_secs(5),
    )
    .expect_err("wrong");
    assert!(
        matches!(e, ClientError::Auth(ref s) if s.contains("token")),
        "{e}"
    );
    let c = Client::connect(
        m.socket(),
        Some(b"0123456789abcdef-secret"),
        Duration::from_secs(5),
    )
    .expect("right");
    c.close().expect("close");
    assert_eq!(
        m.stats_with_token(b"0123456789abcdef-secret")["auth_refused_total"],
        2
    );
}

trait StatsWithToken {
    fn stats_with_token(&self, t: &[u8]) -> serde_json::Value;
}
impl StatsWithToken for ManagerProc {
    fn stats_with_token(&self, t: &[u8]) -> serde_json::Value {
        let c = Client::connect(self.socket(), Some(t), Duration::from_secs(5)).expect("connect");
        serde_json::from_str(&c.stats_json().expect("stats")).expect("json")
    }
}

#[test]
fn socket_is_private_and_a_wrong_uid_peer_is_refused() {
    let m = ManagerProc::start(&[]);
    let mode = std::fs::metadata(m.socket()).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    if rustix_is_root() {
        // Open the path up so that only SO_PEERCRED stands between uid 65534 and the Manager.
        chmod(m.dir.path(), 0o755);
        chmod(m.socket(), 0o666);
        let out = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(std::env::current_exe().expect("exe"))
            .args(["--exact", "child_connects", "--nocapture", "--test-threads", "1"])
            .env("ORBITKV_TEST_CHILD", m.socket())
            .env("ORBITKV_SERVER_UID", "0") // the child trusts this root Manager, which refuses it
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("run child");
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("CHILD-RESULT: refused: refused by the Manager: peer uid 65534 is not allowed"),
            "{text}"
        );
        assert_eq!(m.stats()["auth_refused_total"], 1);
    } else {
        println!("wrong-uid half skipped: needs root to act as another uid");
    }
}

fn rustix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// Child role for the wrong-uid test (does nothing when run normally).
#[test]
fn child_connects() {
    let Some(path) = std::env::var_os("ORBITKV_TEST_CHILD") else {
        return;
    };
    match Client::connect(std::path::Path::new(&path), None, Duration::from_secs(5)) {
        Ok(_) => println!("CHILD-RESULT: connected"),
        Err(e) => println!("CHILD-RESULT: refused: {e}"),
    }
}

#[test]
fn vanished_session_is_quarantined_while_its_process_lives() {
    let m = ManagerProc::start(&["--dram-size", "4MiB"]);
    let c = m.client();
    let ns = c.register_namespace([6; 32], 4096, 0, [0; 32]).expect("ns");
    let hs = [hash(6, 0)];
    c.save(&ns, &hs, &[&block(6, 4096)]).expect("save");
    let l = c.lookup(&ns, &hs).expect("lookup");
    c.acquire(l.lease).expect("acquire");
    let p = c.begin_save(&ns, &[hash(6, 1)]).expect("begin");
    assert!(matches!(p.items[0], SlotStatus::Allocated { .. }));
    // Drop the connection without Close: this process is alive and could still be copying.
    c.abandon();
    eventually("session quarantined", || m.stats()["quarantined_sessions"] == 1);
    std::thread::sleep(Duration::from_millis(300));
    let st = m.stats();
    assert_eq!(
        st["quarantined_sessions"], 1,
        "still held: the process has not exited"
    );
    assert_eq!(st["dram_pinned_blocks"], 1);
    assert_eq!(st["dram_pending_save_bytes"], 4096);
    // A generation reset is refused while the quarantined owners live.
    let other = m.client();
    let e = other.reset_generation(&ns).expect_err("busy");
    assert!(
        matches!(
            e,
            ClientError::Server {
                code: ErrorCode::Busy,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn reset_generation_gives_cold_miss_then_reuse() {
    let m = ManagerProc::start(&["--dram-size", "4MiB"]);
    let c = m.client();
    let ns = c.register_namespace([7; 32], 4096, 0, [0; 32]).expect("ns");
    let other_fp = c.register_namespace([8; 32], 4096, 0, [0; 32]).expect("ns");
    let hs = [hash(7, 0), hash(7, 1)];
    let d = [block(1, 4096), block(2, 4096)];
    c.save(&ns, &hs, &[&d[0], &d[1]]).expect("save");
    c.save(&other_fp, &hs, &[&d[0], &d[1]]).expect("save");
    let l = c.lookup(&ns, &hs).expect("lookup");
    let e = c.reset_generation(&ns).expect_err("busy while leased");
    assert!(matches!(
        e,
        ClientError::Server {
            code: ErrorCode::Busy,
            ..
        }
    ));
    c.release(l.lease).expect("release");
    assert_eq!(c.reset_generation(&ns).expect("reset"), 1);
    assert_eq!(
        c.lookup(&ns, &hs).expect("lookup").hit_blocks,
        0,
        "cold miss after reset"
    );
    assert_eq!(
        c.lookup(&other_fp, &hs).expect("lookup").hit_blocks,
        2,
        "other fingerprints keep theirs"
    );
    c.save(&ns, &hs, &[&d[0], &d[1]]).expect("save");
    let mut out = vec![vec![0u8; 4096]; 2];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    assert_eq!(c.restore(&ns, &hs, &mut dst).expect("restore"), 2);
    assert_eq!(out, d);
}

#[test]
fn injected_restore_failure_releases_the_lease_and_is_refused_when_disabled() {
    let m = ManagerProc::start(&["--enable-fault-injection"]);
    let c = m.client();
    let ns = c.register_namespace([9; 32], 4096, 0, [0; 32]).expect("ns");
    let hs = [hash(9, 0)];
    c.save(&ns, &hs, &[&block(9, 4096)]).expect("save");
    c.inject_faults(1, 0).expect("inject");
    let mut out = vec![0u8; 4096];
    let e = c
        .restore(&ns, &hs, &mut [out.as_mut_slice()])
        .expect_err("fails once");
    assert!(
        matches!(
            e,
            ClientError::Server {
                code: ErrorCode::RestoreFailed,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(m.stats()["live_leases"], 0);
    assert_eq!(
        c.restore(&ns, &hs, &mut [out.as_mut_slice()])
            .expect("then works"),
        1
    );

    let plain = ManagerProc::start(&[]);
    let e = plain.client().inject_faults(1, 0).expect_err("disabled");
    assert!(matches!(
        e,
        ClientError::Server {
            code: ErrorCode::FaultInjectionDisabled,
            ..
        }
    ));
}

#[test]
fn second_manager_on_a_live_socket_is_refused_and_metrics_are_served() {
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("x.sock");
    let mut first = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .args([
            "--socket",
            sock.to_str().expect("utf8"),
            "--metrics-addr",
            "127.0.0.1:0",
            "--dram-size",
            "4MiB",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    eventually("first manager up", || UnixStream::connect(&sock).is_ok());
    let out = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .args(["--socket", sock.to_str().expect("utf8"), "--metrics-addr", "off"])
        .output()
        .expect("run second");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serving"));

    let c = Client::connect(&sock, None, Duration::from_secs(5)).expect("connect");
    let st: serde_json::Value = serde_json::from_str(&c.stats_json().expect("stats")).expect("json");
    let addr = st["metrics_addr"].as_str().expect("metrics on").to_string();
    let mut http = std::net::TcpStream::connect(&addr).expect("metrics connect");
    http.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("write");
    let mut body = String::new();
    http.read_to_string(&mut body).expect("read");
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    assert!(body.contains("# TYPE orbitkv_lookups_total counter"));
    assert!(body.contains("orbitkv_dram_capacity_bytes 4194304"));
    for name in [
        "lookup",
        "acquire",
        "begin_save",
        "commit_save",
        "remote_fill",
        "peer_fill",
        "ssd_read",
        "ssd_write",
    ] {
        assert!(
            body.contains(&format!("# TYPE orbitkv_{name}_seconds histogram")),
            "{body}"
        );
        assert!(
            body.contains(&format!("orbitkv_{name}_seconds_bucket{{le=\"+Inf\"}}")),
            "{body}"
        );
    }
    c.close().expect("close");

    // SIGTERM stops it and removes the socket file.
    let _ = Command::new("kill").arg(first.id().to_string()).status();
    let status = first.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "socket removed on shutdown");
}

#[test]
fn close_waits_for_copies_in_flight() {
    let m = ManagerProc::start(&["--dram-size", "96MiB", "--segment-size", "32MiB"]);
    let c = std::sync::Arc::new(m.client());
    const BIG: usize = 1 << 20;
    let ns = c
        .register_namespace([10; 32], BIG as u64, 0, [0; 32])
        .expect("ns");
    let hs: Vec<[u8; 32]> = (0..64).map(|i| hash(10, i)).collect();
    let data: Vec<Vec<u8>> = (0..64).map(|i| block(i, BIG)).collect();
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    assert_eq!(c.save(&ns, &hs, &src).expect("save").stored, 64);
    // The reader reports each byte-exact restore; close is issued only after the
    // first one (a slow machine may need longer than any fixed sleep), while the
    // reader keeps restoring, so close races copies in flight.
    let (first_tx, first_rx) = std::sync::mpsc::channel::<()>();
    let reader = {
        let c = c.clone();
        let (ns, hs, data) = (ns.clone(), hs.clone(), data.clone());
        std::thread::spawn(move || {
            let mut restored = 0;
            loop {
                let mut out = vec![vec![0u8; BIG]; 64];
                let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
                match c.restore(&ns, &hs, &mut dst) {
                    Ok(n) => {
                        assert_eq!(n, 64);
                        assert!(out == data, "a restore that returned Ok must be byte-exact");
                        restored += 1;
                        let _ = first_tx.send(());
                    }
                    // Refused once closing: never a partial copy reported as success.
                    Err(ClientError::Closed | ClientError::Unavailable(_)) => return restored,
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
        })
    };
    first_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the reader completed a first restore");
    std::thread::sleep(Duration::from_millis(20));
    c.close().expect("close drains, then closes");
    let restored = reader.join().expect("reader");
    assert!(restored > 0);
    eventually("close released every hold", || {
        let st = m.stats();
        st["live_leases"] == 0 && st["sessions"] == 1 // the stats client itself
    });
}

#[test]
fn leases_never_acquired_are_released_when_the_connection_drops() {
    let m = ManagerProc::start(&["--dram-size", "4MiB"]);
    let owner = m.client();
    let ns = owner.register_namespace([11; 32], 4096, 0, [0; 32]).expect("ns");
    let hs = [hash(11, 0), hash(11, 1)];
    owner
        .save(&ns, &hs, &[&block(11, 4096), &block(12, 4096)])
        .expect("save");

    // A control-only session: no arena fds, no addresses, so no copy is possible.
    let control = Client::connect_control(m.socket(), None, Duration::from_secs(5)).expect("control");
    assert!(control.is_control_only());
    assert_eq!(control.segments(), owner.segments());
    let cns = control
        .register_namespace([11; 32], 4096, 0, [0; 32])
        .expect("ns");
    let l = control.lookup(&cns, &hs).expect("lookup");
    assert_eq!(l.hit_blocks, 2);
    for e in [
        control.acquire(l.lease).expect_err("acquire refused"),
        control
            .begin_save(&cns, &[hash(11, 9)])
            .expect_err("begin_save refused"),
    ] {
        assert!(
            matches!(&e, ClientError::Server { code: ErrorCode::InvalidArgument, message } if message.contains("control-only")),
            "{e}"
        );
    }
    assert!(matches!(
        control.restore(&cns, &hs, &mut [&mut [0u8; 4096][..]]),
        Err(ClientError::Invalid(_))
    ));
    assert_eq!(m.stats()["dram_pinned_blocks"], 2);
    // Its connection drops while this process lives: released at once, not quarantined.
    control.abandon();
    eventually("control session's pins released", || {
        let st = m.stats();
        st["dram_pinned_blocks"] == 0 && st["live_leases"] == 0
    });
    assert_eq!(m.stats()["quarantined_sessions"], 0);

    // The same holds for a mapped session whose lease was never acquired.
    let mapped = m.client();
    let mns = mapped.register_namespace([11; 32], 4096, 0, [0; 32]).expect("ns");
    assert_eq!(mapped.lookup(&mns, &hs).expect("lookup").hit_blocks, 2);
    mapped.abandon();
    eventually("granted-only lease released", || m.stats()["live_leases"] == 0);
    assert_eq!(m.stats()["quarantined_sessions"], 0);
    assert_eq!(owner.lookup(&ns, &hs).expect("still visible").hit_blocks, 2);
}

#[test]
fn connections_over_the_limit_are_refused_busy_without_a_thread() {
    let m = ManagerProc::start(&["--dram-size", "4MiB", "--max-connections", "2"]);
    // The readiness probe's connection holds a place until its session thread sees
    // EOF: take the first place once it is free, then wait until only ours is held.
    let mut first = None;
    eventually("the first place is free", || {
        first = Client::connect(m.socket(), None, Duration::from_secs(5)).ok();
        first.is_some()
    });
    let a = first.expect("connected");
    eventually("only this test's connection is held", || {
        let st: serde_json::Value = serde_json::from_str(&a.stats_json().expect("stats")).expect("json");
        st["connections"].as_u64() == Some(1)
    });
    let b = m.client();
    let e = Client::connect(m.socket(), None, Duration::from_secs(5)).expect_err("third refused");
    assert!(
        matches!(&e, ClientError::Server { code: ErrorCode::Busy, message } if message.contains("--max-connections")),
        "{e}"
    );
    let st: serde_json::Value = serde_json::from_str(&a.stats_json().expect("stats")).expect("json");
    assert_eq!(
        (
            st["connections"].as_u64(),
            st["connections_refused_total"].as_u64()
        ),
        (Some(2), Some(1))
    );
    // A closed connection frees its place.
    b.close().expect("close");
    drop(b);
    eventually("a place is free again", || {
        Client::connect(m.socket(), None, Duration::from_secs(5)).is_ok()
    });
}

#[test]
fn ssd_histograms_count_spill_batches_and_a_restores_staging_reads() {
    let ssd = tempfile::tempdir().expect("ssd dir");
    let flags = [
        "--ssd-dir",
        ssd.path().to_str().expect("utf8"),
        "--ssd-capacity",
        "64MiB",
        "--ssd-write-policy",
        "eager",
    ];
    let hs: Vec<[u8; 32]> = (0..8).map(|i| hash(12, i)).collect();
    let data: Vec<Vec<u8>> = (0..8).map(|i| block(i + 40, 4096)).collect();
    {
        let mut m = ManagerProc::start(&flags);
        save_blocks(&m, [12; 32], 4096, &hs, &data);
        eventually("every block spilled", || m.stats()["ssd_blocks"] == 8);
        let lat = &m.stats()["latency_us"];
        let batches = lat["ssd_write"]["count"].as_u64().expect("count");
        assert!((1..=8).contains(&batches), "spill batches timed: {lat}");
        assert_eq!(lat["ssd_read"]["count"], 0, "{lat}");
        let _ = Command::new("kill").arg(m.child.id().to_string()).status();
        let _ = m.child.wait();
    }
    // Restarted on the same directory: the blocks are on SSD only, so the
    // restore's acquire stages them with one batch of reads.
    let m = ManagerProc::start(&flags);
    assert_eq!(m.stats()["dram_visible_blocks"], 0);
    let (hit, got) = restore_blocks(&m, [12; 32], 4096, &hs);
    assert_eq!((hit, got), (8, data), "staged byte-exact");
    let lat = &m.stats()["latency_us"];
    assert_eq!(
        lat["ssd_read"]["count"], 1,
        "one acquire, one batch of reads: {lat}"
    );
    assert_eq!(lat["acquire"]["count"], 1, "{lat}");
}

#[test]
fn latency_histograms_count_every_timed_request() {
    let m = ManagerProc::start(&[]);
    let c = m.client();
    let ns = c.register_namespace([11; 32], 4096, 0, [0; 32]).expect("ns");
    let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(11, i)).collect();
    let data: Vec<Vec<u8>> = (0..4).map(|i| block(i, 4096)).collect();
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    assert_eq!(c.save(&ns, &hs, &src).expect("save").stored, 4);
    for _ in 0..5 {
        let hit = c.lookup(&ns, &hs).expect("lookup");
        assert_eq!(hit.hit_blocks, 4);
        c.acquire(hit.lease).expect("acquire");
        c.release(hit.lease).expect("release");
    }
    let st = m.stats();
    let lat = &st["latency_us"];
    assert_eq!(lat["lookup"]["count"], 5, "{lat}");
    assert_eq!(lat["acquire"]["count"], 5, "{lat}");
    assert_eq!(lat["begin_save"]["count"], 1, "{lat}");
    assert_eq!(lat["commit_save"]["count"], 1, "{lat}");
    for below in ["remote_fill", "peer_fill", "ssd_read", "ssd_write"] {
        assert_eq!(lat[below]["count"], 0, "no tier below DRAM: {lat}");
        assert!(lat[below]["p99_le"].is_null(), "{lat}");
    }
    let p50 = lat["lookup"]["p50_le"].as_u64().expect("p50");
    let p99 = lat["lookup"]["p99_le"].as_u64().expect("p99");
    assert!(p50 >= 1 && p50 <= p99, "{lat}");
    assert!(lat["lookup"]["mean"].as_f64().expect("mean") > 0.0, "{lat}");
}
