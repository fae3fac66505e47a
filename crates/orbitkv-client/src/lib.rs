//! Rust client of the OrbitKV Manager.
//!
//! A [`Client`] is one session: it authenticates, maps the Manager's DRAM
//! arena (fds received over the socket) and runs host copies itself. Requests
//! are serialised on one connection; every call is blocking and bounded by the
//! configured timeout.
#![forbid(unsafe_code)]

mod conn;
mod copy;
mod error;
mod guard;
mod release_queue;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use conn::SERVER_UID_ENV;
pub use copy::{EngineMemory, PageLayout, PageSpec, SlotCopier};
pub use error::ClientError;
pub use guard::{Lease, SaveGuard};
use orbitkv_proto::{
    ErrorCode, HASH_BYTES, MAX_QUIET_RELEASES, MAX_TP_SHARDS, Request, Response, SaveItem, TP_TOKEN_BYTES,
};
use orbitkv_shm::Mapping;
pub use release_queue::RELEASE_DELAY_ENV;

pub type Hash = [u8; HASH_BYTES];

/// A registered namespace (contract K1).
#[derive(Debug, Clone)]
pub struct Namespace {
    pub id: u32,
    pub generation: u64,
    pub block_bytes: u64,
    pub fingerprint: [u8; 32],
    pub shard: u32,
    /// This namespace's key into the Manager's presence table (see
    /// [`Client::probably_present`]); from the Manager that registered it.
    pub presence_key: [u8; orbitkv_proto::PRESENCE_KEY_BYTES],
}

/// Result of a lookup: the longest contiguous hit, pinned under `lease`
/// (`lease == 0` when nothing was hit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupHit {
    pub lease: u64,
    pub hit_blocks: u32,
    pub generation: u64,
    /// Indices (ascending) of the hit blocks the Manager held on SSD only at
    /// lookup time (staged back into DRAM by `acquire`); the others were DRAM hits.
    pub ssd_blocks: Vec<u32>,
}

/// Result of a TP lookup (contract T1): the common prefix of every declared
/// shard, pinned in each under one TP lease named by `token` (None when the
/// common prefix is empty: nothing is pinned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpHit {
    pub token: Option<[u8; TP_TOKEN_BYTES]>,
    pub hit_blocks: u32,
    /// Indices of hit blocks some shard held on SSD only at lookup time.
    pub ssd_blocks: Vec<u32>,
    pub generation: u64,
}

/// Outcome of one block of a save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotStatus {
    Allocated { segment: u32, offset: u64 },
    Present,
    Refused,
}

#[derive(Debug, Clone)]
pub struct PendingSave {
    pub id: u64,
    pub items: Vec<SlotStatus>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaveResult {
    pub stored: u32,
    pub already_present: u32,
    pub refused: u32,
    pub bytes_copied: u64,
}

#[derive(Debug)]
pub struct Client {
    conn: conn::Conn,
    session: u64,
    /// Mapped arena segments; empty for a control-only client.
    segments: Vec<(u32, Arc<Mapping>)>,
    /// `(id, size)` of every segment the Manager announced.
    announced: Vec<(u32, u64)>,
    control_only: bool,
    socket_path: PathBuf,
    closed: AtomicBool,
    /// The Manager's presence table, mapped read-only (None: it publishes none).
    presence: Option<orbitkv_shm::presence::PresenceView>,
    /// Copies hold it shared; `close` takes it exclusively, so the Manager is
    /// told "drained" only after every copy touching the arena has finished
    /// (contract L6).
    copies: RwLock<()>,
}

/// How [`Client::connect_with`] connects.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions<'a> {
    /// Shared token, when the Manager runs with `--token-file`.
    pub token: Option<&'a [u8]>,
    /// Bound on every request, the handshake included.
    pub timeout: Duration,
    /// False: a control-only session (see [`Client::connect_control`]).
    pub map_arena: bool,
    /// One more uid trusted to answer on the socket, besides this process's
    /// own (a Manager run by another user, admitting us with `--allow-uid`).
    /// `None`: the `ORBITKV_SERVER_UID` environment variable, if set. A peer
    /// of any other uid is refused with [`ClientError::UntrustedServer`]
    /// before anything, the token included, is sent to it.
    pub server_uid: Option<u32>,
}

