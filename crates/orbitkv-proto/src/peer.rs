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
//!
//! Asking several peers at once, the reader probes first and fetches from one:
//!
//! ```text
//!   PeerProbe {as PeerFetch}               ─▶  lookup, pinned under a lease
//!                                         ◀─  PeerLeased {lease, blocks, block_bytes} (no bytes)
//!   the best answer:  PeerSend {lease}     ─▶  answered exactly like a PeerFetch
//!   every other one:  PeerDone {lease, stored: false} ─▶ lease released
//! ```
//!
//! Tensor parallelism across Managers (contract T1): the scheduler's Manager
//! pins the shards a peer holds for a TP lookup over one long-lived link per
//! peer; every request has one reply.
//!
//! ```text
//! scheduler's Manager                        shard holder
//!   PeerTpPin {token, ns key, shards, hashes, ttl} ─▶ pin the common prefix of
//!                                            its shards under a TP lease `token`
//!                                         ◀─  PeerTpPinned {blocks, ssd_blocks}
//!   PeerTpSettle {token, blocks}            ─▶ keep the first `blocks` (0: end it)
//!                                         ◀─  PeerTpSettled {blocks}
//!   PeerTpRelease {token}                   ─▶ the owner ended the TP lease
//!                                         ◀─  PeerTpSettled {blocks: 0}
//! ```
//!
//! The remote rank's worker redeems its part at its own Manager with the same
//! token. The holder ends parts never redeemed on `PeerTpRelease`, when the link
//! ends, or at the deadline `ttl_ms` (bounded by its own `--tp-lease-ttl-ms`).

use crate::codec::{DecodeError, Reader, Writer};
use crate::{HASH_BYTES, MAX_HASHES, MAX_TEXT, MAX_TP_SHARDS, TP_TOKEN_BYTES};

/// Peer message kinds (requests `0x040x`, replies `0x048x`).
pub const PEER_FETCH: u16 = 0x0401;
pub const PEER_DONE: u16 = 0x0402;
pub const PEER_TP_PIN: u16 = 0x0403;
pub const PEER_TP_SETTLE: u16 = 0x0404;
pub const PEER_TP_RELEASE: u16 = 0x0405;
pub const PEER_PROBE: u16 = 0x0406;
pub const PEER_SEND: u16 = 0x0407;
pub const PEER_LEASED: u16 = 0x0481;
pub const PEER_SENT: u16 = 0x0482;
pub const PEER_TP_PINNED: u16 = 0x0483;
pub const PEER_TP_SETTLED: u16 = 0x0484;
pub const PEER_ERROR: u16 = 0x04ff;

/// Largest block a peer transfer carries (a lying source cannot make the
/// reader expect more than its own namespace's block size anyway).
pub const MAX_PEER_BLOCK_BYTES: u64 = 1 << 30;

/// What a `Fetch` or a `Probe` asks for: `hashes` in the namespace
/// `(fingerprint, shard, salt)` at the reader's `generation` (another
/// generation is a miss), blocks of `block_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockQuery {
    pub fingerprint: [u8; 32],
    pub shard: u32,
    pub salt: [u8; 32],
    pub block_bytes: u64,
    pub generation: u64,
    pub hashes: Vec<[u8; HASH_BYTES]>,
}

impl BlockQuery {
    fn encode(&self, w: &mut Writer) {
        w.raw(&self.fingerprint)
            .u32(self.shard)
            .raw(&self.salt)
            .u64(self.block_bytes)
            .u64(self.generation)
            .hashes(&self.hashes);
    }

    fn decode(r: &mut Reader<'_>) -> Result<BlockQuery, DecodeError> {
        Ok(BlockQuery {
            fingerprint: r.hash("fingerprint")?,
            shard: r.u32("shard")?,
            salt: r.hash("salt")?,
            block_bytes: block_bytes(r)?,
            generation: r.u64("generation")?,
            hashes: r.hashes()?,
        })
    }
}

/// What a `TpPin` asks for: the common prefix of `hashes` over `shards` (of
/// the namespace `(fingerprint, shard, salt)` at `generation`), pinned under
/// a TP lease named `token`, whose parts this Manager's workers redeem; parts
/// never redeemed end after `ttl_ms` at the latest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpPinQuery {
    pub token: [u8; TP_TOKEN_BYTES],
    pub fingerprint: [u8; 32],
    pub salt: [u8; 32],
    pub block_bytes: u64,
    pub generation: u64,
    pub ttl_ms: u64,
    pub shards: Vec<u32>,
    pub hashes: Vec<[u8; HASH_BYTES]>,
}

