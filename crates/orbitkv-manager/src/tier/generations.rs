//! The generations file: every fingerprint's generation, persisted next to the
//! SSD tier so a restart never serves blocks of a generation that was reset.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use orbitkv_core::Fingerprint;

const GENERATIONS_FILE: &str = "generations.v1";

pub(super) fn load_generations(dir: &Path) -> Vec<(Fingerprint, u64)> {
    let Ok(text) = std::fs::read_to_string(dir.join(GENERATIONS_FILE)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(hex), Some(g)) = (it.next(), it.next()) else {
            continue;
        };
        let (Some(fp), Ok(g)) = (decode_hex32(hex), g.parse::<u64>()) else {
            log!(Warn, "ignoring malformed line in {GENERATIONS_FILE}: {line:?}");
            continue;
        };
        out.push((Fingerprint(fp), g));
    }
    out
}

fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Persist every fingerprint's generation (atomic replace + fsync), so a
/// restart never serves blocks of a generation that was reset.
pub fn persist_generations(dir: &Path, table: &[(Fingerprint, u64)]) -> std::io::Result<()> {
    let tmp: PathBuf = dir.join(format!("{GENERATIONS_FILE}{}", orbitkv_ssd::TEMP_SUFFIX));
    let res = write_generations(&tmp, table).and_then(|()| std::fs::rename(&tmp, dir.join(GENERATIONS_FILE)));
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp); // e.g. a full disk: leave nothing behind
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Write the table to a new owner-only file and fsync it.
fn write_generations(tmp: &Path, table: &[(Fingerprint, u64)]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(orbitkv_ssd::FILE_MODE)
        .open(tmp)?;
    for (fp, g) in table {
        let hex: String = fp.0.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(f, "{hex} {g}")?;
    }
    f.sync_all()
}

#[cfg(test)]
mod ssd_file_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn generations_file_is_private_and_leaves_no_temporary() {
        let d = tempfile::tempdir().expect("tempdir");
        let table = [(Fingerprint([7; 32]), 3u64)];
        persist_generations(d.path(), &table).expect("persist");
        let md = std::fs::metadata(d.path().join(GENERATIONS_FILE)).expect("stat");
        assert_eq!(md.mode() & 0o777, 0o600, "mode {:o}", md.mode() & 0o777);
        assert_eq!(load_generations(d.path()), table.to_vec());
        let names: Vec<_> = std::fs::read_dir(d.path())
            .expect("list")
            .map(|e| e.expect("e").file_name())
            .collect();
        assert_eq!(names, [GENERATIONS_FILE]);
    }
}
