//! The Rust client's API contract (issue 7): exact sizes, argument errors that
//! are not session failures, one salt encoding, RAII leases and saves, and the
//! slot-addressed page copies.

mod support;

use std::os::unix::net::UnixStream;
use std::time::Duration;

use orbitkv_client::{Client, ClientError, PageLayout, PageSpec, SlotCopier, SlotStatus, namespace_salt};
use orbitkv_proto::{Request, Response, decode_response, read_frame, write_frame};
use support::*;

const BB: usize = 4096;

#[test]
fn sizes_must_match_exactly_with_expected_and_actual_named() {
    let m = ManagerProc::start(&[]);
    let c = m.client();
    let ns = c.register_namespace([1; 32], BB as u64, 0, b"").expect("ns");
    let hs = [hash(1, 0), hash(1, 1)];
    let big = vec![0u8; BB + 1];
    let e = c
        .save(&ns, &hs, &[&block(1, BB), &big])
        .expect_err("one byte too many");
    assert!(
        matches!(e, ClientError::Size { expected, actual, .. } if expected == BB as u64 && actual == BB as u64 + 1),
        "{e}"
    );
    let e = c
        .save(&ns, &hs[..1], &[&block(1, BB), &block(2, BB)])
        .expect_err("extra source");
    assert!(
        matches!(
            e,
            ClientError::Size {
                expected: 1,
                actual: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        c.lookup(&ns, &hs).expect("lookup").hit_blocks,
        0,
        "nothing stored"
    );
    c.save(&ns, &hs, &[&block(1, BB), &block(2, BB)]).expect("save");
    let mut out = vec![vec![0u8; BB]; 3];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let e = c
        .restore(&ns, &hs, &mut dst)
        .expect_err("three buffers for two hashes");
    assert!(
        matches!(
            e,
            ClientError::Size {
                expected: 2,
                actual: 3,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(m.stats()["live_leases"], 0, "refused before any lease was taken");
}

#[test]
fn zero_timeout_and_unknown_segment_are_argument_errors() {
    let m = ManagerProc::start(&[]);
    let e = Client::connect(m.socket(), None, Duration::ZERO).expect_err("zero timeout");
    assert!(matches!(e, ClientError::Invalid(_)), "{e}");
    let c = m.client();
    let e = c.segment(999).expect_err("unknown");
    assert!(
        matches!(e, ClientError::UnknownSegment { segment: 999, .. }),
        "{e}"
    );
    c.register_namespace([2; 32], BB as u64, 0, b"")
        .expect("session still usable");
}

/// Register over a raw control-only session with an exact 32-byte wire salt.
fn wire_namespace(m: &ManagerProc, fingerprint: [u8; 32], salt: [u8; 32]) -> u32 {
    let mut s = UnixStream::connect(m.socket()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut call = |id: u32, req: Request| {
        write_frame(&mut s, req.kind() as u16, id, &req.encode()).expect("write");
        let (h, body) = read_frame(&mut s).expect("read");
        decode_response(h.kind, &body).expect("decode")
    };
    let hello = Request::Hello {
        pid: std::process::id(),
        flags: orbitkv_proto::HELLO_CONTROL_ONLY,
        token: Vec::new(),
    };
    assert!(matches!(call(1, hello), Response::HelloOk { .. }));
    let reg = Request::RegisterNamespace {
        fingerprint,
        shard: 0,
        salt,
        block_bytes: BB as u64,
    };
    match call(2, reg) {
        Response::Namespace { ns, .. } => ns,
        r => panic!("unexpected {:?}", r.kind()),
    }
}

#[test]
fn a_salt_lands_in_the_namespace_of_its_one_encoding() {
    let m = ManagerProc::start(&[]);
    let c = m.client();
    let fp = [3; 32];
    let a = c.register_namespace(fp, BB as u64, 0, b"tenant-a").expect("ns");
    assert_eq!(wire_namespace(&m, fp, namespace_salt(b"tenant-a")), a.id);
    let none = c.register_namespace(fp, BB as u64, 0, b"").expect("ns");
    assert_eq!(wire_namespace(&m, fp, [0; 32]), none.id);
    // Any length; salts a length tag or zero padding would confuse stay apart.
    let mut ids = std::collections::HashSet::new();
    for s in [&b"a"[..], b"a\0", &[b'x'; 33], &[0; 32], &[b'y'; 1000]] {
        ids.insert(c.register_namespace(fp, BB as u64, 0, s).expect("ns").id);
    }
    assert_eq!(ids.len(), 5);
    assert!(!ids.contains(&a.id) && !ids.contains(&none.id));
}

#[test]
fn a_dropped_lease_releases_and_a_dropped_save_aborts() {
    let m = ManagerProc::start(&[]);
    let c = m.client();
    let ns = c.register_namespace([4; 32], BB as u64, 0, b"").expect("ns");
    let hs = [hash(4, 0)];
    {
        let save = c.start_save(&ns, &hs).expect("begin");
        assert!(matches!(save.items()[0], SlotStatus::Allocated { .. }));
        // dropped uncommitted: aborted
    }
    assert_eq!(c.lookup(&ns, &hs).expect("lookup").hit_blocks, 0);
    assert_eq!(
        c.save(&ns, &hs, &[&block(4, BB)]).expect("save").stored,
        1,
        "slot was freed"
    );
    {
        let mut lease = c.lease(&ns, &hs).expect("lease");
        assert_eq!(lease.hit_blocks(), 1);
        let mut out = vec![0u8; BB];
        lease
            .copy_out(BB as u64, 0, &mut [out.as_mut_slice()])
            .expect("copy");
        assert_eq!(out, block(4, BB));
        assert_eq!(m.stats()["live_leases"], 1);
    }
    assert_eq!(m.stats()["live_leases"], 0, "drop released it");
    let lease = c.lease(&ns, &hs).expect("lease");
    lease
        .release()
        .expect("explicit release, then no second release on drop");
    assert_eq!(m.stats()["live_leases"], 0);
    let save = c.start_save(&ns, &[hash(4, 1)]).expect("begin");
    assert_eq!(
        save.commit().expect("commit"),
        1,
        "a committed guard does not abort on drop"
    );
    assert_eq!(c.lookup(&ns, &[hash(4, 1)]).expect("lookup").hit_blocks, 1);
}

#[test]
fn page_gather_and_scatter_roundtrip_with_bounds_checks() {
    let m = ManagerProc::start(&[]);
    let c = m.client();
    // Two layers over one 4-block region: a dense 3 KiB page and a strided
    // [2, 4, 128] page (N-major with gaps) that is not one dense run.
    let dense = PageSpec {
        base: 0,
        block_stride: 3072,
        shape: [1, 1, 3, 1024],
        strides: [3072, 3072, 1024, 1],
    };
    let strided = PageSpec {
        base: 4 * 3072,
        block_stride: 2048,
        shape: [1, 2, 4, 128],
        strides: [2048, 128, 512, 1],
    };
    let region = 4 * 3072 + 4 * 2048;
    let layout = PageLayout::new(&[dense, strided], 4, region as u64).expect("layout");
    assert_eq!(layout.block_bytes(), BB as u64);
    let src: Vec<u8> = (0..region).map(|i| (i * 7 % 251) as u8).collect();
    let ns = c.register_namespace([5; 32], BB as u64, 0, b"").expect("ns");
    let hs = [hash(5, 0), hash(5, 1)];
    let save = c.start_save(&ns, &hs).expect("begin");
    let slots: Vec<(u32, u64)> = save
        .items()
        .iter()
        .map(|s| match s {
            SlotStatus::Allocated { segment, offset } => (*segment, *offset),
            other => panic!("{other:?}"),
        })
        .collect();
    let e = c.gather(&layout, &src[..], &[4, 0], &slots).expect_err("block 4");
    assert!(matches!(e, ClientError::Invalid(_)), "{e}");
    let e = c
        .gather(&layout, &src[..region - 1], &[3, 0], &slots)
        .expect_err("short region");
    assert!(matches!(e, ClientError::Size { .. }), "{e}");
    let bad_slot = [(slots[0].0, u64::MAX - 10), slots[1]];
    let e = c
        .gather(&layout, &src[..], &[3, 0], &bad_slot)
        .expect_err("slot past the segment");
    assert!(matches!(e, ClientError::Invalid(_)), "{e}");
    assert_eq!(
        c.gather(&layout, &src[..], &[3, 0], &slots).expect("gather"),
        2 * BB as u64
    );
    assert_eq!(save.commit().expect("commit"), 2);

    // The cached block is the dense page then the strided page in logical order.
    let mut out = vec![vec![0u8; BB]; 2];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    assert_eq!(c.restore(&ns, &hs, &mut dst).expect("restore"), 2);
    assert_eq!(out[0][..3072], src[3 * 3072..4 * 3072]);
    let s0 = 4 * 3072 + 3 * 2048;
    for h in 0..2 {
        for n in 0..4 {
            let at = s0 + h * 128 + n * 512;
            let o = 3072 + (h * 4 + n) * 128;
            assert_eq!(out[0][o..o + 128], src[at..at + 128], "h={h} n={n}");
        }
    }

    // Scatter back into blocks 1 and 2 of a zeroed region.
    let mut back = vec![0u8; region];
    let mut lease = c.lease(&ns, &hs).expect("lease");
    let slots = lease.acquire().expect("acquire").to_vec();
    c.scatter(&layout, &slots, &mut back[..], &[1, 2])
        .expect("scatter");
    lease.release().expect("release");
    for (from, to) in [(3usize, 1usize), (0, 2)] {
        assert_eq!(
            back[to * 3072..(to + 1) * 3072],
            src[from * 3072..(from + 1) * 3072]
        );
        let (f, t) = (4 * 3072 + from * 2048, 4 * 3072 + to * 2048);
        for h in 0..2 {
            for n in 0..4 {
                let (a, b) = (f + h * 128 + n * 512, t + h * 128 + n * 512);
                assert_eq!(back[b..b + 128], src[a..a + 128]);
            }
        }
    }
    let touched: usize = back.iter().filter(|b| **b != 0).count();
    let expected: usize = [3usize, 0]
        .iter()
        .map(|b| {
            let mut n = src[b * 3072..(b + 1) * 3072].iter().filter(|x| **x != 0).count();
            let f = 4 * 3072 + b * 2048;
            for h in 0..2 {
                for k in 0..4 {
                    let a = f + h * 128 + k * 512;
                    n += src[a..a + 128].iter().filter(|x| **x != 0).count();
                }
            }
            n
        })
        .sum();
    assert_eq!(
        touched, expected,
        "nothing outside the two blocks' pages was written"
    );
}
