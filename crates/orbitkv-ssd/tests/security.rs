//! The tier directory is private: created 0700 with 0600 files, older open modes are
//! tightened, and a directory another user could write (or owns) is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use orbitkv_ssd::{EnginePref, IoMode, SsdError, SsdTier};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").mode() & 0o7777
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
}

/// Every regular file in `dir` and its mode.
fn file_modes(dir: &Path) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_type().expect("type").is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), mode(&e.path())))
        .collect();
    v.sort();
    v
}

fn write_some(t: &SsdTier, n: u64) {
    for i in 0..n {
        t.write(key(i), &payload(i, 5000)).expect("write");
    }
}

#[test]
fn new_directory_and_files_are_private() {
    let d = tempdir();
    // A permissive parent, as a shared cache root might be; the tier dir is created inside.
    chmod(d.path(), 0o755);
    let dir = d.path().join("ssd");
    let mut c = cfg(&dir, IoMode::Kernel, EnginePref::Psync);
    c.journal_compact_min_records = 4; // also exercise the compaction rewrite
    let (t, _) = open(&c);
    write_some(&t, 12);
    t.compact_journal().expect("compact");
    assert_eq!(mode(&dir), 0o700, "tier directory mode");
    let files = file_modes(&dir);
    assert_eq!(
        files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["LOCK", "data.okv", "journal.okvj"]
    );
    for (name, m) in &files {
        assert_eq!(*m, 0o600, "{name} mode {m:04o}");
    }
}

#[test]
fn open_modes_of_an_older_version_are_tightened() {
    let d = tempdir();
    let dir = d.path().join("ssd");
    let c = cfg(&dir, IoMode::Kernel, EnginePref::Psync);
    {
        let (t, _) = open(&c);
        write_some(&t, 3);
    }
    // What an older version left: 0755 directory, 0644 files.
    chmod(&dir, 0o755);
    for (name, _) in file_modes(&dir) {
        chmod(&dir.join(name), 0o644);
    }
    let (t, rep) = open(&c);
    assert_eq!(mode(&dir), 0o700);
    for (name, m) in file_modes(&dir) {
        assert_eq!(m, 0o600, "{name} mode {m:04o}");
    }
    assert!(rep.tightened.contains(&dir), "{:?}", rep.tightened);
    assert!(
        rep.tightened.contains(&dir.join(orbitkv_ssd::DATA_FILE)),
        "{:?}",
        rep.tightened
    );
    // The data survived.
    let mut buf = vec![0u8; 5000];
    for i in 0..3 {
        assert_eq!(t.read(key(i), &mut buf).expect("read"), 5000);
        assert_eq!(buf, payload(i, 5000));
    }
}

/// Open a tier on `dir`, which must be refused as an insecure directory
/// naming `dir`: the error's text. A failure names `what` `dir` is, after
/// `prefix`.
fn refused_as_insecure(dir: &Path, prefix: &str, what: &str) -> String {
    let c = cfg(dir, IoMode::Kernel, EnginePref::Psync);
    match SsdTier::open(c, &mut |_| {}) {
        Err(e @ SsdError::InsecureDir { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&dir.display().to_string()), "{msg}");
            msg
        }
        Err(e) => panic!("{prefix}wrong error {e}"),
        Ok(_) => panic!("{prefix}{what} was accepted"),
    }
}

#[test]
fn directory_writable_by_others_is_refused_with_the_fix() {
    for m in [0o777, 0o770, 0o702, 0o1777] {
        let d = tempdir();
        let dir = d.path().join("ssd");
        std::fs::create_dir(&dir).expect("mkdir");
        chmod(&dir, m);
        let msg = refused_as_insecure(&dir, &format!("mode {m:o}: "), "a directory others can write");
        assert!(msg.contains("chmod 700"), "{msg}");
        assert!(msg.contains("writable by group or others"), "{msg}");
        // Nothing was created in it.
        assert!(file_modes(&dir).is_empty(), "mode {m:o}");
    }
}

#[test]
fn directory_owned_by_another_uid_is_refused() {
    let me = euid();
    if me != 0 {
        eprintln!("skipped: chown to another uid needs root (running as uid {me})");
        return;
    }
    let d = tempdir();
    let dir = d.path().join("ssd");
    std::fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o700);
    std::os::unix::fs::chown(&dir, Some(4242), Some(4242)).expect("chown");
    let msg = refused_as_insecure(&dir, "", "a directory owned by another uid");
    assert!(msg.contains("uid 4242"), "{msg}");
    assert!(msg.contains("chown"), "{msg}");
}

/// The effective uid, read from /proc (no libc call needed in tests).
fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid line");
    line.split_whitespace()
        .nth(2)
        .expect("euid")
        .parse()
        .expect("number")
}