impl<'a> ConnectOptions<'a> {
    /// A session that maps the arena, without token or extra trusted uid.
    pub fn new(timeout: Duration) -> ConnectOptions<'a> {
        ConnectOptions {
            token: None,
            timeout,
            map_arena: true,
            server_uid: None,
        }
    }
}

impl Client {
    /// Connect, authenticate and map the arena (prefaulted in the background).
    pub fn connect(path: &Path, token: Option<&[u8]>, timeout: Duration) -> Result<Client, ClientError> {
        Self::connect_with(
            path,
            &ConnectOptions {
                token,
                ..ConnectOptions::new(timeout)
            },
        )
    }

    /// Connect and authenticate without mapping the arena: lookups, leases,
    /// save bookkeeping and stats work; copies (`save`, `restore`,
    /// `segment_address`) are refused. For processes that never copy, such as
    /// an engine scheduler: they pay no page tables and no prefault for an
    /// arena that may be hundreds of GiB.
    pub fn connect_control(
        path: &Path,
        token: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        Self::connect_with(
            path,
            &ConnectOptions {
                token,
                map_arena: false,
                ..ConnectOptions::new(timeout)
            },
        )
    }

    /// Connect with every option spelled out. The process answering on the
    /// socket must run as this process's uid or `opts.server_uid` (checked
    /// through `SO_PEERCRED` before the token is sent).
    pub fn connect_with(path: &Path, opts: &ConnectOptions<'_>) -> Result<Client, ClientError> {
        if opts.timeout.is_zero() {
            return Err(ClientError::Invalid(
                "timeout must be positive (a zero timeout would fail every request)".into(),
            ));
        }
        let map_arena = opts.map_arena;
        let (conn, session, views, presence) =
            conn::Conn::open(path, opts.token, opts.timeout, map_arena, opts.server_uid)?;
        let announced = views.iter().map(|v| (v.id, v.size)).collect();
        let segments: Vec<(u32, Arc<Mapping>)> = views
            .into_iter()
            .filter_map(|v| v.mapping.map(|m| (v.id, Arc::new(m))))
            .collect();
        prefault_in_background(&segments);
        Ok(Client {
            conn,
            session,
            segments,
            announced,
            control_only: !map_arena,
            socket_path: path.to_path_buf(),
            closed: AtomicBool::new(false),
            presence,
            copies: RwLock::new(()),
        })
    }

