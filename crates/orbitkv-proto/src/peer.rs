//! Manager↔Manager messages (the peer tier, contract D3), on the same frame
//! header as the client protocol, with kinds of their own (`0x04xx`): a peer
//! connection that sends a client kind, or a client that sends a peer kind,
//! is refused by the decoder.
//!
//! One fetch on a peer connection:
//!
//! ```text
//! reader                                   source
//!   PeerFetch {ns key, generation, hashes} ─▶  lookup + acquire under a lease
//!                                         ◀─  PeerLeased {lease, blocks, block_bytes}
//!                                         ◀─  blocks × block_bytes raw bytes (no framing)
//!                                         ◀─  PeerSent {xxh3-64 per block}
//!   PeerDone {lease, stored}               ─▶  lease released
//! ```
//!
//! The source keeps the blocks pinned from `PeerLeased` until `PeerDone`, the
//! connection's end, or its own shutdown. `blocks == 0` is a miss (no lease,
//! no bytes, no `PeerSent`).

use crate::codec::{DecodeError, Reader, Writer};
use crate::{HASH_BYTES, MAX_HASHES, MAX_TEXT};

/// Peer message kinds (requests `0x040x`, replies `0x048x`).
pub const PEER_FETCH: u16 = 0x0401;
pub const PEER_DONE: u16 = 0x0402;
pub const PEER_LEASED: u16 = 0x0481;
pub const PEER_SENT: u16 = 0x0482;
pub const PEER_ERROR: u16 = 0x04ff;

/// Largest block a peer transfer carries (a lying source cannot make the
/// reader expect more than its own namespace's block size anyway).
pub const MAX_PEER_BLOCK_BYTES: u64 = 1 << 30;

/// Reader → source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerRequest {
    /// Pin and send the longest contiguous run of `hashes` the source holds
    /// (DRAM or SSD), in the namespace `(fingerprint, shard, salt)` at the
    /// reader's `generation` (another generation is a miss).
    Fetch {
        fingerprint: [u8; 32],
        shard: u32,
        salt: [u8; 32],
        block_bytes: u64,
        generation: u64,
        hashes: Vec<[u8; HASH_BYTES]>,
    },
    /// The reader is done with `lease` (`stored`: it kept the bytes); the
    /// source releases it. A duplicate or unknown lease is ignored.
    Done { lease: u64, stored: bool },
}

/// Source → reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerResponse {
    /// `blocks` blocks of `block_bytes` follow as raw bytes, then `Sent`.
    Leased {
        lease: u64,
        blocks: u32,
        block_bytes: u64,
    },
    /// One xxh3-64 checksum per block just sent.
    Sent { checksums: Vec<u64> },
    /// The request was refused; the source closes the connection.
    Error { message: String },
}

impl PeerRequest {
    pub fn kind(&self) -> u16 {
        match self {
            PeerRequest::Fetch { .. } => PEER_FETCH,
            PeerRequest::Done { .. } => PEER_DONE,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            PeerRequest::Fetch {
                fingerprint,
                shard,
                salt,
                block_bytes,
                generation,
                hashes,
            } => {
                w.raw(fingerprint)
                    .u32(*shard)
                    .raw(salt)
                    .u64(*block_bytes)
                    .u64(*generation);
                w.count(hashes.len());
                for h in hashes {
                    w.raw(h);
                }
            }
            PeerRequest::Done { lease, stored } => {
                w.u64(*lease).u8(u8::from(*stored));
            }
        }
        w.buf
    }
}

impl PeerResponse {
    pub fn kind(&self) -> u16 {
        match self {
            PeerResponse::Leased { .. } => PEER_LEASED,
            PeerResponse::Sent { .. } => PEER_SENT,
            PeerResponse::Error { .. } => PEER_ERROR,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            PeerResponse::Leased {
                lease,
                blocks,
                block_bytes,
            } => {
                w.u64(*lease).u32(*blocks).u64(*block_bytes);
            }
            PeerResponse::Sent { checksums } => {
                w.count(checksums.len());
                for c in checksums {
                    w.u64(*c);
                }
            }
            PeerResponse::Error { message } => {
                w.bytes(message.as_bytes());
            }
        }
        w.buf
    }
}

fn block_bytes(r: &mut Reader<'_>) -> Result<u64, DecodeError> {
    let v = r.u64("block_bytes")?;
    if v == 0 || v > MAX_PEER_BLOCK_BYTES {
        return Err(DecodeError::Invalid {
            field: "block_bytes",
            value: v,
        });
    }
    Ok(v)
}

