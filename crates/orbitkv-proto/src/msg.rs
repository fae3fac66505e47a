//! Message types and their body encodings.

use crate::codec::{DecodeError, Reader, Writer};
use crate::{
    FD_BATCH, HASH_BYTES, MAX_HASHES, MAX_QUIET_RELEASES, MAX_SEGMENTS, MAX_TEXT, MAX_TOKEN, MAX_TP_SHARDS,
    PRESENCE_KEY_BYTES, TP_TOKEN_BYTES,
};

/// Message kinds. Requests are < 0x80, replies ≥ 0x80.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    Hello = 0x01,
    RegisterNamespace = 0x02,
    Lookup = 0x03,
    Acquire = 0x04,
    Release = 0x05,
    BeginSave = 0x06,
    CommitSave = 0x07,
    AbortSave = 0x08,
    ResetGeneration = 0x09,
    Stats = 0x0a,
    InjectFault = 0x0b,
    Close = 0x0c,
    LookupTp = 0x0d,
    RedeemTp = 0x0e,
    ReleaseTp = 0x0f,
    ReleaseQuiet = 0x10,
    Trace = 0x11,
    Retain = 0x12,
    HelloOk = 0x81,
    Namespace = 0x82,
    LookupOk = 0x83,
    Slots = 0x84,
    Ok = 0x85,
    SaveBegun = 0x86,
    Committed = 0x87,
    Generation = 0x88,
    StatsOk = 0x89,
    TpLeaseOk = 0x8a,
    ArenaFds = 0x8b,
    TraceOk = 0x8c,
    Retained = 0x8d,
    Error = 0xff,
}

/// Error classes carried by `Response::Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    BadFrame = 1,
    Version = 2,
    Auth = 3,
    UnknownNamespace = 4,
    Busy = 5,
    NotFound = 6,
    NotOwner = 7,
    RestoreFailed = 8,
    InvalidArgument = 9,
    Internal = 10,
    FaultInjectionDisabled = 11,
    TooLarge = 12,
    SessionClosed = 13,
    SaveFailed = 14,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => BadFrame,
            2 => Version,
            3 => Auth,
            4 => UnknownNamespace,
            5 => Busy,
            6 => NotFound,
            7 => NotOwner,
            8 => RestoreFailed,
            9 => InvalidArgument,
            10 => Internal,
            11 => FaultInjectionDisabled,
            12 => TooLarge,
            13 => SessionClosed,
            14 => SaveFailed,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Hello {
        pid: u32,
        /// [`crate::HELLO_CONTROL_ONLY`] or 0; unknown bits are a decode error.
        flags: u32,
        token: Vec<u8>,
    },
    RegisterNamespace {
        fingerprint: [u8; 32],
        shard: u32,
        salt: [u8; 32],
        block_bytes: u64,
    },
    Lookup {
        ns: u32,
        hashes: Vec<[u8; HASH_BYTES]>,
    },
    Acquire {
        lease: u64,
    },
    Release {
        lease: u64,
    },
    BeginSave {
        ns: u32,
        hashes: Vec<[u8; HASH_BYTES]>,
    },
    CommitSave {
        save: u64,
    },
    AbortSave {
        save: u64,
    },
    ResetGeneration {
        ns: u32,
    },
    Stats,
    InjectFault {
        restore_failures: u32,
        commit_failures: u32,
    },
    /// The client has drained every copy it started; release all its holds.
    Close,
    /// One lookup over every shard of a TP group (`nss[i]` is shard `i`): the
    /// common prefix, pinned in every shard under one TP lease (contract T1).
    LookupTp {
        nss: Vec<u32>,
        hashes: Vec<[u8; HASH_BYTES]>,
    },
    /// Take shard `ns`'s part of the TP lease `token` into this session; the
    /// reply is a `LookupOk` naming an ordinary lease of this session.
    RedeemTp {
        token: [u8; TP_TOKEN_BYTES],
        ns: u32,
    },
    /// The owner ends its TP lease (parts no worker redeemed are released).
    ReleaseTp {
        token: [u8; TP_TOKEN_BYTES],
    },
    /// Release 1 to [`MAX_QUIET_RELEASES`] leases of this session, in order,
    /// with **no reply** (the one request that has none): the caller asserts
    /// every copy out of them has drained and does not wait for the Manager.
    /// A lease the Manager cannot release (already ended) is counted and
    /// logged by the Manager; it never affects the requests that follow.
    ReleaseQuiet {
        leases: Vec<u64>,
    },
    /// `orbitkv trace`: keep recording this Manager's lookups and lease ends for
    /// `arm_ms` more milliseconds (0: stop now), of namespaces with `fingerprint`
    /// only (all zeros: every namespace) and of process `pid` only (0: every
    /// process), and answer the events recorded after `cursor` (`TraceOk`).
    Trace {
        arm_ms: u32,
        fingerprint: [u8; HASH_BYTES],
        pid: u32,
        cursor: u64,
    },
    /// A retention hint from an application on a chain of blocks of `ns`
    /// (prefix first): kept until `ttl_ms` from now, done, or cleared. Blocks
    /// not visible yet take the hint when they commit. Answered `Retained`.
    Retain {
        ns: u32,
        hold: RetainHold,
        hashes: Vec<[u8; HASH_BYTES]>,
    },
}

