//! Round trips for every message and a garbage-input property: the decoders
//! return errors, never panic, on arbitrary bytes.

use orbitkv_proto::*;
use proptest::prelude::*;

fn h(b: u8) -> [u8; 32] {
    [b; 32]
}

#[test]
fn every_request_round_trips() {
    let reqs = vec![
        Request::Hello {
            pid: 42,
            flags: 0,
            token: b"secret".to_vec(),
        },
        Request::Hello {
            pid: 43,
            flags: HELLO_CONTROL_ONLY,
            token: vec![],
        },
        Request::RegisterNamespace {
            fingerprint: h(1),
            shard: 3,
            salt: h(2),
            block_bytes: 65536,
        },
        Request::Lookup {
            ns: 1,
            hashes: vec![h(1), h(2)],
        },
        Request::Acquire { lease: 9 },
        Request::Release { lease: 9 },
        Request::BeginSave {
            ns: 2,
            hashes: vec![h(3)],
        },
        Request::CommitSave { save: 5 },
        Request::AbortSave { save: 6 },
        Request::ResetGeneration { ns: 1 },
        Request::Stats,
        Request::InjectFault {
            restore_failures: 2,
            commit_failures: 1,
        },
        Request::Close,
        Request::LookupTp {
            nss: vec![3, 4, 5, 6],
            hashes: vec![h(1), h(2)],
        },
        Request::LookupTp {
            nss: vec![],
            hashes: vec![],
        },
        Request::RedeemTp {
            token: [0xab; 16],
            ns: 4,
        },
        Request::ReleaseTp { token: [0xcd; 16] },
        Request::ReleaseQuiet { leases: vec![7] },
        Request::ReleaseQuiet {
            leases: vec![1, u64::MAX, 3],
        },
        Request::Trace {
            arm_ms: 5000,
            fingerprint: [3; 32],
            pid: 42,
            cursor: u64::MAX,
        },
        Request::Trace {
            arm_ms: 0,
            fingerprint: [0; 32],
            pid: 0,
            cursor: 0,
        },
        Request::Retain {
            ns: 3,
            hold: orbitkv_proto::RetainHold::Keep { ttl_ms: 120_000 },
            hashes: vec![[1; 32], [2; 32]],
        },
        Request::Retain {
            ns: 0,
            hold: orbitkv_proto::RetainHold::Done,
            hashes: vec![[9; 32]],
        },
        Request::Retain {
            ns: u32::MAX,
            hold: orbitkv_proto::RetainHold::Clear,
            hashes: vec![],
        },
    ];
    for r in reqs {
        assert_eq!(r.expects_reply(), !matches!(r, Request::ReleaseQuiet { .. }));
        let body = r.encode();
        assert_eq!(decode_request(r.kind() as u16, &body).expect("decodes"), r);
        // Every strict prefix of a non-empty body is truncated, never accepted.
        for cut in 0..body.len() {
            assert!(
                decode_request(r.kind() as u16, &body[..cut]).is_err(),
                "{r:?} cut {cut}"
            );
        }
        let mut long = body.clone();
        long.push(0);
        assert_eq!(
            decode_request(r.kind() as u16, &long),
            Err(DecodeError::Trailing(1))
        );
    }
}

#[test]
fn every_response_round_trips() {
    let resps = vec![
        Response::HelloOk {
            session: 1,
            segments: vec![SegmentInfo { id: 0, size: 1 << 28 }],
            presence_slots: 1 << 16,
        },
        Response::ArenaFds { first: 32, count: 32 },
        Response::Namespace {
            ns: 1,
            generation: 2,
            presence_key: [7; 16],
        },
        Response::LookupOk(LookupGrant {
            lease: 3,
            hit_blocks: 4,
            generation: 5,
            ssd_blocks: vec![1, 3],
        }),
        Response::Slots {
            slots: vec![(0, 4096), (1, 0)],
        },
        Response::Ok,
        Response::SaveBegun {
            save: 7,
            items: vec![
                SaveItem::Allocated {
                    segment: 1,
                    offset: 8192,
                },
                SaveItem::Present,
                SaveItem::Refused,
            ],
        },
        Response::Committed { blocks: 3 },
        Response::Generation { generation: 4 },
        Response::StatsOk { json: "{}".into() },
        Response::TraceOk {
            json: r#"{"events":[]}"#.into(),
        },
        Response::Retained {
            applied: 4,
            pending: 2,
            refused: u32::MAX,
        },
        Response::error(ErrorCode::Busy, "busy"),
        Response::TpLeaseOk(TpGrant {
            token: [9; 16],
            hit_blocks: 3,
            generation: 2,
            ssd_blocks: vec![0, 2],
        }),
        Response::TpLeaseOk(TpGrant {
            token: [0; 16],
            hit_blocks: 0,
            generation: 2,
            ssd_blocks: vec![],
        }),
    ];
    for r in resps {
        let body = r.encode();
        assert_eq!(decode_response(r.kind() as u16, &body).expect("decodes"), r);
    }
}

