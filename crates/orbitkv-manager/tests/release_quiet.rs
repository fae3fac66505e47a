//! `ReleaseQuiet` (issue 10): releases with no reply. They are ordered with the
//! session's other requests, counted, never answered (not even a failure), and
//! a malformed one closes the connection rather than break the reply order.

mod support;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use orbitkv_client::{Client, ClientError};
use orbitkv_proto::{Kind, Request, Response, decode_response, read_frame, write_frame};
use support::*;

const BB: usize = 4096;

/// Stats through `c` itself: its requests are answered in order, so this sees
/// every quiet release `c` sent before.
fn stats(c: &Client) -> serde_json::Value {
    serde_json::from_str(&c.stats_json().expect("stats")).expect("json")
}

#[test]
fn quiet_releases_are_ordered_counted_and_never_answered() {
    quiet_releases(&[]);
}

/// The same with session threads that poll before they sleep: the spin
/// changes when a thread sleeps, never what it answers or in which order.
#[test]
fn quiet_releases_with_spinning_sessions() {
    quiet_releases(&["--session-spin-us", "200"]);
}

/// A namespace of `c` (fingerprint `seed`) holding a saved chain of 4 blocks: (namespace, hashes).
fn saved_chain(c: &Client, seed: u8) -> (orbitkv_client::Namespace, Vec<[u8; 32]>) {
    let ns = c.register_namespace([seed; 32], BB as u64, 0, b"").expect("ns");
    let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(seed, i)).collect();
    let data: Vec<Vec<u8>> = (0..4).map(|i| block(i, BB)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    assert_eq!(c.save(&ns, &hs, &refs).expect("save").stored, 4);
    (ns, hs)
}

fn quiet_releases(flags: &[&str]) {
    let m = ManagerProc::start(flags);
    let c = m.client();
    let (ns, hs) = saved_chain(&c, 7);

    let leases: Vec<u64> = (0..3)
        .map(|_| c.lookup(&ns, &hs).expect("lookup").lease)
        .collect();
    assert!(leases.iter().all(|&l| l != 0));
    assert_eq!(stats(&c)["live_leases"], 3);
    c.release_quiet(&leases[..1]).expect("one");
    c.release_quiet(&leases[1..]).expect("two in one message");
    let st = stats(&c);
    assert_eq!(st["live_leases"], 0, "released before the next request ran");
    assert_eq!(st["quiet_releases_total"], 3);
    assert_eq!(st["quiet_release_failures_total"], 0);

    // Already released, and never issued: counted, not answered; the session
    // carries on (the next call gets its own reply, not an error for these).
    c.release_quiet(&[leases[0], 999_999]).expect("sent");
    let hit = c.lookup(&ns, &hs).expect("the session is intact");
    assert_eq!(hit.hit_blocks, 4);
    let st = stats(&c);
    assert_eq!(st["quiet_release_failures_total"], 2);
    assert_eq!(st["live_leases"], 1);

    c.release_quiet(&[hit.lease]).expect("sent");
    assert_eq!(stats(&c)["live_leases"], 0);

    // Another session's lease is not released by a quiet release either.
    let other = m.client();
    let ons = other.register_namespace([7; 32], BB as u64, 0, b"").expect("ns");
    let theirs = other.lookup(&ons, &hs).expect("lookup").lease;
    c.release_quiet(&[theirs]).expect("sent");
    let st = stats(&c);
    assert_eq!(st["quiet_release_failures_total"], 3);
    assert_eq!(st["live_leases"], 1, "the other session's lease stands");
    other.release(theirs).expect("its owner releases it");

    // Argument errors are the caller's, before anything is sent.
    assert!(c.release_quiet(&[]).is_ok());
    let many = vec![1u64; orbitkv_proto::MAX_QUIET_RELEASES + 1];
    assert!(matches!(c.release_quiet(&many), Err(ClientError::Invalid(_))));
    assert_eq!(c.lookup(&ns, &hs).expect("still usable").hit_blocks, 4);
}

