//! Everything a Manager decodes from a peer Manager (either direction): any kind, any body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbitkv_proto::peer::{decode_peer_request, decode_peer_response};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let kind = u16::from_le_bytes([data[0], data[1]]);
    if let Ok(req) = decode_peer_request(kind, &data[2..]) {
        assert_eq!(req.encode(), &data[2..]);
    }
    if let Ok(resp) = decode_peer_response(kind, &data[2..]) {
        assert_eq!(resp.encode(), &data[2..]);
    }
});