#[test]
fn arena_fd_batches_are_bounded() {
    let fds = |first: u32, count: u32| {
        decode_response(
            Kind::ArenaFds as u16,
            &Response::ArenaFds { first, count }.encode(),
        )
    };
    assert!(fds(0, orbitkv_proto::FD_BATCH as u32).is_ok());
    assert!(fds(0, 0).is_err(), "an empty batch");
    assert!(
        fds(0, orbitkv_proto::FD_BATCH as u32 + 1).is_err(),
        "more fds than one batch may carry"
    );
    let last = (orbitkv_proto::MAX_SEGMENTS - 1) as u32;
    assert!(fds(last, 1).is_ok());
    assert!(fds(last, 2).is_err(), "segments past MAX_SEGMENTS");
    assert!(fds(u32::MAX, 32).is_err(), "no overflow");
}

#[test]
fn lookup_ssd_indices_must_be_ascending_and_inside_the_hit() {
    let reply = |hit_blocks: u32, ssd_blocks: Vec<u32>| {
        Response::LookupOk(LookupGrant {
            lease: 9,
            hit_blocks,
            generation: 1,
            ssd_blocks,
        })
        .encode()
    };
    let ok = reply(3, vec![0, 2]);
    assert!(decode_response(Kind::LookupOk as u16, &ok).is_ok());
    for (hit, bad) in [(3, vec![3]), (3, vec![1, 1]), (3, vec![2, 0]), (0, vec![0])] {
        assert!(
            matches!(
                decode_response(Kind::LookupOk as u16, &reply(hit, bad.clone())),
                Err(DecodeError::Invalid {
                    field: "ssd block",
                    ..
                })
            ),
            "{hit} {bad:?}"
        );
    }
}

#[test]
fn lying_count_is_rejected_without_allocating() {
    let mut body = 1u32.to_le_bytes().to_vec();
    body.extend_from_slice(&(MAX_HASHES as u32).to_le_bytes());
    assert!(matches!(
        decode_request(Kind::Lookup as u16, &body),
        Err(DecodeError::Truncated { .. })
    ));
    let mut body = 1u32.to_le_bytes().to_vec();
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode_request(Kind::Lookup as u16, &body),
        Err(DecodeError::TooMany { .. })
    ));
}

#[test]
fn tp_messages_are_bounded_and_canonical() {
    // More shards than a TP lookup may declare: refused before allocating.
    let body = ((MAX_TP_SHARDS + 1) as u32).to_le_bytes().to_vec();
    assert!(matches!(
        decode_request(Kind::LookupTp as u16, &body),
        Err(DecodeError::TooMany { .. })
    ));
    // A shard count the body cannot hold is truncated, not allocated.
    let body = (MAX_TP_SHARDS as u32).to_le_bytes().to_vec();
    assert!(matches!(
        decode_request(Kind::LookupTp as u16, &body),
        Err(DecodeError::Truncated { .. })
    ));
    // A hit without a token, or a token without a hit, is not a valid reply.
    for (token, hit) in [([0u8; 16], 2u32), ([1u8; 16], 0u32)] {
        let mut body = token.to_vec();
        body.extend_from_slice(&hit.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            decode_response(Kind::TpLeaseOk as u16, &body),
            Err(DecodeError::Invalid { .. })
        ));
    }
    // SSD indices past the hit or out of order are not canonical.
    for ssd in [[3u32, 0], [1, 0]] {
        let mut body = [9u8; 16].to_vec();
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        for i in ssd {
            body.extend_from_slice(&i.to_le_bytes());
        }
        assert!(matches!(
            decode_response(Kind::TpLeaseOk as u16, &body),
            Err(DecodeError::Invalid { .. })
        ));
    }
    // A short token is truncated.
    assert!(matches!(
        decode_request(Kind::ReleaseTp as u16, &[0u8; 15]),
        Err(DecodeError::Truncated { .. })
    ));
    // A quiet release names 1 to MAX_QUIET_RELEASES leases.
    assert!(matches!(
        decode_request(Kind::ReleaseQuiet as u16, &0u32.to_le_bytes()),
        Err(DecodeError::Invalid { field: "leases", .. })
    ));
    let mut over = ((MAX_QUIET_RELEASES + 1) as u32).to_le_bytes().to_vec();
    over.resize(4 + 8 * (MAX_QUIET_RELEASES + 1), 0);
    assert!(matches!(
        decode_request(Kind::ReleaseQuiet as u16, &over),
        Err(DecodeError::TooMany { .. })
    ));
}

