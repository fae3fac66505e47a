//! Shared test helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

pub mod small_fs;

use std::os::unix::fs::FileExt;
use std::path::Path;

use orbitkv_ssd::format::{BlockHeader, HEADER_SIZE};
use orbitkv_ssd::{EnginePref, IoMode, SsdConfig, SsdKey, SsdTier};

pub fn key(n: u64) -> SsdKey {
    let mut fp = [0u8; 32];
    fp[..8].copy_from_slice(&n.to_le_bytes());
    SsdKey {
        fingerprint: fp,
        shard: (n % 8) as u32,
        salt: [0xa5; 32],
        generation: n,
        hash: [(n % 251) as u8; 32],
    }
}

/// Deterministic payload for key `n`.
pub fn payload(n: u64, len: usize) -> Vec<u8> {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A 4096-aligned, zeroed buffer of `len` bytes (backed by a larger Vec).
pub struct Aligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let v = vec![0u8; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        Aligned { v, off, len }
    }
    pub fn from(data: &[u8]) -> Aligned {
        let mut a = Aligned::new(data.len());
        a.as_mut()[..data.len()].copy_from_slice(data);
        a
    }
    pub fn as_ref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

pub fn cfg(dir: &Path, mode: IoMode, engine: EnginePref) -> SsdConfig {
    let mut c = SsdConfig::new(dir, 64 << 20);
    c.mode = mode;
    c.engine = engine;
    c.queue_depth = 16;
    c.psync_threads = 4;
    c
}

pub fn open(c: &SsdConfig) -> (SsdTier, orbitkv_ssd::RecoveryReport) {
    match SsdTier::open(c.clone(), &mut |_| {}) {
        Ok(x) => x,
        Err(e) => panic!("open failed: {e}"),
    }
}

/// Byte offset of the extent holding `key`, found by scanning headers.
pub fn find_extent(dir: &Path, key: &SsdKey) -> Option<u64> {
    let f = std::fs::File::open(dir.join(orbitkv_ssd::DATA_FILE)).ok()?;
    let len = f.metadata().ok()?.len();
    let mut buf = vec![0u8; HEADER_SIZE];
    let mut off = 0;
    while off + HEADER_SIZE as u64 <= len {
        f.read_exact_at(&mut buf, off).ok()?;
        if let Ok(h) = BlockHeader::decode(&buf)
            && h.key == *key
        {
            return Some(off);
        }
        off += 4096;
    }
    None
}

pub fn patch(dir: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(orbitkv_ssd::DATA_FILE))
        .expect("open data file");
    f.write_all_at(bytes, off).expect("patch");
    f.sync_all().expect("sync");
}

pub fn read_at(dir: &Path, off: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(dir.join(orbitkv_ssd::DATA_FILE)).expect("open");
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).expect("read");
    b
}

pub fn tempdir() -> tempfile::TempDir {
    // The system temp dir is ext4 here; never /dev/shm (no O_DIRECT).
    tempfile::Builder::new()
        .prefix("orbitkv-ssd-test")
        .tempdir_in(std::env::temp_dir())
        .expect("tempdir")
}