/// What a `Retain` says about its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainHold {
    /// Expected back within `ttl_ms`.
    Keep { ttl_ms: u32 },
    /// Not expected back: they leave before anything else.
    Done,
    /// Drop earlier hints on them.
    Clear,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: u32,
    pub size: u64,
}

/// Outcome of one block of a `BeginSave`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveItem {
    Allocated { segment: u32, offset: u64 },
    Present,
    Refused,
}

/// A `LookupOk` (the answer to `Lookup` and `RedeemTp`): the longest
/// contiguous hit, pinned under `lease` (`lease == 0` when nothing was hit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupGrant {
    pub lease: u64,
    pub hit_blocks: u32,
    pub generation: u64,
    /// Indices (ascending, each `< hit_blocks`) of the hit blocks the Manager
    /// held on SSD only at lookup time (staged back into DRAM by `Acquire`);
    /// the others were DRAM hits.
    pub ssd_blocks: Vec<u32>,
}

/// A `TpLeaseOk` (the answer to `LookupTp`): the common prefix of every
/// declared shard, pinned in each under the TP lease `token` (all zeros when
/// `hit_blocks` is 0: nothing pinned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpGrant {
    pub token: [u8; TP_TOKEN_BYTES],
    pub hit_blocks: u32,
    pub generation: u64,
    /// Indices of hit blocks that some shard held on SSD only.
    pub ssd_blocks: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Carries, when `presence_slots > 0`, the fd of the read-only presence
    /// table of that many slots (SCM_RIGHTS). A session that maps the arena
    /// then receives the segments' fds in order, in `ArenaFds` frames of at
    /// most [`crate::FD_BATCH`] each (none to a control-only session).
    HelloOk {
        session: u64,
        segments: Vec<SegmentInfo>,
        presence_slots: u64,
    },
    /// Part of the handshake, unrequested (request id 0): the fds of segments
    /// `first .. first + count` travel with this frame (SCM_RIGHTS). Batches
    /// arrive in order, so a client can map and close each batch before the
    /// next: it never holds more than `FD_BATCH` arena fds at once.
    ArenaFds {
        first: u32,
        count: u32,
    },
    /// The reply to `Trace`: a JSON document of the events after its cursor.
    TraceOk {
        json: String,
    },
    /// The reply to `Retain`: blocks it applied to, blocks it waits for
    /// (not committed yet), blocks it could not keep (the cap).
    Retained {
        applied: u32,
        pending: u32,
        refused: u32,
    },
    Namespace {
        ns: u32,
        generation: u64,
        /// This namespace's key into the presence table (keyed fingerprints;
        /// see `orbitkv_shm::presence`). Handed only to registrants.
        presence_key: [u8; PRESENCE_KEY_BYTES],
    },
    LookupOk(LookupGrant),
    Slots {
        slots: Vec<(u32, u64)>,
    },
    Ok,
    SaveBegun {
        save: u64,
        items: Vec<SaveItem>,
    },
    Committed {
        blocks: u32,
    },
    Generation {
        generation: u64,
    },
    StatsOk {
        json: String,
    },
    TpLeaseOk(TpGrant),
    Error {
        code: u16,
        message: String,
    },
}