#[test]
fn header_checks() {
    let hdr = Header {
        version: PROTOCOL_VERSION,
        kind: 3,
        len: 10,
        request_id: 7,
    };
    assert_eq!(Header::decode(&hdr.encode()).expect("valid"), hdr);
    let mut bad = hdr.encode();
    bad[0] = b'X';
    assert!(matches!(Header::decode(&bad), Err(FrameError::BadMagic(_))));
    for other in [PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1] {
        let frame = Header {
            version: other,
            ..hdr
        }
        .encode();
        let err = Header::decode(&frame).expect_err("another version");
        assert!(matches!(err, FrameError::Version(v) if v == other));
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("protocol version {other} not supported"))
                && msg.contains(&format!("speaks {PROTOCOL_VERSION}")),
            "{msg}"
        );
    }
    let big = Header {
        len: MAX_BODY as u32 + 1,
        ..hdr
    }
    .encode();
    assert!(matches!(Header::decode(&big), Err(FrameError::TooLarge(_))));
}

#[test]
fn frame_io_round_trip() {
    let mut buf = Vec::new();
    write_frame(&mut buf, Kind::Stats as u16, 11, &[]).expect("write");
    write_frame(
        &mut buf,
        Kind::Release as u16,
        12,
        &Request::Release { lease: 1 }.encode(),
    )
    .expect("write");
    let mut cur = std::io::Cursor::new(buf);
    let (h1, b1) = read_frame(&mut cur).expect("frame 1");
    assert_eq!((h1.kind, h1.request_id, b1.len()), (Kind::Stats as u16, 11, 0));
    let (h2, b2) = read_frame(&mut cur).expect("frame 2");
    assert_eq!(
        decode_request(h2.kind, &b2).expect("req"),
        Request::Release { lease: 1 }
    );
    assert!(matches!(read_frame(&mut cur), Err(FrameError::Closed)));
}

/// A byte source with `FrameGuard` hooks that records what the reader asked for.
struct Recording<'a> {
    data: &'a [u8],
    /// Bytes handed out per read (a socket delivers frames in pieces).
    piece: usize,
    consumed: usize,
    started: usize,
    grown: Vec<usize>,
    refuse_header: bool,
    budget: Option<usize>,
}

impl<'a> Recording<'a> {
    fn new(data: &'a [u8], piece: usize) -> Self {
        Recording {
            data,
            piece,
            consumed: 0,
            started: 0,
            grown: Vec::new(),
            refuse_header: false,
            budget: None,
        }
    }
}

impl std::io::Read for Recording<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.data.len() - self.consumed);
        buf[..n].copy_from_slice(&self.data[self.consumed..self.consumed + n]);
        self.consumed += n;
        Ok(n)
    }
}

impl FrameGuard for Recording<'_> {
    fn frame_started(&mut self) {
        self.started += 1;
    }
    fn check_header(&mut self, _h: &Header) -> Result<(), FrameError> {
        if self.refuse_header {
            return Err(FrameError::Refused {
                code: ErrorCode::BadFrame,
                message: "no".into(),
            });
        }
        Ok(())
    }
    fn grow_body(&mut self, bytes: usize) -> Result<(), FrameError> {
        let total = self.grown.iter().sum::<usize>() + bytes;
        if self.budget.is_some_and(|b| total > b) {
            return Err(FrameError::Refused {
                code: ErrorCode::Busy,
                message: "over budget".into(),
            });
        }
        self.grown.push(bytes);
        Ok(())
    }
}

fn header(len: u32) -> Vec<u8> {
    Header {
        version: PROTOCOL_VERSION,
        kind: Kind::Lookup as u16,
        len,
        request_id: 7,
    }
    .encode()
    .to_vec()
}

/// A peer that announces the largest body and sends 100 bytes of it costs one
/// first chunk of buffer, not the announced length.
#[test]
fn body_buffer_grows_with_arrival_not_with_the_announcement() {
    let mut data = header(MAX_BODY as u32);
    data.extend_from_slice(&[1; 100]);
    let mut src = Recording::new(&data, 1 << 20);
    let e = read_frame_guarded(&mut src).expect_err("truncated");
    assert!(
        matches!(&e, FrameError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof),
        "{e}"
    );
    assert_eq!(src.grown, vec![FIRST_BODY_CHUNK]);
    assert_eq!(src.started, 1);
}