impl TpPinQuery {
    fn encode(&self, w: &mut Writer) {
        w.raw(&self.token)
            .raw(&self.fingerprint)
            .raw(&self.salt)
            .u64(self.block_bytes)
            .u64(self.generation)
            .u64(self.ttl_ms)
            .u32s(&self.shards)
            .hashes(&self.hashes);
    }

    fn decode(r: &mut Reader<'_>) -> Result<TpPinQuery, DecodeError> {
        let token = r.tp_token("token")?;
        let fingerprint = r.hash("fingerprint")?;
        let salt = r.hash("salt")?;
        let block_bytes = block_bytes(r)?;
        let generation = r.u64("generation")?;
        let ttl_ms = r.u64("ttl_ms")?;
        let n = r.count_some("shards", MAX_TP_SHARDS, 4)?;
        let mut shards = Vec::with_capacity(n);
        for _ in 0..n {
            let s = r.u32("shard")?;
            if s as usize >= MAX_TP_SHARDS {
                return Err(DecodeError::Invalid {
                    field: "shard",
                    value: u64::from(s),
                });
            }
            shards.push(s);
        }
        Ok(TpPinQuery {
            token,
            fingerprint,
            salt,
            block_bytes,
            generation,
            ttl_ms,
            shards,
            hashes: r.hashes()?,
        })
    }
}

/// Reader → source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerRequest {
    /// Pin and send the longest contiguous run of the query's hashes the
    /// source holds (DRAM or SSD).
    Fetch(BlockQuery),
    /// The reader is done with `lease` (`stored`: it kept the bytes); the
    /// source releases it. A duplicate or unknown lease is ignored.
    Done { lease: u64, stored: bool },
    /// As `Fetch`, but only pin: the answer is a `Leased` with no bytes; the
    /// reader then sends `Send` (fetch them) or `Done` (release them).
    Probe(BlockQuery),
    /// Send the blocks of the probed `lease`: answered as a `Fetch` is.
    Send { lease: u64 },
    /// Pin a TP lease's part (see `TpPinQuery`).
    TpPin(TpPinQuery),
    /// Keep only the first `blocks` blocks of the TP lease `token` pinned
    /// (the common prefix over every Manager); `0` ends it.
    TpSettle {
        token: [u8; TP_TOKEN_BYTES],
        blocks: u32,
    },
    /// The owner ended the TP lease `token`: parts not redeemed are released.
    TpRelease { token: [u8; TP_TOKEN_BYTES] },
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
    /// Answer to `TpPin`: `blocks` pinned in every requested shard (0: a miss,
    /// nothing pinned); indices (ascending, `< blocks`) of those on SSD only.
    TpPinned { blocks: u32, ssd_blocks: Vec<u32> },
    /// Answer to `TpSettle` / `TpRelease`: blocks pinned now (0: ended or unknown).
    TpSettled { blocks: u32 },
    /// The request was refused; the source closes the connection.
    Error { message: String },
}