impl Request {
    pub fn kind(&self) -> Kind {
        match self {
            Request::Hello { .. } => Kind::Hello,
            Request::RegisterNamespace { .. } => Kind::RegisterNamespace,
            Request::Lookup { .. } => Kind::Lookup,
            Request::Acquire { .. } => Kind::Acquire,
            Request::Release { .. } => Kind::Release,
            Request::BeginSave { .. } => Kind::BeginSave,
            Request::CommitSave { .. } => Kind::CommitSave,
            Request::AbortSave { .. } => Kind::AbortSave,
            Request::ResetGeneration { .. } => Kind::ResetGeneration,
            Request::Stats => Kind::Stats,
            Request::InjectFault { .. } => Kind::InjectFault,
            Request::Close => Kind::Close,
            Request::LookupTp { .. } => Kind::LookupTp,
            Request::RedeemTp { .. } => Kind::RedeemTp,
            Request::ReleaseTp { .. } => Kind::ReleaseTp,
            Request::ReleaseQuiet { .. } => Kind::ReleaseQuiet,
            Request::Trace { .. } => Kind::Trace,
            Request::Retain { .. } => Kind::Retain,
        }
    }

    /// Whether the Manager answers this request (every request but
    /// `ReleaseQuiet` has exactly one reply).
    pub fn expects_reply(&self) -> bool {
        !matches!(self, Request::ReleaseQuiet { .. })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Request::Hello { pid, flags, token } => {
                w.u32(*pid).u32(*flags).bytes(token);
            }
            Request::RegisterNamespace {
                fingerprint,
                shard,
                salt,
                block_bytes,
            } => {
                w.raw(fingerprint).u32(*shard).raw(salt).u64(*block_bytes);
            }
            Request::Lookup { ns, hashes: hs } | Request::BeginSave { ns, hashes: hs } => {
                w.u32(*ns);
                w.hashes(hs);
            }
            Request::Acquire { lease } | Request::Release { lease } => {
                w.u64(*lease);
            }
            Request::CommitSave { save } | Request::AbortSave { save } => {
                w.u64(*save);
            }
            Request::ResetGeneration { ns } => {
                w.u32(*ns);
            }
            Request::InjectFault {
                restore_failures,
                commit_failures,
            } => {
                w.u32(*restore_failures).u32(*commit_failures);
            }
            Request::Stats | Request::Close => {}
            Request::LookupTp { nss, hashes: hs } => {
                w.u32s(nss).hashes(hs);
            }
            Request::RedeemTp { token, ns } => {
                w.raw(token).u32(*ns);
            }
            Request::ReleaseTp { token } => {
                w.raw(token);
            }
            Request::ReleaseQuiet { leases } => {
                w.u64s(leases);
            }
            Request::Trace {
                arm_ms,
                fingerprint,
                pid,
                cursor,
            } => {
                w.u32(*arm_ms).raw(fingerprint).u32(*pid).u64(*cursor);
            }
            Request::Retain { ns, hold, hashes: hs } => {
                let (tag, ttl_ms) = match hold {
                    RetainHold::Keep { ttl_ms } => (1, *ttl_ms),
                    RetainHold::Done => (2, 0),
                    RetainHold::Clear => (3, 0),
                };
                w.u32(*ns).u8(tag).u32(ttl_ms).hashes(hs);
            }
        }
        w.buf
    }
}

