//! What a block's header sector says about its journal record: the verdict shared by the
//! header check at open (`recovery.rs`) and the one after open (`bgverify.rs`).

use std::io;

use crate::format::{BlockHeader, DecodeError, HEADER_SIZE, JournalRecord};
use crate::uring::Done;

/// What a block's header sector says about its journal record.
pub(crate) enum HeaderVerdict {
    Keep,
    Corrupt,
    Torn,
    OtherVersion,
}

pub(crate) fn header_verdict(r: &JournalRecord, h: &[u8], res: io::Result<Done>) -> HeaderVerdict {
    match res {
        Ok(d) if d.bytes == HEADER_SIZE => match BlockHeader::decode(h) {
            Ok(bh)
                if bh.key == r.key
                    && bh.len == r.len
                    && bh.payload_sum == r.payload_sum
                    && bh.seq == r.seq =>
            {
                HeaderVerdict::Keep
            }
            Ok(_) => HeaderVerdict::Corrupt,
            Err(DecodeError::Version(_)) => HeaderVerdict::OtherVersion,
            Err(_) => HeaderVerdict::Corrupt,
        },
        Ok(_) => HeaderVerdict::Torn,
        Err(_) => HeaderVerdict::Corrupt, // unreadable sector: drop the block, keep going
    }
}
