//! Connecting a [`Client`]: [`ConnectOptions`] and the `connect*`
//! constructors (handshake, mapping the arena, prefaulting it in the
//! background).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use orbitkv_shm::Mapping;

use crate::{Client, ClientError, conn};

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
    /// Fill this process's page tables for the mapped arena on a background
    /// thread (the default). False for a second session of a process whose
    /// copies go through another client's mapping (a GPU copy engine pinned
    /// there): its mapping stays unpopulated until something touches it.
    pub prefault: bool,
}

impl<'a> ConnectOptions<'a> {
    /// A session that maps the arena, without token or extra trusted uid.
    pub fn new(timeout: Duration) -> ConnectOptions<'a> {
        ConnectOptions {
            token: None,
            timeout,
            map_arena: true,
            server_uid: None,
            prefault: true,
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
        if opts.prefault {
            prefault_in_background(&segments);
        }
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
