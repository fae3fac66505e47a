//! Connection-level limits of a real Manager process: memory held for
//! incomplete frames, the absolute Hello deadline, the per-frame deadline.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use orbitkv_proto::{
    ErrorCode, Header, Kind, PROTOCOL_VERSION, Request, Response, decode_response, read_frame, write_frame,
};
use support::*;

const STALLED: usize = 200;
const ANNOUNCED: u32 = 4 << 20;
const MIB: u64 = 1 << 20;

/// Resident set of a process, from /proc/<pid>/status.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line");
    kib << 10
}

fn connect(m: &ManagerProc) -> UnixStream {
    let s = UnixStream::connect(m.socket()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s
}

fn hello(s: &mut UnixStream) {
    let hello = Request::Hello {
        pid: std::process::id(),
        flags: 0,
        token: vec![],
    };
    write_frame(s, Kind::Hello as u16, 1, &hello.encode()).expect("hello");
    read_hello(s);
}

/// Announce a 4 MiB body and send all of it but the last byte. The Manager
/// may refuse (and close) early, so write errors are expected and ignored.
fn announce_and_stall(s: &mut UnixStream, kind: Kind, id: u32) {
    let hdr = Header {
        version: PROTOCOL_VERSION,
        kind: kind as u16,
        len: ANNOUNCED,
        request_id: id,
    }
    .encode();
    if s.write_all(&hdr).is_err() {
        return;
    }
    let chunk = vec![0x5a_u8; 256 << 10];
    let mut left = ANNOUNCED as usize - 1;
    while left > 0 {
        let n = left.min(chunk.len());
        if s.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n;
    }
}

/// The error this connection was answered with before being closed, if any.
fn closing_error(s: &mut UnixStream) -> Option<(u16, String)> {
    let (h, body) = read_frame(s).ok()?;
    match decode_response(h.kind, &body).ok()? {
        Response::Error { code, message } => Some((code, message)),
        _ => None,
    }
}

fn stat(m: &ManagerProc, name: &str) -> u64 {
    m.stats()[name]
        .as_u64()
        .unwrap_or_else(|| panic!("stat {name} missing"))
}

/// A normal client still gets byte-exact service.
fn still_serves(m: &ManagerProc, seed: u8) {
    let c = m.client();
    let ns = c.register_namespace([7; 32], 4096, 0, [0; 32]).expect("ns");
    let hs = [hash(7, seed)];
    let data = block(seed, 4096);
    assert_eq!(c.save(&ns, &hs, &[&data]).expect("save").stored, 1);
    let mut out = vec![0u8; 4096];
    assert_eq!(
        c.restore(&ns, &hs, &mut [out.as_mut_slice()]).expect("restore"),
        1
    );
    assert_eq!(out, data);
    c.close().expect("close");
}

/// Shared body of the two stalled-frame tests: 200 peers each announce a
/// 4 MiB frame and send all but one byte. The Manager's resident memory must
/// stay within its buffering bound (not 200 × 4 MiB), come back down once they
/// close, and a normal client must still be served.
fn stalled_peers_hold_bounded_memory(after_hello: bool) {
    let m = ManagerProc::start(&["--max-buffered-bytes", "16MiB"]);
    let pid = m.child.id();
    still_serves(&m, 1);
    let baseline = rss_bytes(pid);

    let mut peers = Vec::with_capacity(STALLED);
    for i in 0..STALLED {
        let mut s = connect(&m);
        if after_hello {
            hello(&mut s);
        }
        announce_and_stall(
            &mut s,
            if after_hello { Kind::Lookup } else { Kind::Hello },
            i as u32 + 2,
        );
        peers.push(s);
    }
    // Bound: 16 MiB of budget + the first 64 KiB of each frame; allow 64 MiB
    // more for threads, allocator arenas and the peers' socket buffers' slack.
    // Without a bound the Manager holds ~200 × 4 MiB = 800 MiB here.
    let bound = baseline + 16 * MIB + STALLED as u64 * (64 << 10) + 64 * MIB;
    let held = rss_bytes(pid);
    assert!(
        held < bound,
        "Manager RSS {} MiB with {STALLED} stalled 4 MiB frames (baseline {} MiB, bound {} MiB)",
        held / MIB,
        baseline / MIB,
        bound / MIB
    );

    // Refused peers were told why.
    let mut answers = Vec::new();
    for s in peers.iter_mut().take(40).skip(20) {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        answers.push(closing_error(s));
    }
    if after_hello {
        assert!(stat(&m, "frame_buffer_refusals_total") > 0);
        assert!(
            answers
                .iter()
                .flatten()
                .any(|(code, msg)| *code == ErrorCode::Busy as u16 && msg.contains("--max-buffered-bytes")),
            "{answers:?}"
        );
    } else {
        for a in &answers {
            let (code, msg) = a
                .as_ref()
                .expect("a pre-Hello 4 MiB frame is refused at its header");
            assert_eq!(*code, ErrorCode::TooLarge as u16, "{msg}");
            assert!(msg.contains("Hello of"), "{msg}");
        }
    }

    drop(peers);
    eventually("buffer budget returned", || {
        stat(&m, "frame_buffer_bytes") == 0 && stat(&m, "connections") <= 1
    });
    let after = rss_bytes(pid);
    eprintln!(
        "RSS: baseline {} MiB, with stalled peers {} MiB, after they closed {} MiB",
        baseline / MIB,
        held / MIB,
        after / MIB
    );
    assert!(
        after < baseline + 48 * MIB,
        "Manager RSS {} MiB after the stalled peers closed (baseline {} MiB)",
        after / MIB,
        baseline / MIB
    );
    still_serves(&m, 2);
}

#[test]
fn stalled_frames_after_hello_hold_bounded_memory_and_give_it_back() {
    stalled_peers_hold_bounded_memory(true);
}

#[test]
fn stalled_frames_before_hello_hold_bounded_memory_and_give_it_back() {
    stalled_peers_hold_bounded_memory(false);
}

/// A peer dripping its Hello one byte at a time is closed at the (default,
/// 5 s) deadline counted from connecting, not kept alive by each new byte.
#[test]
fn hello_deadline_is_absolute() {
    let m = ManagerProc::start(&[]);
    let hello = Request::Hello {
        pid: std::process::id(),
        flags: 0,
        token: vec![b't'; 40],
    };
    let mut frame = Vec::new();
    write_frame(&mut frame, Kind::Hello as u16, 9, &hello.encode()).expect("encode");
    // 68 bytes at one per 150 ms: ~10 s of dripping, each gap far below 5 s.
    let t0 = Instant::now();
    let mut s = connect(&m);
    let mut w = s.try_clone().expect("clone");
    let drip = std::thread::spawn(move || {
        for b in frame {
            if w.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    let (h, body) = read_frame(&mut s).expect("an answer before the drip ends");
    let elapsed = t0.elapsed();
    match decode_response(h.kind, &body).expect("decodes") {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::BadFrame as u16);
            assert!(message.contains("no complete Hello within 5s"), "{message}");
        }
        other => panic!("a 10 s Hello was accepted after {elapsed:?}: {other:?}"),
    }
    assert!(
        elapsed >= Duration::from_millis(4500) && elapsed < Duration::from_secs(9),
        "closed after {elapsed:?}, deadline 5 s"
    );
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).expect("eof"), 0, "closed");
    drip.join().expect("drip");
    assert_eq!(stat(&m, "hello_timeouts_total"), 1);
    still_serves(&m, 3);
}