    pub fn session_id(&self) -> u64 {
        self.session
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// `(segment id, size)` of every mapped arena segment.
    pub fn segments(&self) -> Vec<(u32, u64)> {
        self.announced.clone()
    }

    /// Whether this client was connected without mapping the arena.
    pub fn is_control_only(&self) -> bool {
        self.control_only
    }

    pub fn segment(&self, id: u32) -> Result<&Mapping, ClientError> {
        self.require_mapped()?;
        self.segments
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, m)| m.as_ref())
            .ok_or_else(|| ClientError::UnknownSegment {
                segment: id,
                known: self.segments.iter().map(|(i, _)| *i).collect(),
            })
    }

    /// The mapping holding the slot `[offset, offset + len)` of `segment`,
    /// checked to lie inside it.
    fn slot_mapping(&self, segment: u32, offset: u64, len: u64) -> Result<&Mapping, ClientError> {
        let m = self.segment(segment)?;
        if offset.checked_add(len).is_none_or(|e| e > m.len() as u64) {
            return Err(ClientError::Invalid(format!(
                "arena slot [{offset}, +{len}) outside segment {segment} ({} bytes)",
                m.len()
            )));
        }
        Ok(m)
    }

    /// `[start, end)` addresses of every arena mapping in this process, so a
    /// binding can prove a foreign buffer does not overlap the arena.
    pub fn arena_spans(&self) -> Vec<(usize, usize)> {
        self.segments
            .iter()
            .map(|(_, m)| (m.as_ptr() as usize, m.as_ptr() as usize + m.len()))
            .collect()
    }

    /// Refuse a copy on a control-only client before any Manager state changes.
    pub fn require_mapped(&self) -> Result<(), ClientError> {
        if self.control_only {
            return Err(ClientError::Invalid(
                "this client is control-only (connected without mapping the arena); \
                 copies need a client connected with the arena mapped"
                    .into(),
            ));
        }
        Ok(())
    }

    fn call(&self, req: &Request) -> Result<Response, ClientError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::Closed);
        }
        match self.conn.call(req)? {
            Response::Error { code, message } => Err(ClientError::Server {
                code: ErrorCode::from_u16(code).unwrap_or(ErrorCode::Internal),
                message,
            }),
            r => Ok(r),
        }
    }

    /// Enter a copy section: fails once the client is closing.
    fn copy_guard(&self) -> Result<std::sync::RwLockReadGuard<'_, ()>, ClientError> {
        let g = self.copies.read().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::Closed);
        }
        Ok(g)
    }

    fn unexpected(r: Response) -> ClientError {
        ClientError::Protocol(format!("unexpected reply {:?}", r.kind()))
    }

    /// Register (or find) the namespace of `fingerprint`, `shard` and the
    /// tenant `salt` (any bytes; empty = no salt), encoded by
    /// [`namespace_salt`], the one encoding every caller goes through.
    pub fn register_namespace(
        &self,
        fingerprint: [u8; 32],
        block_bytes: u64,
        shard: u32,
        salt: impl AsRef<[u8]>,
    ) -> Result<Namespace, ClientError> {
        match self.call(&Request::RegisterNamespace {
            fingerprint,
            shard,
            salt: namespace_salt(salt.as_ref()),
            block_bytes,
        })? {
            Response::Namespace {
                ns,
                generation,
                presence_key,
            } => Ok(Namespace {
                id: ns,
                generation,
                block_bytes,
                fingerprint,
                shard,
                presence_key,
            }),
            r => Err(Self::unexpected(r)),
        }
    }

    /// How many of `hashes`, from the first, may be present in `ns`: the
    /// prefix before the first block the Manager's presence table says is
    /// certainly absent. Sends no message: it reads the shared table (and
    /// polls the socket once, so a Manager that closed or died is reported
    /// as [`ClientError::Unavailable`] instead of answering from a dead
    /// table). A prefix > 0 promises nothing: only [`Client::lookup`] takes a
    /// lease on blocks that are there. Without a table (`--presence-slots
    /// off`) every block may be present: returns `hashes.len()`.
    pub fn probably_present(&self, ns: &Namespace, hashes: &[Hash]) -> Result<usize, ClientError> {
        self.probably_present_iter(ns, hashes.iter().copied(), hashes.len())
    }

    /// [`Client::probably_present`] over hashes produced lazily (a binding
    /// converts only those it needs: a miss stops at the first). `len` is the
    /// answer when no table is published.
    pub fn probably_present_iter(
        &self,
        ns: &Namespace,
        hashes: impl IntoIterator<Item = Hash>,
        len: usize,
    ) -> Result<usize, ClientError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::Closed);
        }
        let Some(table) = &self.presence else {
            return Ok(len);
        };
        let gone = || {
            self.conn.mark_broken();
            ClientError::Unavailable("the Manager closed the connection".into())
        };
        if self.conn.hung_up() {
            return Err(gone());
        }
        table
            .present_prefix(
                hashes
                    .into_iter()
                    .map(|h| orbitkv_shm::presence::fingerprint(&ns.presence_key, &h)),
            )
            .map_err(|_| gone())
    }

    /// Whether the Manager published a presence table to this client.
    pub fn has_presence(&self) -> bool {
        self.presence.is_some()
    }

    pub fn lookup(&self, ns: &Namespace, hashes: &[Hash]) -> Result<LookupHit, ClientError> {
        check_count(hashes.len())?;
        match self.call(&Request::Lookup {
            ns: ns.id,
            hashes: hashes.to_vec(),
        })? {
            Response::LookupOk {
                lease,
                hit_blocks,
                generation,
                ssd_blocks,
            } => {
                // The decoder checked the SSD indices against hit_blocks.
                if hit_blocks as usize > hashes.len() || (hit_blocks > 0) != (lease != 0) {
                    return Err(ClientError::Protocol("inconsistent lookup reply".into()));
                }
                Ok(LookupHit {
                    lease,
                    hit_blocks,
                    generation,
                    ssd_blocks,
                })
            }
            r => Err(Self::unexpected(r)),
        }
    }

    /// One lookup over every shard of a TP group (`shards[i]` must be shard
    /// `i` of one fingerprint and salt): the common prefix, pinned in every
    /// shard under one TP lease. Needs a Manager with `--enable-query-control`.
    pub fn lookup_tp(&self, shards: &[Namespace], hashes: &[Hash]) -> Result<TpHit, ClientError> {
        check_count(hashes.len())?;
        if shards.is_empty() || shards.len() > MAX_TP_SHARDS {
            return Err(ClientError::Invalid(format!(
                "a TP lookup declares 1 to {MAX_TP_SHARDS} shards, got {}",
                shards.len()
            )));
        }
        match self.call(&Request::LookupTp {
            nss: shards.iter().map(|n| n.id).collect(),
            hashes: hashes.to_vec(),
        })? {
            Response::TpLeaseOk {
                token,
                hit_blocks,
                generation,
                ssd_blocks,
            } => {
                if hit_blocks as usize > hashes.len() {
                    return Err(ClientError::Protocol("inconsistent TP lookup reply".into()));
                }
                Ok(TpHit {
                    token: (hit_blocks > 0).then_some(token),
                    hit_blocks,
                    ssd_blocks,
                    generation,
                })
            }
            r => Err(Self::unexpected(r)),
        }
    }

    /// Take shard `ns`'s part of the TP lease `token` into this session: an
    /// ordinary lease of this session from now on (acquire, copy, release).
    pub fn redeem_tp(&self, token: [u8; TP_TOKEN_BYTES], ns: &Namespace) -> Result<LookupHit, ClientError> {
        match self.call(&Request::RedeemTp { token, ns: ns.id })? {
            Response::LookupOk {
                lease,
                hit_blocks,
                generation,
                ssd_blocks,
            } => {
                if hit_blocks == 0 || lease == 0 {
                    return Err(ClientError::Protocol("inconsistent redeem reply".into()));
                }
                Ok(LookupHit {
                    lease,
                    hit_blocks,
                    ssd_blocks,
                    generation,
                })
            }
            r => Err(Self::unexpected(r)),
        }
    }

    /// The owner ends its TP lease: parts not redeemed are released. `Ok(false)`
    /// when it had ended already (every rank reported done, it expired, or it
    /// ended with an earlier session of this owner): nothing was left to release.
    pub fn release_tp(&self, token: [u8; TP_TOKEN_BYTES]) -> Result<bool, ClientError> {
        match self.call(&Request::ReleaseTp { token }) {
            Ok(Response::Ok) => Ok(true),
            Ok(r) => Err(Self::unexpected(r)),
            Err(ClientError::Server {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Stage the leased blocks and learn where they are: `(segment, offset)`
    /// per hit block. From here until [`Client::release`] copies may read them.
    pub fn acquire(&self, lease: u64) -> Result<Vec<(u32, u64)>, ClientError> {
        match self.call(&Request::Acquire { lease })? {
            Response::Slots { slots } => Ok(slots),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Retire a lease: the caller asserts every copy out of it has drained.
    pub fn release(&self, lease: u64) -> Result<(), ClientError> {
        match self.call(&Request::Release { lease })? {
            Response::Ok => Ok(()),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Retire leases without waiting for the Manager (`ReleaseQuiet`: no
    /// reply, one message for all of them): the caller asserts every copy out
    /// of each has drained. Requests sent after this one see them released.
    /// A lease the Manager no longer knows is counted and logged there
    /// (`quiet_release_failures_total`), not reported here; an error here
    /// means the request was not sent (the connection is gone, or too many
    /// leases: at most [`MAX_QUIET_RELEASES`]).
    pub fn release_quiet(&self, leases: &[u64]) -> Result<(), ClientError> {
        if self.quiet_release_wanted(leases)? {
            self.conn.send_releases(leases)?;
        }
        Ok(())
    }

    /// The argument checks of a quiet release: `false` for no leases (nothing
    /// to do), an error for too many or a closed client.
    fn quiet_release_wanted(&self, leases: &[u64]) -> Result<bool, ClientError> {
        if leases.len() > MAX_QUIET_RELEASES {
            return Err(ClientError::Invalid(format!(
                "a quiet release names at most {MAX_QUIET_RELEASES} leases, got {}",
                leases.len()
            )));
        }
        if leases.is_empty() {
            return Ok(false);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::Closed);
        }
        Ok(true)
    }

    /// [`Client::release_quiet`], deferred: the leases are written in front of
    /// this connection's next request (the same `write`, so the Manager's
    /// session thread wakes once for both), or by this connection's flusher
    /// thread once they have waited `ORBITKV_RELEASE_DELAY_US` (default 200;
    /// 0 sends at once). Ordered like an immediate release with every later
    /// request of this client; other sessions may see the leases held for up
    /// to the delay. An error means the connection is closing or closed.
    pub fn release_later(&self, leases: &[u64]) -> Result<(), ClientError> {
        if self.quiet_release_wanted(leases)? {
            self.conn.defer_releases(leases)?;
        }
        Ok(())
    }

    /// Copy blocks `[start, start + dst.len())` of an acquired lease into `dst`
    /// (each exactly `block_bytes` long).
    pub fn copy_out(
        &self,
        slots: &[(u32, u64)],
        block_bytes: u64,
        start: usize,
        dst: &mut [&mut [u8]],
    ) -> Result<u64, ClientError> {
        let end = start
            .checked_add(dst.len())
            .filter(|e| *e <= slots.len())
            .ok_or_else(|| {
                ClientError::Invalid(format!(
                    "blocks {start}..{} outside the {} leased",
                    start + dst.len(),
                    slots.len()
                ))
            })?;
        if let Some((i, d)) = dst
            .iter()
            .enumerate()
            .find(|(_, d)| d.len() as u64 != block_bytes)
        {
            return Err(ClientError::Size {
                what: format!("bytes of destination buffer {i} (one block)"),
                expected: block_bytes,
                actual: d.len() as u64,
            });
        }
        let _copying = self.copy_guard()?;
        let src = &slots[start..end];
        let maps: Vec<&Mapping> = src
            .iter()
            .map(|(seg, _)| self.segment(*seg))
            .collect::<Result<_, _>>()?;
        let threads = copy_threads(block_bytes as usize * dst.len());
        if threads == 1 {
            // Inline: a scoped thread per call cost more than copying 1 MiB.
            for ((d, (_, off)), m) in dst.iter_mut().zip(src).zip(&maps) {
                m.read_at(*off, d)?;
            }
            return Ok(block_bytes * dst.len() as u64);
        }
        let per = dst.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for ((d, s), m) in dst.chunks_mut(per).zip(src.chunks(per)).zip(maps.chunks(per)) {
                handles.push(scope.spawn(move || -> Result<(), ClientError> {
                    for ((d, (_, off)), m) in d.iter_mut().zip(s).zip(m) {
                        m.read_at(*off, d)?;
                    }
                    Ok(())
                }));
            }
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or(Err(ClientError::CopyPanicked)))
        })?;
        Ok(block_bytes * dst.len() as u64)
    }

    pub fn begin_save(&self, ns: &Namespace, hashes: &[Hash]) -> Result<PendingSave, ClientError> {
        check_count(hashes.len())?;
        match self.call(&Request::BeginSave {
            ns: ns.id,
            hashes: hashes.to_vec(),
        })? {
            Response::SaveBegun { save, items } => {
                if items.len() != hashes.len() {
                    return Err(ClientError::Protocol("save reply length mismatch".into()));
                }
                Ok(PendingSave {
                    id: save,
                    items: items
                        .into_iter()
                        .map(|i| match i {
                            SaveItem::Allocated { segment, offset } => {
                                SlotStatus::Allocated { segment, offset }
                            }
                            SaveItem::Present => SlotStatus::Present,
                            SaveItem::Refused => SlotStatus::Refused,
                        })
                        .collect(),
                })
            }
            r => Err(Self::unexpected(r)),
        }
    }

    pub fn commit_save(&self, save: u64) -> Result<u32, ClientError> {
        match self.call(&Request::CommitSave { save })? {
            Response::Committed { blocks } => Ok(blocks),
            r => Err(Self::unexpected(r)),
        }
    }

    pub fn abort_save(&self, save: u64) -> Result<(), ClientError> {
        match self.call(&Request::AbortSave { save })? {
            Response::Ok => Ok(()),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Allocate → copy → commit. A copy failure aborts the save (nothing
    /// becomes visible) and returns the error.
    pub fn save(&self, ns: &Namespace, hashes: &[Hash], src: &[&[u8]]) -> Result<SaveResult, ClientError> {
        if src.len() != hashes.len() {
            return Err(ClientError::Size {
                what: "source buffers (one per hash)".into(),
                expected: hashes.len() as u64,
                actual: src.len() as u64,
            });
        }
        if let Some((i, s)) = src
            .iter()
            .enumerate()
            .find(|(_, s)| s.len() as u64 != ns.block_bytes)
        {
            return Err(ClientError::Size {
                what: format!("bytes of source buffer {i} (one block)"),
                expected: ns.block_bytes,
                actual: s.len() as u64,
            });
        }
        self.require_mapped()?;
        let save = self.start_save(ns, hashes)?;
        let mut res = SaveResult::default();
        let copied = (|| -> Result<(), ClientError> {
            let _copying = self.copy_guard()?;
            let mut work: Vec<(&Mapping, u64, &[u8])> = Vec::new();
            for (st, s) in save.items().iter().zip(src) {
                match st {
                    SlotStatus::Allocated { segment, offset } => {
                        work.push((self.slot_mapping(*segment, *offset, ns.block_bytes)?, *offset, s));
                        res.bytes_copied += s.len() as u64;
                    }
                    SlotStatus::Present => res.already_present += 1,
                    SlotStatus::Refused => res.refused += 1,
                }
            }
            let threads = copy_threads(res.bytes_copied as usize);
            if threads == 1 {
                // Inline: a scoped thread per call cost more than copying 1 MiB.
                return work
                    .iter()
                    .try_for_each(|(m, off, s)| m.write_at(*off, s))
                    .map_err(ClientError::from);
            }
            let per = work.len().div_ceil(threads).max(1);
            std::thread::scope(|scope| {
                let handles: Vec<_> = work
                    .chunks(per)
                    .map(|chunk| {
                        scope.spawn(move || chunk.iter().try_for_each(|(m, off, s)| m.write_at(*off, s)))
                    })
                    .collect();
                handles.into_iter().try_for_each(|h| match h.join() {
                    Ok(r) => r.map_err(ClientError::from),
                    Err(_) => Err(ClientError::CopyPanicked),
                })
            })
        })();
        // A copy error drops `save`, which aborts it: nothing becomes visible.
        copied?;
        res.stored = save.commit()?;
        Ok(res)
    }

    /// Lookup + acquire + copy + release in one call: restores the longest hit
    /// prefix of `hashes` into the first `hit` buffers of `dst`, which holds
    /// exactly one block-sized buffer per hash.
    pub fn restore(
        &self,
        ns: &Namespace,
        hashes: &[Hash],
        dst: &mut [&mut [u8]],
    ) -> Result<u32, ClientError> {
        self.require_mapped()?;
        if dst.len() != hashes.len() {
            return Err(ClientError::Size {
                what: "destination buffers (one per hash)".into(),
                expected: hashes.len() as u64,
                actual: dst.len() as u64,
            });
        }
        if let Some((i, d)) = dst
            .iter()
            .enumerate()
            .find(|(_, d)| d.len() as u64 != ns.block_bytes)
        {
            return Err(ClientError::Size {
                what: format!("bytes of destination buffer {i} (one block)"),
                expected: ns.block_bytes,
                actual: d.len() as u64,
            });
        }
        let mut lease = self.lease(ns, hashes)?;
        let n = lease.hit_blocks() as usize;
        if n == 0 {
            return Ok(0);
        }
        // On error `lease` drops and releases (unless the Manager retired it).
        lease.copy_out(ns.block_bytes, 0, &mut dst[..n])?;
        lease.release()?;
        Ok(n as u32)
    }

    /// [`Client::lookup`] as a guard that releases the lease when dropped.
    pub fn lease(&self, ns: &Namespace, hashes: &[Hash]) -> Result<Lease<'_>, ClientError> {
        let hit = self.lookup(ns, hashes)?;
        Ok(Lease::new(self, hit))
    }

    /// [`Client::begin_save`] as a guard that aborts the save when dropped
    /// uncommitted.
    pub fn start_save(&self, ns: &Namespace, hashes: &[Hash]) -> Result<SaveGuard<'_>, ClientError> {
        let pending = self.begin_save(ns, hashes)?;
        Ok(SaveGuard::new(self, pending))
    }

    pub fn reset_generation(&self, ns: &Namespace) -> Result<u64, ClientError> {
        match self.call(&Request::ResetGeneration { ns: ns.id })? {
            Response::Generation { generation } => Ok(generation),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Make the next `restore_failures` acquires and `commit_failures` commits
    /// fail (Manager started with `--enable-fault-injection` only).
    pub fn inject_faults(&self, restore_failures: u32, commit_failures: u32) -> Result<(), ClientError> {
        match self.call(&Request::InjectFault {
            restore_failures,
            commit_failures,
        })? {
            Response::Ok => Ok(()),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Manager statistics as a JSON object text.
    pub fn stats_json(&self) -> Result<String, ClientError> {
        match self.call(&Request::Stats)? {
            Response::StatsOk { json } => Ok(json),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Drain and close: host copies are synchronous, so nothing is in flight
    /// once no call is running; the Manager then releases every hold of this
    /// session at once. Idempotent.
    pub fn close(&self) -> Result<(), ClientError> {
        // Wait for copies in flight, then refuse new ones.
        let drained = self.copies.write().unwrap_or_else(|p| p.into_inner());
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        drop(drained);
        match self.conn.call(&Request::Close)? {
            Response::Ok => Ok(()),
            Response::Error { message, .. } => Err(ClientError::Protocol(message)),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Drop the connection without a clean close (tests of the vanish path).
    pub fn abandon(self) {
        self.closed.store(true, Ordering::Release);
        self.conn.shutdown();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Domain of the tenant-salt hash; part of the namespace key, so changing it
/// moves every salted namespace.
const SALT_DOMAIN: &[u8] = b"orbitkv-namespace-salt-v1\0";

/// The one encoding of a tenant salt (any length) into the 32 bytes the
/// Manager keys namespaces by: all zeros for no salt, else SHA-256 over a
/// domain tag and the salt. Collision resistant, so no tenant can pick a
/// salt that lands in another tenant's namespace (contract K3). The Rust and
/// Python clients both go through it.
pub fn namespace_salt(salt: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    if salt.is_empty() {
        return [0; 32];
    }
    let mut h = Sha256::new();
    h.update(SALT_DOMAIN);
    h.update(salt);
    h.finalize().into()
}

fn check_count(n: usize) -> Result<(), ClientError> {
    if n > orbitkv_proto::MAX_HASHES {
        return Err(ClientError::Invalid(format!(
            "{n} hashes exceed the per-request limit {}",
            orbitkv_proto::MAX_HASHES
        )));
    }
    Ok(())
}

/// Threads [`Client::copy_out`] uses for one copy of `bytes`: one below 8 MiB
/// (spawning costs more than it saves), else `ORBITKV_COPY_THREADS` or
/// min(4, available cores).
pub fn copy_threads(bytes: usize) -> usize {
    if bytes < (8 << 20) {
        return 1;
    }
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("ORBITKV_COPY_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
    })
}

/// Fill this process's page tables for the arena on a background thread, in
/// 64 MiB steps, so connecting stays instant (no per-GiB cost) and steady-state
/// copies take no first-touch faults. Copies that race ahead simply fault.
fn prefault_in_background(segments: &[(u32, Arc<Mapping>)]) {
    let maps: Vec<Arc<Mapping>> = segments.iter().map(|(_, m)| m.clone()).collect();
    let _ = std::thread::Builder::new()
        .name("orbitkv-prefault".into())
        .spawn(move || {
            const STEP: usize = 64 << 20;
            for m in maps {
                let mut off = 0;
                while off < m.len() {
                    let len = STEP.min(m.len() - off);
                    if m.prefault(off as u64, len).is_err() {
                        return; // kernel without MADV_POPULATE_WRITE: pages fault on first touch instead
                    }
                    if Arc::strong_count(&m) == 1 {
                        return; // the client is gone
                    }
                    off += len;
                }
            }
        });
}
