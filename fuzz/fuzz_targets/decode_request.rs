//! Everything the Manager decodes from a client: any kind, any body.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let kind = u16::from_le_bytes([data[0], data[1]]);
    if let Ok(req) = orbitkv_proto::decode_request(kind, &data[2..]) {
        // A decoded request re-encodes to exactly the bytes it came from.
        assert_eq!(req.encode(), &data[2..]);
    }
});
