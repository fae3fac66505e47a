//! A byte stream as it arrives on the socket: headers, bodies, truncation;
//! then the same stream in small pieces through `read_frame_guarded` with a
//! body budget (the first input byte picks the piece size and budget).
#![no_main]
use std::io::Read;

use libfuzzer_sys::fuzz_target;
use orbitkv_proto::{ErrorCode, FrameError, FrameGuard};

/// The stream delivered in small pieces, as a socket does, with a body budget.
struct Pieces<'a> {
    data: &'a [u8],
    piece: usize,
    budget: usize,
    grown: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

impl FrameGuard for Pieces<'_> {
    fn grow_body(&mut self, bytes: usize) -> Result<(), FrameError> {
        self.grown += bytes;
        if self.grown > self.budget {
            return Err(FrameError::Refused {
                code: ErrorCode::Busy,
                message: "over budget".into(),
            });
        }
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let mut cur = std::io::Cursor::new(rest);
    for _ in 0..64 {
        match orbitkv_proto::read_frame(&mut cur) {
            Ok((h, body)) => {
                let _ = orbitkv_proto::decode_request(h.kind, &body);
                let _ = orbitkv_proto::decode_response(h.kind, &body);
            }
            Err(_) => break,
        }
    }
    // Guarded, in pieces of 1..=16 bytes, with a budget of 0..=1020 KiB: a
    // complete body was asked of the guard exactly once per byte of capacity.
    let mut p = Pieces {
        data: rest,
        piece: usize::from(cfg % 16) + 1,
        budget: usize::from(cfg) << 12,
        grown: 0,
    };
    for _ in 0..64 {
        p.grown = 0;
        match orbitkv_proto::read_frame_guarded(&mut p) {
            Ok((h, body)) => {
                assert_eq!(body.len(), h.len as usize);
                assert_eq!(p.grown, body.len());
                assert!(p.grown <= p.budget);
            }
            Err(_) => break,
        }
    }
});
