//! Real Manager processes for integration tests.
#![allow(dead_code)]

pub mod pki;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orbitkv_client::{Client, ClientError, ConnectOptions};
use orbitkv_proto::ErrorCode;

/// Set the permission bits of `p` to `mode`.
pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Write `contents` to the file `name` in `dir`, with permission bits `mode`: its path.
pub fn file_with_mode(dir: &Path, name: &str, contents: impl AsRef<[u8]>, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).expect("write");
    chmod(&p, mode);
    p
}

/// The flags of a quiet test Manager: a `dram` arena, no metrics listener,
/// warnings only.
pub fn quiet_flags(dram: &str) -> [&str; 6] {
    [
        "--dram-size",
        dram,
        "--metrics-addr",
        "off",
        "--log-level",
        "warn",
    ]
}

/// A control-only session of `m` (no arena mapped).
pub fn control(m: &ManagerProc) -> Client {
    let opts = ConnectOptions {
        map_arena: false,
        ..ConnectOptions::new(Duration::from_secs(5))
    };
    Client::connect_with(m.socket(), &opts).expect("control connect")
}

/// The code of an error the Manager answered, if that is what `e` is.
pub fn server_code(e: &ClientError) -> Option<ErrorCode> {
    match e {
        ClientError::Server { code, .. } => Some(*code),
        _ => None,
    }
}

/// Save `data` as the blocks `hashes` of namespace (`fp`, `block_bytes`)
/// through a fresh client of `m`; every block must be newly stored.
pub fn save_blocks(m: &ManagerProc, fp: [u8; 32], block_bytes: usize, hashes: &[[u8; 32]], data: &[Vec<u8>]) {
    let c = m.client();
    let ns = c.register_namespace(fp, block_bytes as u64, 0, b"").expect("ns");
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    let r = c.save(&ns, hashes, &src).expect("save");
    assert_eq!(r.stored as usize, data.len());
    c.close().expect("close");
}

/// Restore the blocks `hashes` of namespace (`fp`, `block_bytes`) through a
/// fresh client of `m`: (blocks hit, their bytes).
pub fn restore_blocks(
    m: &ManagerProc,
    fp: [u8; 32],
    block_bytes: usize,
    hashes: &[[u8; 32]],
) -> (usize, Vec<Vec<u8>>) {
    let c = m.client();
    let ns = c.register_namespace(fp, block_bytes as u64, 0, b"").expect("ns");
    let mut out = vec![vec![0u8; block_bytes]; hashes.len()];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let hit = c.restore(&ns, hashes, &mut dst).expect("restore") as usize;
    c.close().expect("close");
    out.truncate(hit);
    (hit, out)
}

/// A TCP port on loopback that was free a moment ago (for `--peer-listen`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A TCP listener that is no Manager: it reads a request, answers `reply` if
/// any (garbage) or nothing (a silent peer), and holds the connection 30 s.
pub fn fake_peer(reply: Option<&'static [u8]>) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                if let Some(bytes) = reply {
                    let _ = s.write_all(bytes);
                }
                std::thread::sleep(Duration::from_secs(30));
            });
        }
    });
    port
}

pub struct ManagerProc {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
}

impl ManagerProc {
    pub fn start(extra: &[&str]) -> ManagerProc {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("m.sock");
        // Small arenas unless a test sizes its own: the arena is populated at start.
        let default_size: &[&str] = if extra.contains(&"--dram-size") {
            &[]
        } else {
            &["--dram-size", "8MiB"]
        };
        let child = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
            .arg("--socket")
            .arg(&socket)
            .args(default_size)
            .args(["--metrics-addr", "off", "--log-level", "warn"])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn manager");
        let m = ManagerProc { child, socket, dir };
        m.wait_ready();
        m
    }

    fn wait_ready(&self) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("manager did not come up on {}", self.socket.display());
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket, None, Duration::from_secs(5)).expect("connect")
    }

    pub fn stats(&self) -> serde_json::Value {
        let c = self.client();
        let s = c.stats_json().expect("stats");
        c.close().expect("close");
        serde_json::from_str(&s).expect("json")
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `f` until it returns true or 5 s pass.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for: {what}");
}

pub fn block(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn hash(chain: u8, i: u8) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0] = chain;
    h[1] = i;
    h[31] = 0xAB;
    h
}

/// Read a raw session's `HelloOk` and the `ArenaFds` batches that follow it
/// (their fds are dropped with the control messages a plain read does not
/// ask for); returns the segment count announced.
#[allow(dead_code)] // not every test binary opens raw sessions
pub fn read_hello(s: &mut std::os::unix::net::UnixStream) -> usize {
    use orbitkv_proto::{FD_BATCH, Response, decode_response, read_frame};
    let (h, body) = read_frame(s).expect("hello ok");
    let Ok(Response::HelloOk { segments, .. }) = decode_response(h.kind, &body) else {
        panic!("expected HelloOk, got kind {:#x}", h.kind)
    };
    for batch in 0..segments.len().div_ceil(FD_BATCH) {
        let (h, body) = read_frame(s).expect("arena fds");
        let Ok(Response::ArenaFds { first, .. }) = decode_response(h.kind, &body) else {
            panic!("expected ArenaFds, got kind {:#x}", h.kind)
        };
        assert_eq!(first as usize, batch * FD_BATCH);
    }
    segments.len()
}