#[test]
fn a_malformed_quiet_release_closes_the_connection() {
    let m = ManagerProc::start(&[]);
    let mut s = UnixStream::connect(m.socket()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let hello = Request::Hello {
        pid: std::process::id(),
        flags: orbitkv_proto::HELLO_CONTROL_ONLY,
        token: Vec::new(),
    };
    write_frame(&mut s, hello.kind() as u16, 1, &hello.encode()).expect("write");
    let (h, body) = read_frame(&mut s).expect("hello reply");
    assert!(matches!(
        decode_response(h.kind, &body),
        Ok(Response::HelloOk { .. })
    ));

    // A well-formed quiet release (of a lease this session does not have) gets
    // no reply: the next reply on the wire is the Stats request's.
    let quiet = Request::ReleaseQuiet { leases: vec![42] };
    write_frame(&mut s, quiet.kind() as u16, 2, &quiet.encode()).expect("write");
    write_frame(&mut s, Request::Stats.kind() as u16, 3, &[]).expect("write");
    let (h, body) = read_frame(&mut s).expect("stats reply");
    assert_eq!(h.request_id, 3);
    assert!(matches!(
        decode_response(h.kind, &body),
        Ok(Response::StatsOk { .. })
    ));

    // Zero leases: framing is lost for a request with no reply, so the Manager
    // answers BadFrame once and closes.
    write_frame(&mut s, Kind::ReleaseQuiet as u16, 4, &0u32.to_le_bytes()).expect("write");
    let (h, body) = read_frame(&mut s).expect("error reply");
    assert_eq!(h.request_id, 4);
    match decode_response(h.kind, &body) {
        Ok(Response::Error { code, message }) => {
            assert_eq!(code, orbitkv_proto::ErrorCode::BadFrame as u16);
            assert!(message.contains("ReleaseQuiet"), "{message}");
        }
        r => panic!("expected an error, got {r:?}"),
    }
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("closed by the Manager");
    assert!(rest.is_empty());
    eventually("the malformed frame counted", || {
        m.stats()["bad_frames_total"] == 1
    });
}

/// A redeemed TP part ends through the exclusive path (its TP lease counts
/// the part done): a quiet release takes it like an acknowledged one.
#[test]
fn a_quiet_release_ends_a_redeemed_tp_part() {
    let m = ManagerProc::start(&["--enable-query-control"]);
    let hs: Vec<[u8; 32]> = (0..3).map(|i| hash(9, i)).collect();
    let mut ranks = Vec::new();
    for r in 0..2u32 {
        let c = m.client();
        let ns = c.register_namespace([9; 32], BB as u64, r, b"").expect("ns");
        let data: Vec<Vec<u8>> = (0..3).map(|i| block(i + 10 * r as u8, BB)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        assert_eq!(c.save(&ns, &hs, &refs).expect("save").stored, 3);
        ranks.push((c, ns));
    }
    let owner = m.client();
    let shards: Vec<_> = (0..2u32)
        .map(|r| owner.register_namespace([9; 32], BB as u64, r, b"").expect("ns"))
        .collect();
    let tp = owner.lookup_tp(&shards, &hs).expect("lookup_tp");
    assert_eq!(tp.hit_blocks, 3);
    let token = tp.token.expect("pinned");
    for (c, ns) in &ranks {
        let part = c.redeem_tp(token, ns).expect("redeem");
        c.release_quiet(&[part.lease]).expect("sent");
        assert_eq!(stats(c)["quiet_release_failures_total"], 0);
    }
    let st = stats(&owner);
    assert_eq!(st["live_leases"], 0);
    assert_eq!(st["quiet_releases_total"], 2);
    assert!(
        !owner.release_tp(token).expect("release_tp"),
        "every rank reported: it had ended"
    );
}

/// Deferred releases (`Client::release_later`, Python's `release_later`):
/// they ride in front of the session's next
/// request, in order, and the flusher sends them after the delay when no
/// request comes, so another session sees them released soon either way.
#[test]
fn deferred_releases_ride_the_next_request_or_are_flushed() {
    let m = ManagerProc::start(&[]);
    let c = m.client();
    let watcher = m.client();
    let (ns, hs) = saved_chain(&c, 9);

    // Carried by the next request: the stats call sees every one released.
    let leases: Vec<u64> = (0..5)
        .map(|_| c.lookup(&ns, &hs).expect("lookup").lease)
        .collect();
    for l in &leases {
        c.release_later(&[*l]).expect("queued");
    }
    let st = stats(&c);
    assert_eq!(st["live_leases"], 0, "carried in front of the stats request");
    assert_eq!(st["quiet_releases_total"], 5);

    // Nothing else sent on `c`: the flusher sends it after the delay (200 µs
    // by default); another session sees it released well within a second.
    let hit = c.lookup(&ns, &hs).expect("lookup");
    c.release_later(&[hit.lease]).expect("queued");
    let t0 = std::time::Instant::now();
    loop {
        let st: serde_json::Value =
            serde_json::from_str(&watcher.stats_json().expect("stats")).expect("json");
        if st["live_leases"] == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the flusher never sent the release: {st}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }

    // Idle (the flusher parked), then more: sent again without a request.
    std::thread::sleep(Duration::from_millis(20));
    let hit = c.lookup(&ns, &hs).expect("lookup");
    c.release_later(&[hit.lease]).expect("queued");
    let t0 = std::time::Instant::now();
    while serde_json::from_str::<serde_json::Value>(&watcher.stats_json().expect("stats")).expect("json")["live_leases"]
        != 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "a parked flusher never woke"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(stats(&c)["quiet_release_failures_total"], 0);

    // More queued than one message carries: split into several, all applied.
    let n = orbitkv_proto::MAX_QUIET_RELEASES + 100;
    let leases: Vec<u64> = (0..n)
        .map(|_| c.lookup(&ns, &hs).expect("lookup").lease)
        .collect();
    for chunk in leases.chunks(1000) {
        c.release_later(chunk).expect("queued");
    }
    let st = stats(&c);
    assert_eq!(st["live_leases"], 0);
    assert_eq!(st["quiet_release_failures_total"], 0);

    // Argument errors are the caller's; a closed client refuses.
    assert!(c.release_later(&[]).is_ok());
    let many = vec![1u64; orbitkv_proto::MAX_QUIET_RELEASES + 1];
    assert!(matches!(c.release_later(&many), Err(ClientError::Invalid(_))));
    c.close().expect("close");
    assert!(matches!(c.release_later(&[1]), Err(ClientError::Closed)));
}
