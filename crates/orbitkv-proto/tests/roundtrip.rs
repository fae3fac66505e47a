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
    ];
    for r in reqs {
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
        },
        Response::Namespace { ns: 1, generation: 2 },
        Response::LookupOk {
            lease: 3,
            hit_blocks: 4,
            generation: 5,
        },
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
        Response::error(ErrorCode::Busy, "busy"),
    ];
    for r in resps {
        let body = r.encode();
        assert_eq!(decode_response(r.kind() as u16, &body).expect("decodes"), r);
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
    let v2 = Header { version: 2, ..hdr }.encode();
    assert!(matches!(Header::decode(&v2), Err(FrameError::Version(2))));
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
    fn garbage_headers_never_panic(raw in proptest::array::uniform16(any::<u8>())) {
        let _ = Header::decode(&raw);
    }
}