/// A complete frame arriving in pieces: the body is exact, the buffer's
/// capacity never exceeds twice what had arrived (or the first chunk), and
/// the total asked of the guard is the body length.
#[test]
fn body_growth_is_geometric_and_exact_in_total() {
    let len = 3 * FIRST_BODY_CHUNK + 123;
    let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut data = header(len as u32);
    data.extend_from_slice(&body);
    data.extend_from_slice(&header(0)); // a second, empty frame
    let mut src = Recording::new(&data, 10_000);
    let (h, got) = read_frame_guarded(&mut src).expect("frame");
    assert_eq!((h.len as usize, &got), (len, &body));
    assert_eq!(src.grown.iter().sum::<usize>(), len);
    let mut cap = 0;
    for g in &src.grown {
        // Grown only when full: capacity before this growth had all arrived.
        assert!(cap + g <= (2 * cap).max(FIRST_BODY_CHUNK), "{:?}", src.grown);
        cap += g;
    }
    let (h2, b2) = read_frame_guarded(&mut src).expect("frame 2");
    assert_eq!((h2.len, b2.len()), (0, 0));
    assert_eq!(src.started, 2);
    assert!(matches!(read_frame_guarded(&mut src), Err(FrameError::Closed)));
}

/// Guard refusals stop reading: a refused header buffers none of its body, a
/// refused growth reads nothing more.
#[test]
fn guard_refusals_stop_the_read() {
    let mut data = header(1000);
    data.extend_from_slice(&[0; 1000]);
    let mut src = Recording::new(&data, 1 << 20);
    src.refuse_header = true;
    let e = read_frame_guarded(&mut src).expect_err("refused");
    assert!(matches!(
        e,
        FrameError::Refused {
            code: ErrorCode::BadFrame,
            ..
        }
    ));
    assert_eq!((src.consumed, src.grown.len()), (HEADER_LEN, 0));

    let len = 4 * FIRST_BODY_CHUNK;
    let mut data = header(len as u32);
    data.extend_from_slice(&vec![0; len]);
    let mut src = Recording::new(&data, 1 << 20);
    src.budget = Some(2 * FIRST_BODY_CHUNK);
    let e = read_frame_guarded(&mut src).expect_err("over budget");
    assert!(
        matches!(
            e,
            FrameError::Refused {
                code: ErrorCode::Busy,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(src.consumed, HEADER_LEN + 2 * FIRST_BODY_CHUNK);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn garbage_never_panics(kind in any::<u16>(), body in proptest::collection::vec(any::<u8>(), 0..512)) {
        // Never panics; anything accepted is canonical (re-encodes to the same bytes).
        if let Ok(r) = decode_request(kind, &body) {
            prop_assert_eq!(r.encode(), body.clone());
        }
        if let Ok(r) = decode_response(kind, &body) {
            prop_assert_eq!(r.encode(), body);
        }
    }

    #[test]
    fn peer_garbage_never_panics(kind in 0x0400u16..0x0500, body in proptest::collection::vec(any::<u8>(), 0..512)) {
        // The Manager↔Manager decoders: never panic; anything accepted is canonical.
        if let Ok(r) = orbitkv_proto::peer::decode_peer_request(kind, &body) {
            prop_assert_eq!(r.encode(), body.clone());
        }
        if let Ok(r) = orbitkv_proto::peer::decode_peer_response(kind, &body) {
            prop_assert_eq!(r.encode(), body);
        }
    }

    #[test]
    fn garbage_headers_never_panic(raw in proptest::array::uniform16(any::<u8>())) {
        let _ = Header::decode(&raw);
    }
}

#[test]
fn a_retain_hint_has_one_encoding() {
    use orbitkv_proto::{DecodeError, decode_request};
    let body = |tag: u8, ttl: u32| {
        let mut b = 7u32.to_le_bytes().to_vec();
        b.push(tag);
        b.extend_from_slice(&ttl.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // no hashes
        b
    };
    assert!(decode_request(0x12, &body(1, 0)).is_ok());
    assert!(decode_request(0x12, &body(2, 0)).is_ok());
    for (tag, ttl) in [(2, 5), (3, 1), (0, 0), (4, 0)] {
        let e = decode_request(0x12, &body(tag, ttl)).expect_err("refused");
        assert!(matches!(e, DecodeError::Invalid { .. }), "{tag} {ttl}: {e:?}");
    }
}
