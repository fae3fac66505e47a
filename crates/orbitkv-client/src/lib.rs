//! Rust client of the OrbitKV Manager.
//!
//! A [`Client`] is one session: it authenticates, maps the Manager's DRAM
//! arena (fds received over the socket) and runs host copies itself. Requests
//! are serialised on one connection; every call is blocking and bounded by the
//! configured timeout.
#![forbid(unsafe_code)]

mod conn;
mod connect;
mod copy;
mod error;
mod guard;
mod lookup;
mod namespace;
mod release_queue;
mod retain;
mod save;
mod transfer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

pub use conn::SERVER_UID_ENV;
pub use connect::ConnectOptions;
pub use copy::{EngineMemory, PageLayout, PageSpec, ReadRun, SlotCopier, WriteRun};
pub use error::ClientError;
pub use guard::{Lease, SaveGuard};
pub use lookup::{LookupHit, TpHit};
pub use namespace::{Namespace, namespace_salt};
pub use orbitkv_proto::RetainHold;
use orbitkv_proto::{ErrorCode, HASH_BYTES, Request, Response};
use orbitkv_shm::Mapping;
pub use release_queue::RELEASE_DELAY_ENV;
pub use retain::Retained;
pub use save::{PendingSave, SlotStatus};
pub use transfer::{SaveResult, copy_threads};

pub type Hash = [u8; HASH_BYTES];

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

impl Client {
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

    /// `call` for a request whose one good answer is `Ok`.
    fn call_ok(&self, req: &Request) -> Result<(), ClientError> {
        match self.call(req)? {
            Response::Ok => Ok(()),
            r => Err(Self::unexpected(r)),
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

    /// Make the next `restore_failures` acquires and `commit_failures` commits
    /// fail (Manager started with `--enable-fault-injection` only).
    pub fn inject_faults(&self, restore_failures: u32, commit_failures: u32) -> Result<(), ClientError> {
        self.call_ok(&Request::InjectFault {
            restore_failures,
            commit_failures,
        })
    }

    /// Manager statistics as a JSON object text.
    pub fn stats_json(&self) -> Result<String, ClientError> {
        match self.call(&Request::Stats)? {
            Response::StatsOk { json } => Ok(json),
            r => Err(Self::unexpected(r)),
        }
    }

    /// `orbitkv trace`: keep the Manager recording lookups, restores, releases and
    /// resets for `arm_ms` more milliseconds (0: stop), of namespaces with
    /// `fingerprint` only (all zeros: any) and of process `pid` only (0: any); the
    /// events after `cursor` (`u64::MAX`: from now on) as a JSON object text.
    pub fn trace(
        &self,
        arm_ms: u32,
        fingerprint: [u8; orbitkv_proto::HASH_BYTES],
        pid: u32,
        cursor: u64,
    ) -> Result<String, ClientError> {
        let req = Request::Trace {
            arm_ms,
            fingerprint,
            pid,
            cursor,
        };
        match self.call(&req)? {
            Response::TraceOk { json } => Ok(json),
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

fn check_count(n: usize) -> Result<(), ClientError> {
    if n > orbitkv_proto::MAX_HASHES {
        return Err(ClientError::Invalid(format!(
            "{n} hashes exceed the per-request limit {}",
            orbitkv_proto::MAX_HASHES
        )));
    }
    Ok(())
}
