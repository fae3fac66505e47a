//! A byte stream as it arrives on the socket: headers, bodies, truncation.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut cur = std::io::Cursor::new(data);
    for _ in 0..64 {
        match orbitkv_proto::read_frame(&mut cur) {
            Ok((h, body)) => {
                let _ = orbitkv_proto::decode_request(h.kind, &body);
                let _ = orbitkv_proto::decode_response(h.kind, &body);
            }
            Err(_) => break,
        }
    }
});