/// Decode a request body of the given kind.
pub fn decode_request(kind: u16, body: &[u8]) -> Result<Request, DecodeError> {
    let mut r = Reader::new(body);
    let req = match kind {
        0x01 => Request::Hello {
            pid: r.u32("pid")?,
            flags: match r.u32("flags")? {
                f if f & !crate::HELLO_KNOWN_FLAGS == 0 => f,
                f => {
                    return Err(DecodeError::Invalid {
                        field: "flags",
                        value: f.into(),
                    });
                }
            },
            token: r.bytes("token", MAX_TOKEN)?,
        },
        0x02 => Request::RegisterNamespace {
            fingerprint: r.hash("fingerprint")?,
            shard: r.u32("shard")?,
            salt: r.hash("salt")?,
            block_bytes: r.u64("block_bytes")?,
        },
        0x03 => Request::Lookup {
            ns: r.u32("ns")?,
            hashes: r.hashes()?,
        },
        0x04 => Request::Acquire {
            lease: r.u64("lease")?,
        },
        0x05 => Request::Release {
            lease: r.u64("lease")?,
        },
        0x06 => Request::BeginSave {
            ns: r.u32("ns")?,
            hashes: r.hashes()?,
        },
        0x07 => Request::CommitSave { save: r.u64("save")? },
        0x08 => Request::AbortSave { save: r.u64("save")? },
        0x09 => Request::ResetGeneration { ns: r.u32("ns")? },
        0x0a => Request::Stats,
        0x0b => Request::InjectFault {
            restore_failures: r.u32("restore_failures")?,
            commit_failures: r.u32("commit_failures")?,
        },
        0x0c => Request::Close,
        0x0d => {
            let n = r.count("shards", MAX_TP_SHARDS, 4)?;
            let mut nss = Vec::with_capacity(n);
            for _ in 0..n {
                nss.push(r.u32("ns")?);
            }
            Request::LookupTp {
                nss,
                hashes: r.hashes()?,
            }
        }
        0x0e => Request::RedeemTp {
            token: r.tp_token("token")?,
            ns: r.u32("ns")?,
        },
        0x0f => Request::ReleaseTp {
            token: r.tp_token("token")?,
        },
        0x10 => {
            let n = r.count_some("leases", MAX_QUIET_RELEASES, 8)?;
            let mut leases = Vec::with_capacity(n);
            for _ in 0..n {
                leases.push(r.u64("lease")?);
            }
            Request::ReleaseQuiet { leases }
        }
        0x11 => Request::Trace {
            arm_ms: r.u32("arm_ms")?,
            fingerprint: r.hash("fingerprint")?,
            pid: r.u32("pid")?,
            cursor: r.u64("cursor")?,
        },
        0x12 => {
            let ns = r.u32("ns")?;
            let tag = r.u8("hold")?;
            let ttl_ms = r.u32("ttl_ms")?;
            let hold = match (tag, ttl_ms) {
                (1, _) => RetainHold::Keep { ttl_ms },
                // One encoding per message: no deadline but on a keep.
                (2, 0) => RetainHold::Done,
                (3, 0) => RetainHold::Clear,
                (2 | 3, t) => {
                    return Err(DecodeError::Invalid {
                        field: "ttl_ms (zero unless the hold is keep)",
                        value: u64::from(t),
                    });
                }
                (v, _) => {
                    return Err(DecodeError::Invalid {
                        field: "hold",
                        value: u64::from(v),
                    });
                }
            };
            Request::Retain {
                ns,
                hold,
                hashes: r.hashes()?,
            }
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(req)
}

impl Response {
    pub fn kind(&self) -> Kind {
        match self {
            Response::HelloOk { .. } => Kind::HelloOk,
            Response::Namespace { .. } => Kind::Namespace,
            Response::LookupOk(_) => Kind::LookupOk,
            Response::Slots { .. } => Kind::Slots,
            Response::Ok => Kind::Ok,
            Response::SaveBegun { .. } => Kind::SaveBegun,
            Response::Committed { .. } => Kind::Committed,
            Response::Generation { .. } => Kind::Generation,
            Response::StatsOk { .. } => Kind::StatsOk,
            Response::TpLeaseOk(_) => Kind::TpLeaseOk,
            Response::ArenaFds { .. } => Kind::ArenaFds,
            Response::TraceOk { .. } => Kind::TraceOk,
            Response::Retained { .. } => Kind::Retained,
            Response::Error { .. } => Kind::Error,
        }
    }

    pub fn error(code: ErrorCode, message: impl Into<String>) -> Response {
        let mut message: String = message.into();
        if message.len() > MAX_TEXT {
            let mut cut = MAX_TEXT;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Response::Error {
            code: code as u16,
            message,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Response::HelloOk {
                session,
                segments,
                presence_slots,
            } => {
                w.u64(*session)
                    .list(segments, |w, s| {
                        w.u32(s.id).u64(s.size);
                    })
                    .u64(*presence_slots);
            }
            Response::Namespace {
                ns,
                generation,
                presence_key,
            } => {
                w.u32(*ns).u64(*generation).raw(presence_key);
            }
            Response::LookupOk(g) => {
                w.u64(g.lease)
                    .u32(g.hit_blocks)
                    .u64(g.generation)
                    .u32s(&g.ssd_blocks);
            }
            Response::Slots { slots } => {
                w.list(slots, |w, (seg, off)| {
                    w.u32(*seg).u64(*off);
                });
            }
            Response::Ok => {}
            Response::SaveBegun { save, items } => {
                w.u64(*save).list(items, |w, it| {
                    match it {
                        SaveItem::Allocated { segment, offset } => w.u8(0).u32(*segment).u64(*offset),
                        SaveItem::Present => w.u8(1).u32(0).u64(0),
                        SaveItem::Refused => w.u8(2).u32(0).u64(0),
                    };
                });
            }
            Response::Committed { blocks } => {
                w.u32(*blocks);
            }
            Response::Generation { generation } => {
                w.u64(*generation);
            }
            Response::StatsOk { json } | Response::TraceOk { json } => {
                w.bytes(json.as_bytes());
            }
            Response::Retained {
                applied,
                pending,
                refused,
            } => {
                w.u32(*applied).u32(*pending).u32(*refused);
            }
            Response::TpLeaseOk(g) => {
                w.raw(&g.token)
                    .u32(g.hit_blocks)
                    .u64(g.generation)
                    .u32s(&g.ssd_blocks);
            }
            Response::ArenaFds { first, count } => {
                w.u32(*first).u32(*count);
            }
            Response::Error { code, message } => {
                w.u16(*code).bytes(message.as_bytes());
            }
        }
        w.buf
    }
}

/// Indices of SSD-only hit blocks: strictly ascending, each below `hit_blocks`
/// (one encoding per message).
fn read_ssd_blocks(r: &mut Reader<'_>, hit_blocks: u32) -> Result<Vec<u32>, DecodeError> {
    let n = r.count("ssd_blocks", MAX_HASHES, 4)?;
    let mut ssd_blocks = Vec::with_capacity(n);
    for _ in 0..n {
        let i = r.u32("ssd block")?;
        if i >= hit_blocks || ssd_blocks.last().is_some_and(|&p| p >= i) {
            return Err(DecodeError::Invalid {
                field: "ssd block",
                value: i.into(),
            });
        }
        ssd_blocks.push(i);
    }
    Ok(ssd_blocks)
}

/// Decode a reply body of the given kind.
pub fn decode_response(kind: u16, body: &[u8]) -> Result<Response, DecodeError> {
    let mut r = Reader::new(body);
    let resp = match kind {
        0x81 => {
            let session = r.u64("session")?;
            let n = r.count("segments", MAX_SEGMENTS, 12)?;
            let mut segments = Vec::with_capacity(n);
            for _ in 0..n {
                segments.push(SegmentInfo {
                    id: r.u32("segment id")?,
                    size: r.u64("segment size")?,
                });
            }
            Response::HelloOk {
                session,
                segments,
                presence_slots: r.u64("presence_slots")?,
            }
        }
        0x82 => Response::Namespace {
            ns: r.u32("ns")?,
            generation: r.u64("generation")?,
            presence_key: r.presence_key("presence_key")?,
        },
        0x83 => {
            let lease = r.u64("lease")?;
            let hit_blocks = r.u32("hit_blocks")?;
            let generation = r.u64("generation")?;
            Response::LookupOk(LookupGrant {
                lease,
                hit_blocks,
                generation,
                ssd_blocks: read_ssd_blocks(&mut r, hit_blocks)?,
            })
        }
        0x84 => {
            let n = r.count("slots", MAX_HASHES, 12)?;
            let mut slots = Vec::with_capacity(n);
            for _ in 0..n {
                slots.push((r.u32("segment")?, r.u64("offset")?));
            }
            Response::Slots { slots }
        }
        0x85 => Response::Ok,
        0x86 => {
            let save = r.u64("save")?;
            let n = r.count("items", MAX_HASHES, 13)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                let tag = r.u8("item status")?;
                let segment = r.u32("segment")?;
                let offset = r.u64("offset")?;
                items.push(match tag {
                    0 => SaveItem::Allocated { segment, offset },
                    // Unused fields must be zero: one encoding per message.
                    1 | 2 if segment != 0 || offset != 0 => {
                        return Err(DecodeError::Invalid {
                            field: "unused slot fields",
                            value: u64::from(segment) | offset,
                        });
                    }
                    1 => SaveItem::Present,
                    2 => SaveItem::Refused,
                    v => {
                        return Err(DecodeError::Invalid {
                            field: "item status",
                            value: u64::from(v),
                        });
                    }
                });
            }
            Response::SaveBegun { save, items }
        }
        0x87 => Response::Committed {
            blocks: r.u32("blocks")?,
        },
        0x88 => Response::Generation {
            generation: r.u64("generation")?,
        },
        0x89 => Response::StatsOk {
            json: r.text("stats", MAX_TEXT)?,
        },
        0x8a => {
            let token = r.tp_token("token")?;
            let hit_blocks = r.u32("hit_blocks")?;
            // One encoding per message: no token without a hit, no hit without one.
            if (hit_blocks == 0) != (token == [0; TP_TOKEN_BYTES]) {
                return Err(DecodeError::Invalid {
                    field: "token (zero exactly when nothing was hit)",
                    value: u64::from(hit_blocks),
                });
            }
            let generation = r.u64("generation")?;
            Response::TpLeaseOk(TpGrant {
                token,
                hit_blocks,
                generation,
                ssd_blocks: read_ssd_blocks(&mut r, hit_blocks)?,
            })
        }
        0x8b => {
            let first = r.u32("first segment")?;
            let count = r.u32("fd count")?;
            let end = u64::from(first) + u64::from(count);
            if count == 0 || count as usize > FD_BATCH || end > MAX_SEGMENTS as u64 {
                return Err(DecodeError::Invalid {
                    field: "arena fd batch (1..=FD_BATCH fds of segments below MAX_SEGMENTS)",
                    value: end,
                });
            }
            Response::ArenaFds { first, count }
        }
        0x8c => Response::TraceOk {
            json: r.text("trace", MAX_TEXT)?,
        },
        0x8d => Response::Retained {
            applied: r.u32("applied")?,
            pending: r.u32("pending")?,
            refused: r.u32("refused")?,
        },
        0xff => Response::Error {
            code: r.u16("code")?,
            message: r.text("message", MAX_TEXT)?,
        },
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(resp)
}