impl PeerRequest {
    pub fn kind(&self) -> u16 {
        match self {
            PeerRequest::Fetch(_) => PEER_FETCH,
            PeerRequest::Done { .. } => PEER_DONE,
            PeerRequest::Probe(_) => PEER_PROBE,
            PeerRequest::Send { .. } => PEER_SEND,
            PeerRequest::TpPin(_) => PEER_TP_PIN,
            PeerRequest::TpSettle { .. } => PEER_TP_SETTLE,
            PeerRequest::TpRelease { .. } => PEER_TP_RELEASE,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            PeerRequest::Fetch(q) | PeerRequest::Probe(q) => q.encode(&mut w),
            PeerRequest::Done { lease, stored } => {
                w.u64(*lease).u8(u8::from(*stored));
            }
            PeerRequest::TpPin(q) => q.encode(&mut w),
            PeerRequest::TpSettle { token, blocks } => {
                w.raw(token).u32(*blocks);
            }
            PeerRequest::Send { lease } => {
                w.u64(*lease);
            }
            PeerRequest::TpRelease { token } => {
                w.raw(token);
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
            PeerResponse::TpPinned { .. } => PEER_TP_PINNED,
            PeerResponse::TpSettled { .. } => PEER_TP_SETTLED,
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
                w.u64s(checksums);
            }
            PeerResponse::TpPinned { blocks, ssd_blocks } => {
                w.u32(*blocks).u32s(ssd_blocks);
            }
            PeerResponse::TpSettled { blocks } => {
                w.u32(*blocks);
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

/// A reply's block count: at most `MAX_HASHES` (no request asks for more).
fn blocks(r: &mut Reader<'_>) -> Result<u32, DecodeError> {
    let v = r.u32("blocks")?;
    if v as usize > MAX_HASHES {
        return Err(DecodeError::TooMany {
            field: "blocks",
            count: v as usize,
            limit: MAX_HASHES,
        });
    }
    Ok(v)
}

/// Decode what a reader sent to a source. Never panics; rejects trailing bytes.
pub fn decode_peer_request(kind: u16, body: &[u8]) -> Result<PeerRequest, DecodeError> {
    let mut r = Reader::new(body);
    let req = match kind {
        PEER_FETCH => PeerRequest::Fetch(BlockQuery::decode(&mut r)?),
        PEER_PROBE => PeerRequest::Probe(BlockQuery::decode(&mut r)?),
        PEER_SEND => PeerRequest::Send {
            lease: r.u64("lease")?,
        },
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
        PEER_TP_PIN => PeerRequest::TpPin(TpPinQuery::decode(&mut r)?),
        PEER_TP_SETTLE => PeerRequest::TpSettle {
            token: r.tp_token("token")?,
            blocks: r.u32("blocks")?,
        },
        PEER_TP_RELEASE => PeerRequest::TpRelease {
            token: r.tp_token("token")?,
        },
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
            let blocks = blocks(&mut r)?;
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
        PEER_TP_PINNED => {
            let blocks = blocks(&mut r)?;
            let n = r.count("ssd_blocks", MAX_HASHES, 4)?;
            let mut ssd_blocks = Vec::with_capacity(n);
            for _ in 0..n {
                let i = r.u32("ssd_block")?;
                // Ascending and inside the hit: anything else is a lying peer.
                if i >= blocks || ssd_blocks.last().is_some_and(|&l| i <= l) {
                    return Err(DecodeError::Invalid {
                        field: "ssd_block",
                        value: u64::from(i),
                    });
                }
                ssd_blocks.push(i);
            }
            PeerResponse::TpPinned { blocks, ssd_blocks }
        }
        PEER_TP_SETTLED => PeerResponse::TpSettled {
            blocks: r.u32("blocks")?,
        },
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

    /// A query in the namespace `([1; 32], shard, [2; 32])`.
    fn query(shard: u32, block_bytes: u64, generation: u64, hashes: Vec<[u8; HASH_BYTES]>) -> BlockQuery {
        BlockQuery {
            fingerprint: [1; 32],
            shard,
            salt: [2; 32],
            block_bytes,
            generation,
            hashes,
        }
    }

    /// A TP pin over `shards`, valid but for them.
    fn tp_pin(shards: Vec<u32>) -> PeerRequest {
        PeerRequest::TpPin(TpPinQuery {
            token: [4; 16],
            fingerprint: [1; 32],
            salt: [2; 32],
            block_bytes: 4096,
            generation: 3,
            ttl_ms: 1000,
            shards,
            hashes: vec![[9; 32]],
        })
    }

    #[test]
    fn round_trips() {
        let reqs = [
            PeerRequest::Fetch(query(3, 4096, 7, vec![[9; 32], [8; 32]])),
            PeerRequest::Done {
                lease: 5,
                stored: true,
            },
            tp_pin(vec![1, 3]),
            PeerRequest::TpSettle {
                token: [4; 16],
                blocks: 2,
            },
            PeerRequest::TpRelease { token: [4; 16] },
            PeerRequest::Probe(query(0, 64, 1, vec![[3; 32]])),
            PeerRequest::Send { lease: 9 },
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
            PeerResponse::TpPinned {
                blocks: 4,
                ssd_blocks: vec![1, 3],
            },
            PeerResponse::TpSettled { blocks: 0 },
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

    #[test]
    fn refuses_tp_pins_without_shards_or_past_the_shard_limit_and_lying_ssd_indices() {
        for shards in [vec![], vec![MAX_TP_SHARDS as u32]] {
            let p = tp_pin(shards);
            assert!(decode_peer_request(p.kind(), &p.encode()).is_err());
        }
        for ssd in [vec![2], vec![1, 1], vec![1, 0]] {
            let r = PeerResponse::TpPinned {
                blocks: 2,
                ssd_blocks: ssd,
            };
            assert!(decode_peer_response(r.kind(), &r.encode()).is_err());
        }
    }
}