/// Decode what a reader sent to a source. Never panics; rejects trailing bytes.
pub fn decode_peer_request(kind: u16, body: &[u8]) -> Result<PeerRequest, DecodeError> {
    let mut r = Reader::new(body);
    let req = match kind {
        PEER_FETCH => {
            let fingerprint = r.hash("fingerprint")?;
            let shard = r.u32("shard")?;
            let salt = r.hash("salt")?;
            let block_bytes = block_bytes(&mut r)?;
            let generation = r.u64("generation")?;
            let n = r.count("hashes", MAX_HASHES, HASH_BYTES)?;
            let mut hashes = Vec::with_capacity(n);
            for _ in 0..n {
                hashes.push(r.hash("hash")?);
            }
            PeerRequest::Fetch {
                fingerprint,
                shard,
                salt,
                block_bytes,
                generation,
                hashes,
            }
        }
        PEER_DONE => {
            let lease = r.u64("lease")?;
            let stored = match r.u8("stored")? {
                0 => false,
                1 => true,
                v => {
                    return Err(DecodeError::Invalid {
                        field: "stored",
                        value: u64::from(v),
                    });
                }
            };
            PeerRequest::Done { lease, stored }
        }
        k => return Err(DecodeError::UnknownKind(k)),
    };
    r.finish()?;
    Ok(req)
}

/// Decode what a source sent to a reader. Never panics; rejects trailing bytes.
pub fn decode_peer_response(kind: u16, body: &[u8]) -> Result<PeerResponse, DecodeError> {
    let mut r = Reader::new(body);
    let resp = match kind {
        PEER_LEASED => {
            let lease = r.u64("lease")?;
            let blocks = r.u32("blocks")?;
            if blocks as usize > MAX_HASHES {
                return Err(DecodeError::TooMany {
                    field: "blocks",
                    count: blocks as usize,
                    limit: MAX_HASHES,
                });
            }
            let block_bytes = block_bytes(&mut r)?;
            PeerResponse::Leased {
                lease,
                blocks,
                block_bytes,
            }
        }
        PEER_SENT => {
            let n = r.count("checksums", MAX_HASHES, 8)?;
            let mut checksums = Vec::with_capacity(n);
            for _ in 0..n {
                checksums.push(r.u64("checksum")?);
            }
            PeerResponse::Sent { checksums }
        }
        PEER_ERROR => PeerResponse::Error {
            message: r.text("message", MAX_TEXT)?,
        },
        k => return Err(DecodeError::UnknownKind(k)),
    };
    r.finish()?;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn round_trips() {
        let reqs = [
            PeerRequest::Fetch {
                fingerprint: [1; 32],
                shard: 3,
                salt: [2; 32],
                block_bytes: 4096,
                generation: 7,
                hashes: vec![[9; 32], [8; 32]],
            },
            PeerRequest::Done {
                lease: 5,
                stored: true,
            },
        ];
        for r in reqs {
            assert_eq!(decode_peer_request(r.kind(), &r.encode()).expect("decode"), r);
        }
        let resps = [
            PeerResponse::Leased {
                lease: 1,
                blocks: 2,
                block_bytes: 4096,
            },
            PeerResponse::Sent {
                checksums: vec![1, 2],
            },
            PeerResponse::Error { message: "no".into() },
        ];
        for r in resps {
            assert_eq!(decode_peer_response(r.kind(), &r.encode()).expect("decode"), r);
        }
    }

    #[test]
    fn refuses_client_kinds_bad_values_and_trailing_bytes() {
        assert!(decode_peer_request(0x03, &[]).is_err());
        let mut done = PeerRequest::Done {
            lease: 1,
            stored: false,
        }
        .encode();
        done[8] = 2;
        assert!(decode_peer_request(PEER_DONE, &done).is_err());
        done[8] = 0;
        done.push(0);
        assert!(matches!(
            decode_peer_request(PEER_DONE, &done),
            Err(DecodeError::Trailing(1))
        ));
        let zero = PeerResponse::Leased {
            lease: 1,
            blocks: 1,
            block_bytes: 0,
        }
        .encode();
        assert!(decode_peer_response(PEER_LEASED, &zero).is_err());
        // A count larger than the bytes present is refused before allocating.
        let mut lying = Vec::new();
        lying.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_peer_response(PEER_SENT, &lying).is_err());
    }
}
