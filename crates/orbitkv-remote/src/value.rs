//! The value every block carries in the remote store, and its verification.
//!
//! A value is a 160-byte header followed by the block's bytes. All integers are
//! little-endian.
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0   | 8    | magic `OKVREMTV` |
//! | 8   | 2    | format version ([`FORMAT_VERSION`]) |
//! | 10  | 2    | flags (0) |
//! | 12  | 4    | header bytes ([`HEADER_BYTES`]) |
//! | 16  | 108  | the block's full key ([`SsdKey`]: fingerprint, shard, salt, generation, hash) |
//! | 124 | 8    | payload length in bytes |
//! | 132 | 8    | xxh3-64 of the payload |
//! | 140 | 8    | xxh3-64 of bytes 0..140 |
//! | 148 | 12   | zero |
//!
//! The store is shared by every host and may evict, lose or overwrite any value; another
//! writer may use the same key for other bytes. So a value is served only when its
//! header names exactly the block asked for, with the length the reader's namespace
//! expects, and its payload matches the checksum: [`verify`] returns the payload or the
//! reason it is a miss.

use orbitkv_ssd::{KEY_BYTES, SsdKey};
use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_64;

/// Magic at the start of every value.
pub const MAGIC: [u8; 8] = *b"OKVREMTV";
/// Current value format version.
pub const FORMAT_VERSION: u16 = 1;
/// Bytes of the header in front of the payload.
pub const HEADER_BYTES: usize = 160;
const KEY_AT: usize = 16;
const LEN_AT: usize = KEY_AT + KEY_BYTES;
const PAYLOAD_SUM_AT: usize = LEN_AT + 8;
const HEADER_SUM_AT: usize = PAYLOAD_SUM_AT + 8;
const _: () = assert!(HEADER_SUM_AT + 8 <= HEADER_BYTES);

/// Why a value read from the store is not served (each is a miss).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// Shorter than a header.
    Truncated,
    /// Not an OrbitKV value.
    Magic,
    /// Written by another format version.
    Version(u16),
    /// Unknown flags or header size.
    Header,
    /// The header's checksum does not match.
    HeaderSum,
    /// A value of another block (another namespace, salt, generation or hash).
    OtherKey,
    /// The header's length is not the namespace's block size.
    Length {
        /// What the header says.
        stored: u64,
        /// What the reader's namespace expects.
        expected: u64,
    },
    /// The bytes after the header are not as long as the header says.
    PayloadLength,
    /// The payload's checksum does not match (torn, truncated or corrupted).
    PayloadSum,
}

impl Mismatch {
    /// A short name for logs and metric labels.
    pub fn reason(self) -> &'static str {
        match self {
            Mismatch::Truncated => "truncated",
            Mismatch::Magic => "magic",
            Mismatch::Version(_) => "version",
            Mismatch::Header => "header",
            Mismatch::HeaderSum => "header_checksum",
            Mismatch::OtherKey => "other_key",
            Mismatch::Length { .. } => "length",
            Mismatch::PayloadLength => "payload_length",
            Mismatch::PayloadSum => "payload_checksum",
        }
    }
}

/// The header of `payload` stored under `key`.
pub fn encode_header(key: &SsdKey, payload: &[u8]) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    let mut k = [0u8; KEY_BYTES];
    key.encode(&mut k);
    h[KEY_AT..LEN_AT].copy_from_slice(&k);
    h[LEN_AT..PAYLOAD_SUM_AT].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[PAYLOAD_SUM_AT..HEADER_SUM_AT].copy_from_slice(&xxh3_64(payload).to_le_bytes());
    let sum = xxh3_64(&h[..HEADER_SUM_AT]);
    h[HEADER_SUM_AT..HEADER_SUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    h
}

/// The whole value of `payload` stored under `key` (header, then payload).
pub fn encode(key: &SsdKey, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_BYTES + payload.len());
    v.extend_from_slice(&encode_header(key, payload));
    v.extend_from_slice(payload);
    v
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The payload of `value` when it is exactly block `want` of `block_bytes` bytes,
/// intact; otherwise why it is a miss. Never panics, whatever the bytes.
pub fn verify<'v>(value: &'v [u8], want: &SsdKey, block_bytes: u64) -> Result<&'v [u8], Mismatch> {
    if value.len() < HEADER_BYTES {
        return Err(Mismatch::Truncated);
    }
    let (h, payload) = value.split_at(HEADER_BYTES);
    if h[0..8] != MAGIC {
        return Err(Mismatch::Magic);
    }
    let version = u16::from_le_bytes([h[8], h[9]]);
    if version != FORMAT_VERSION {
        return Err(Mismatch::Version(version));
    }
    if h[10..12] != [0, 0]
        || h[12..16] != (HEADER_BYTES as u32).to_le_bytes()
        || h[HEADER_SUM_AT + 8..] != [0; 12]
    {
        return Err(Mismatch::Header);
    }
    if u64_at(h, HEADER_SUM_AT) != xxh3_64(&h[..HEADER_SUM_AT]) {
        return Err(Mismatch::HeaderSum);
    }
    let mut k = [0u8; KEY_BYTES];
    want.encode(&mut k);
    if h[KEY_AT..LEN_AT] != k {
        return Err(Mismatch::OtherKey);
    }
    let stored = u64_at(h, LEN_AT);
    if stored != block_bytes {
        return Err(Mismatch::Length {
            stored,
            expected: block_bytes,
        });
    }
    if payload.len() as u64 != stored {
        return Err(Mismatch::PayloadLength);
    }
    if u64_at(h, PAYLOAD_SUM_AT) != xxh3_64(payload) {
        return Err(Mismatch::PayloadSum);
    }
    Ok(payload)
}

/// The store key of block `key` under `prefix`: `prefix` + the hex SHA-256 of the
/// block's full key. The digest keeps model fingerprints and salts out of key names
/// (anyone who can list the store's keys learns nothing about whose blocks they are),
/// and spreads blocks over the cluster's hash slots.
pub fn store_key(prefix: &str, key: &SsdKey) -> String {
    let mut k = [0u8; KEY_BYTES];
    key.encode(&mut k);
    let digest = Sha256::digest(k);
    let mut out = String::with_capacity(prefix.len() + 64);
    out.push_str(prefix);
    for b in digest {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    out
}
