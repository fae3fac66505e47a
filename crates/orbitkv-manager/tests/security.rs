//! Local-attacker holes: who owns the socket directory, what sits at the
//! socket path, who may read the token file, and who answers a client.
//! Tests that act as another uid need root and are skipped (with a printed
//! reason) otherwise.

mod support;

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use orbitkv_client::{Client, ClientError, ConnectOptions};
use support::{ManagerProc, chmod, quiet_flags};

const NOBODY: u32 = 65534;
const TOKEN: &str = "0123456789abcdef-secret";

fn is_root() -> bool {
    orbitkv_shm::peer::my_uid() == 0
}

/// True, the reason printed, where this test is skipped: it needs root to do
/// what `needs` says.
fn skipped_unless_root(needs: &str) -> bool {
    if is_root() {
        return false;
    }
    println!("skipped: needs root to {needs}");
    true
}

/// A new directory `name` in `parent`: mode 0700, owned by uid 65534.
fn private_dir_of_nobody(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o700);
    chown(&dir, NOBODY);
    dir
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).expect("chown");
}

/// Run a Manager that must refuse to start: its exit code and stderr. A
/// Manager that starts anyway is killed and the test fails.
fn refused_start(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .args(quiet_flags("4MiB"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn manager");
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.code(), err);
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the Manager started with {args:?}; it must have refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll `f` until it holds; generous, for a loaded CI machine.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn socket_directory_is_created_private_and_reused_only_when_private() {
    let root = tempfile::tempdir().expect("tmp");
    // Created by the Manager: 0700, ours.
    let fresh = root.path().join("fresh");
    let sock = fresh.join("m.sock");
    let m = spawn_on(&sock);
    until("manager up", || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let meta = std::fs::symlink_metadata(&fresh).expect("stat");
    assert_eq!(meta.mode() & 0o777, 0o700);
    drop(m);

    // An existing directory open to group or others is refused, left as it is.
    for mode in [0o777, 0o770, 0o722, 0o1777] {
        let dir = root.path().join(format!("open{mode:o}"));
        std::fs::create_dir(&dir).expect("mkdir");
        chmod(&dir, mode);
        let sock = dir.join("m.sock");
        let (code, err) = refused_start(&["--socket", sock.to_str().expect("utf8")]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(&format!("unsafe socket directory {}", dir.display()))
                && err.contains(&format!("mode {mode:04o}")),
            "{err}"
        );
        if mode & 0o1000 == 0 {
            assert!(err.contains(&format!("chmod 700 {}", dir.display())), "{err}");
        } else {
            assert!(err.contains("shared directory"), "{err}");
        }
        assert!(!sock.exists(), "nothing bound in {}", dir.display());
        assert_eq!(std::fs::metadata(&dir).expect("stat").mode() & 0o7777, mode);
    }

    // A symlink standing for the directory is refused, whatever it points to.
    let real = root.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    chmod(&real, 0o700);
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let (code, err) = refused_start(&["--socket", link.join("m.sock").to_str().expect("utf8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is a symbolic link"), "{err}");
}

#[test]
fn socket_directory_of_another_uid_is_refused() {
    if skipped_unless_root("chown a directory to another uid") {
        return;
    }
    let root = tempfile::tempdir().expect("tmp");
    let dir = private_dir_of_nobody(root.path(), "squatted");
    let (code, err) = refused_start(&["--socket", dir.join("m.sock").to_str().expect("utf8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("unsafe socket directory {}", dir.display()))
            && err.contains("owned by uid 65534, not by this Manager's uid 0"),
        "{err}"
    );
}

#[test]
fn only_a_stale_socket_is_replaced_anything_else_at_the_path_is_left_alone() {
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("m.sock");

    std::fs::write(&sock, b"precious data").expect("write");
    let (code, err) = refused_start(&["--socket", sock.to_str().expect("utf8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{} exists and is a regular file, not a socket",
            sock.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(&sock).expect("still there"), b"precious data");
    std::fs::remove_file(&sock).expect("rm");

    std::fs::create_dir(&sock).expect("mkdir");
    std::fs::write(sock.join("inside"), b"x").expect("write");
    let (code, err) = refused_start(&["--socket", sock.to_str().expect("utf8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is a directory, not a socket"), "{err}");
    assert!(sock.join("inside").exists());
    std::fs::remove_dir_all(&sock).expect("rm");

    let target = dir.path().join("target");
    std::fs::write(&target, b"t").expect("write");
    std::os::unix::fs::symlink(&target, &sock).expect("symlink");
    let (code, err) = refused_start(&["--socket", sock.to_str().expect("utf8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is a symbolic link, not a socket"), "{err}");
    assert!(
        std::fs::symlink_metadata(&sock)
            .expect("link kept")
            .file_type()
            .is_symlink()
    );
    std::fs::remove_file(&sock).expect("rm");

    // A socket nobody listens on (a dead Manager's) is replaced.
    drop(UnixListener::bind(&sock).expect("bind"));
    let m = spawn_on(&sock);
    until("manager up on the stale path", || {
        Client::connect(&sock, None, Duration::from_secs(5)).is_ok()
    });
    drop(m);
}

struct KillOnDrop(std::process::Child);

/// A Manager on `sock` (quiet flags, a 4 MiB arena), killed on drop.
fn spawn_on(sock: &Path) -> KillOnDrop {
    let m = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .args(quiet_flags("4MiB"))
        .arg("--socket")
        .arg(sock)
        .spawn()
        .expect("spawn");
    KillOnDrop(m)
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn token_file_open_to_group_or_others_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let tok = dir.path().join("token");
    std::fs::write(&tok, format!("{TOKEN}\n")).expect("write");
    chmod(&tok, 0o644);
    let t = tok.to_str().expect("utf8");
    let (code, err) = refused_start(&[
        "--socket",
        dir.path().join("m.sock").to_str().expect("utf8"),
        "--token-file",
        t,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "token file {t} is accessible by group/others (mode 0644)"
        )) && err.contains(&format!("chmod 600 {t}")),
        "{err}"
    );
    chmod(&tok, 0o600);
    let m = ManagerProc::start(&["--token-file", t]);
    let c =
        Client::connect(m.socket(), Some(TOKEN.as_bytes()), Duration::from_secs(5)).expect("private token");
    c.close().expect("close");
}

/// Spawn a just-copied executable. Another test thread that forks while the
/// copy's write descriptor is open holds it until its child execs (the copy's
/// descriptor is close-on-exec, not close-on-fork), and exec then fails with
/// ETXTBSY: retry briefly.
fn spawn_retrying_busy(
    mut spawn: impl FnMut() -> std::io::Result<std::process::Child>,
) -> std::io::Result<std::process::Child> {
    for _ in 0..100 {
        match spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
    spawn()
}

/// A Manager run by uid 65534 that admits root with a token. A client of
/// root refuses it unless told to trust 65534, and sends it nothing.
#[test]
fn client_checks_who_answers_before_sending_the_token() {
    if skipped_unless_root("run a Manager as another uid") {
        return;
    }
    let root = tempfile::tempdir().expect("tmp");
    chmod(root.path(), 0o711); // uid 65534 may pass through, not list
    let dir = private_dir_of_nobody(root.path(), "srv");
    let tok = root.path().join("token");
    std::fs::write(&tok, format!("{TOKEN}\n")).expect("write");
    chmod(&tok, 0o600);
    chown(&tok, NOBODY);
    let sock = dir.join("m.sock");
    // A copy uid 65534 can execute: the build directory may sit below a private one
    // (a checkout in a `mktemp -d` directory is 0700).
    let exe = root.path().join("orbitkv-manager");
    std::fs::copy(env!("CARGO_BIN_EXE_orbitkv-manager"), &exe).expect("copy manager binary");
    chmod(&exe, 0o755);
    let m = spawn_retrying_busy(|| {
        Command::new(&exe)
            .args([
                "--dram-size",
                "4MiB",
                "--metrics-addr",
                "off",
                "--allow-uid",
                "0",
                "--socket",
            ])
            .arg(&sock)
            .arg("--token-file")
            .arg(&tok)
            .uid(NOBODY)
            .gid(NOBODY)
            .spawn()
    })
    .expect("spawn manager as uid 65534");
    let _m = KillOnDrop(m);
    until("manager of uid 65534 up", || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });

    // A wrong token: had it been sent, the Manager would count a refusal.
    let wrong = b"0123456789abcdef-wrong";
    let e = Client::connect(&sock, Some(wrong), Duration::from_secs(5)).expect_err("untrusted");
    assert!(
        matches!(e, ClientError::UntrustedServer(ref s)
            if s.contains("runs as uid 65534, not as this process's uid 0") && s.contains("nothing was sent")),
        "{e}"
    );
    let e = Client::connect_control(&sock, Some(wrong), Duration::from_secs(5)).expect_err("untrusted");
    assert!(matches!(e, ClientError::UntrustedServer(_)), "{e}");
    let other = ConnectOptions {
        token: Some(wrong),
        server_uid: Some(4242),
        ..ConnectOptions::new(Duration::from_secs(5))
    };
    let e = Client::connect_with(&sock, &other).expect_err("trusts another uid");
    assert!(
        matches!(e, ClientError::UntrustedServer(ref s) if s.contains("or the trusted uid 4242")),
        "{e}"
    );

    let trusted = ConnectOptions {
        token: Some(TOKEN.as_bytes()),
        server_uid: Some(NOBODY),
        ..ConnectOptions::new(Duration::from_secs(5))
    };
    let c = Client::connect_with(&sock, &trusted).expect("trusted Manager");
    let st: serde_json::Value = serde_json::from_str(&c.stats_json().expect("stats")).expect("json");
    assert_eq!(st["auth_refused_total"], 0, "a token reached the Manager: {st}");
    c.close().expect("close");
}
