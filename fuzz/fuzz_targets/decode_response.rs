//! Everything a client decodes from the Manager.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let kind = u16::from_le_bytes([data[0], data[1]]);
    if let Ok(resp) = orbitkv_proto::decode_response(kind, &data[2..]) {
        assert_eq!(resp.encode(), &data[2..]);
    }
});