/// After the Hello, a frame whose first byte arrived must complete within
/// --frame-timeout-ms; an idle connection between frames has no deadline.
#[test]
fn a_frame_stalled_midway_is_dropped_at_its_deadline_but_idle_sessions_stay() {
    let m = ManagerProc::start(&["--frame-timeout-ms", "1000"]);
    let idle = m.client();
    let mut s = connect(&m);
    hello(&mut s);
    let t0 = Instant::now();
    let hdr = Header {
        version: PROTOCOL_VERSION,
        kind: Kind::Lookup as u16,
        len: 1000,
        request_id: 4,
    }
    .encode();
    s.write_all(&hdr).expect("header");
    s.write_all(&[0; 10]).expect("part of the body");
    let (code, msg) = closing_error(&mut s).expect("an error before closing");
    let elapsed = t0.elapsed();
    assert_eq!(code, ErrorCode::BadFrame as u16);
    assert!(msg.contains("frame incomplete"), "{msg}");
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(6),
        "closed after {elapsed:?}, deadline 1 s"
    );
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).expect("eof"), 0, "closed");
    assert_eq!(stat(&m, "frame_timeouts_total"), 1);
    // The idle session outlived the frame deadline and still works.
    let ns = idle
        .register_namespace([8; 32], 4096, 0, [0; 32])
        .expect("idle session still served");
    assert_eq!(idle.lookup(&ns, &[hash(8, 0)]).expect("lookup").hit_blocks, 0);
}

#[test]
fn a_peer_that_never_reads_its_replies_is_dropped_at_the_frame_deadline() {
    let m = ManagerProc::start(&["--frame-timeout-ms", "1000"]);
    let mut s = connect(&m);
    hello(&mut s);
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    // Pipeline Stats requests (each answered by a few KiB of JSON) without reading a
    // reply, until the Manager stops reading because its replies no longer fit.
    let body = Request::Stats.encode();
    let t0 = Instant::now();
    let mut sent = 0u32;
    while t0.elapsed() < Duration::from_secs(30) {
        match write_frame(&mut s, Kind::Stats as u16, sent + 2, &body) {
            Ok(()) => sent += 1,
            Err(_) => break, // our side is full (or closed): the Manager is blocked writing
        }
    }
    assert!(sent > 0);
    // The session thread is blocked in a reply write; it must give up at the frame
    // deadline and end the session, freeing its connection place.
    eventually("the non-reading session is dropped", || {
        m.stats()["sessions_vanished_total"].as_u64() == Some(1)
    });
    assert_eq!(stat(&m, "connections"), 1, "only the stats connection remains");
    still_serves(&m, 9);
}
