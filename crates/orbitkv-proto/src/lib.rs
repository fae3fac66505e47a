//! The OrbitKV control protocol.
//!
//! Every message is one frame: a 16-byte header followed by a body.
//!
//! ```text
//! offset  size  field
//!      0     4  magic  b"OKV\x01"
//!      4     2  protocol version (little endian)
//!      6     2  message kind
//!      8     4  body length (≤ MAX_BODY)
//!     12     4  request id (echoed in the reply)
//! ```
//!
//! Bodies are little-endian fixed-width fields; sequences carry a `u32` count
//! and are bounded. Decoding never panics and rejects trailing bytes. File
//! descriptors travel as `SCM_RIGHTS`: the presence table's (read-only) with the
//! `HelloOk` frame when the Manager publishes one (`HelloOk.presence_slots > 0`);
//! the arena segments' in the `ArenaFds` frames that follow `HelloOk`, at most
//! [`FD_BATCH`] per frame, in segment order, except to a control-only session
//! (`Hello` flag [`HELLO_CONTROL_ONLY`]), which gets none. A client maps each
//! batch and closes its fds before reading the next, so an arena of any segment
//! count needs at most `FD_BATCH` free descriptors in the client.
//! These are the only serialisable types of OrbitKV's IPC boundary.
#![forbid(unsafe_code)]

mod codec;
mod frame;
mod msg;
pub mod peer;

pub use codec::DecodeError;
pub use frame::{
    FIRST_BODY_CHUNK, FrameError, FrameGuard, HEADER_LEN, Header, MAGIC, MAX_BODY, read_frame,
    read_frame_guarded, write_frame,
};
pub use msg::{
    ErrorCode, Kind, LookupGrant, Request, Response, RetainHold, SaveItem, SegmentInfo, TpGrant,
    decode_request, decode_response,
};

/// Protocol version spoken by this build. 2: `LookupOk` names the SSD-only hit blocks;
/// `LookupTp` / `RedeemTp` / `ReleaseTp` / `TpLeaseOk`. 3: the presence table
/// (`HelloOk.presence_slots` and its fd, `Namespace.presence_key`). 4: `ReleaseQuiet`,
/// the one request with no reply. 5: arena fds in `ArenaFds` batches after `HelloOk`
/// (any segment count up to [`MAX_SEGMENTS`]); `Trace` / `TraceOk` (`orbitkv trace`), a
/// diagnostic a Manager without it answers with `BadFrame` (the session continues). A client
/// and a Manager of different versions refuse each other's first frame, naming both versions.
pub const PROTOCOL_VERSION: u16 = 5;
/// Most arena segments a Manager may have (and a `HelloOk` may announce). Each
/// is one fd in the Manager and one mapping in every client that maps the arena
/// (`vm.max_map_count` is 65,530 by default).
pub const MAX_SEGMENTS: usize = 16_384;
/// Most arena fds one `ArenaFds` frame carries: the most a client must have free
/// below its `RLIMIT_NOFILE` during the handshake.
pub const FD_BATCH: usize = 32;
/// Bytes of a namespace's presence key.
pub const PRESENCE_KEY_BYTES: usize = 16;
/// Bytes per block hash.
pub const HASH_BYTES: usize = 32;
/// Most hashes one request may carry.
pub const MAX_HASHES: usize = 65_536;
/// The longest keep a retention hint may ask for (24 hours; the Manager's core
/// checks the same bound).
pub const MAX_RETAIN_TTL_MS: u32 = 24 * 3600 * 1000;
/// Most leases one `ReleaseQuiet` request may name.
pub const MAX_QUIET_RELEASES: usize = 4096;
/// `Hello` flag: a control-only session. The Manager passes it no arena fds
/// and refuses it every request that hands out arena addresses (`Acquire`,
/// `BeginSave`), so it can never copy; its leases are released the moment its
/// connection drops.
pub const HELLO_CONTROL_ONLY: u32 = 1;
/// Every `Hello` flag this build knows; other bits are refused.
pub const HELLO_KNOWN_FLAGS: u32 = HELLO_CONTROL_ONLY;
/// Longest token accepted in `Hello`.
pub const MAX_TOKEN: usize = 1024;
/// Longest `Hello` body (pid, flags, token length, token): a first frame that
/// announces more is refused before any of it is buffered.
pub const MAX_HELLO_BODY: usize = 12 + MAX_TOKEN;
/// Longest error or stats text.
pub const MAX_TEXT: usize = 1 << 20;
/// Bytes of a TP lease token (128 random bits drawn by the Manager).
pub const TP_TOKEN_BYTES: usize = 16;
/// Most shards one TP lookup may declare.
pub const MAX_TP_SHARDS: usize = 64;

/// Default Manager socket: `$ORBITKV_SOCKET`, else
/// `$XDG_RUNTIME_DIR/orbitkv/manager.sock`, else `/tmp/orbitkv-<uid>/manager.sock`.
pub fn default_socket_path(uid: u32) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("ORBITKV_SOCKET").filter(|p| !p.is_empty()) {
        return p.into();
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        return std::path::PathBuf::from(d).join("orbitkv").join("manager.sock");
    }
    std::path::PathBuf::from(format!("/tmp/orbitkv-{uid}")).join("manager.sock")
}
