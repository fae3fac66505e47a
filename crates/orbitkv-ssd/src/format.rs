//! On-disk formats: the 4 KiB block header that starts every extent of the data file,
//! and the fixed-size records of the metadata journal. All integers are little-endian.
//!
//! Block header (first 156 bytes of a 4096-byte sector, rest zero):
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0   | 8    | magic `OKVSSDBK` |
//! | 8   | 4    | format version |
//! | 12  | 4    | flags (0) |
//! | 16  | 8    | sequence number of the write |
//! | 24  | 108  | key (fingerprint, shard, salt, generation, hash) |
//! | 132 | 8    | payload length in bytes |
//! | 140 | 8    | xxh3-64 of the payload |
//! | 148 | 8    | xxh3-64 of bytes 0..148 |
//!
//! Journal record (160 bytes):
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0   | 4    | magic `OKVJ` |
//! | 4   | 2    | format version |
//! | 6   | 2    | kind (1 = put, 2 = remove) |
//! | 8   | 8    | sequence number |
//! | 16  | 108  | key |
//! | 124 | 4    | data file index (0) |
//! | 128 | 8    | extent byte offset |
//! | 136 | 8    | payload length |
//! | 144 | 8    | xxh3-64 of the payload |
//! | 152 | 8    | xxh3-64 of bytes 0..152 |

use crate::key::{KEY_BYTES, SsdKey};
use xxhash_rust::xxh3::xxh3_64;

/// Current on-disk format version (block headers and journal records).
pub const FORMAT_VERSION: u32 = 1;
/// Alignment and unit of allocation.
pub const SECTOR: u64 = 4096;
/// Size of the header sector in front of every payload.
pub const HEADER_SIZE: usize = 4096;
/// Magic at the start of a block header.
pub const BLOCK_MAGIC: [u8; 8] = *b"OKVSSDBK";
/// Bytes of the header that carry data (the rest is zero).
pub const HEADER_USED: usize = 156;
/// Magic at the start of a journal record.
pub const JOURNAL_MAGIC: [u8; 4] = *b"OKVJ";
/// Size of one journal record.
pub const JOURNAL_RECORD_SIZE: usize = 160;

/// Checksum used for payloads, headers and journal records.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// Round up to the next multiple of [`SECTOR`] (saturating, for lengths read from disk).
pub fn round_up(n: u64) -> u64 {
    n.div_ceil(SECTOR).saturating_mul(SECTOR)
}

/// Bytes an extent of a payload of `len` bytes occupies (header plus rounded payload);
/// saturates instead of overflowing.
pub fn extent_bytes(len: u64) -> u64 {
    SECTOR.saturating_add(round_up(len))
}

/// A decoded block header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// Format version.
    pub version: u32,
    /// Write sequence number.
    pub seq: u64,
    /// Full key.
    pub key: SsdKey,
    /// Payload length.
    pub len: u64,
    /// Payload checksum.
    pub payload_sum: u64,
}

/// Why a header or record did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Magic bytes absent: never written, zeroed, or torn.
    BadMagic,
    /// Written by another format version; not served.
    Version(u32),
    /// Magic and version fine but the checksum does not match (torn or bit rot).
    BadChecksum,
    /// A journal record kind we do not know.
    BadKind(u16),
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn key_at(b: &[u8], off: usize) -> SsdKey {
    let mut k = [0u8; KEY_BYTES];
    k.copy_from_slice(&b[off..off + KEY_BYTES]);
    SsdKey::decode(&k)
}

fn put_key(b: &mut [u8], off: usize, key: &SsdKey) {
    let mut k = [0u8; KEY_BYTES];
    key.encode(&mut k);
    b[off..off + KEY_BYTES].copy_from_slice(&k);
}

impl BlockHeader {
    /// Encode into `out` (at least [`HEADER_USED`] bytes; bytes up to `out.len()` are zeroed).
    pub fn encode(&self, out: &mut [u8]) {
        out.fill(0);
        out[0..8].copy_from_slice(&BLOCK_MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        put_key(out, 24, &self.key);
        out[132..140].copy_from_slice(&self.len.to_le_bytes());
        out[140..148].copy_from_slice(&self.payload_sum.to_le_bytes());
        let sum = checksum(&out[0..148]);
        out[148..156].copy_from_slice(&sum.to_le_bytes());
    }

    /// Decode and check magic, version and header checksum. `b` must hold at least
    /// [`HEADER_USED`] bytes; shorter input is reported as [`DecodeError::BadMagic`].
    pub fn decode(b: &[u8]) -> Result<BlockHeader, DecodeError> {
        if b.len() < HEADER_USED || b[0..8] != BLOCK_MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version(version));
        }
        if checksum(&b[0..148]) != u64_at(b, 148) {
            return Err(DecodeError::BadChecksum);
        }
        Ok(BlockHeader {
            version,
            seq: u64_at(b, 16),
            key: key_at(b, 24),
            len: u64_at(b, 132),
            payload_sum: u64_at(b, 140),
        })
    }
}

/// Kind of a journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The key now lives at the extent.
    Put,
    /// The key was removed.
    Remove,
}

/// One journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalRecord {
    /// Format version.
    pub version: u16,
    /// Put or remove.
    pub kind: RecordKind,
    /// Sequence number (puts: the block's write sequence).
    pub seq: u64,
    /// Full key.
    pub key: SsdKey,
    /// Data file index (always 0 for now).
    pub file: u32,
    /// Extent byte offset (puts).
    pub offset: u64,
    /// Payload length (puts).
    pub len: u64,
    /// Payload checksum (puts).
    pub payload_sum: u64,
}

impl JournalRecord {
    /// Encode into exactly [`JOURNAL_RECORD_SIZE`] bytes.
    pub fn encode(&self, out: &mut [u8; JOURNAL_RECORD_SIZE]) {
        out.fill(0);
        out[0..4].copy_from_slice(&JOURNAL_MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        let kind: u16 = match self.kind {
            RecordKind::Put => 1,
            RecordKind::Remove => 2,
        };
        out[6..8].copy_from_slice(&kind.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        put_key(out, 16, &self.key);
        out[124..128].copy_from_slice(&self.file.to_le_bytes());
        out[128..136].copy_from_slice(&self.offset.to_le_bytes());
        out[136..144].copy_from_slice(&self.len.to_le_bytes());
        out[144..152].copy_from_slice(&self.payload_sum.to_le_bytes());
        let sum = checksum(&out[0..152]);
        out[152..160].copy_from_slice(&sum.to_le_bytes());
    }

    /// Decode and check magic, version and checksum.
    pub fn decode(b: &[u8; JOURNAL_RECORD_SIZE]) -> Result<JournalRecord, DecodeError> {
        if b[0..4] != JOURNAL_MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if u32::from(version) != FORMAT_VERSION {
            return Err(DecodeError::Version(u32::from(version)));
        }
        if checksum(&b[0..152]) != u64_at(b, 152) {
            return Err(DecodeError::BadChecksum);
        }
        let kind = match u16::from_le_bytes([b[6], b[7]]) {
            1 => RecordKind::Put,
            2 => RecordKind::Remove,
            k => return Err(DecodeError::BadKind(k)),
        };
        Ok(JournalRecord {
            version,
            kind,
            seq: u64_at(b, 8),
            key: key_at(b, 16),
            file: u32::from_le_bytes([b[124], b[125], b[126], b[127]]),
            offset: u64_at(b, 128),
            len: u64_at(b, 136),
            payload_sum: u64_at(b, 144),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SsdKey {
        SsdKey {
            fingerprint: [n; 32],
            shard: u32::from(n) * 7,
            salt: [n ^ 0x55; 32],
            generation: u64::from(n) << 40,
            hash: [n.wrapping_add(1); 32],
        }
    }

    #[test]
    fn header_roundtrip_and_checks() {
        let h = BlockHeader {
            version: FORMAT_VERSION,
            seq: 42,
            key: key(3),
            len: 12345,
            payload_sum: 0xdead_beef,
        };
        let mut buf = vec![0xffu8; HEADER_SIZE];
        h.encode(&mut buf);
        assert_eq!(BlockHeader::decode(&buf), Ok(h));
        let mut flipped = buf.clone();
        flipped[100] ^= 1;
        assert_eq!(BlockHeader::decode(&flipped), Err(DecodeError::BadChecksum));
        let mut other = buf.clone();
        other[8] = 9;
        assert_eq!(BlockHeader::decode(&other), Err(DecodeError::Version(9)));
        assert_eq!(
            BlockHeader::decode(&[0u8; HEADER_SIZE]),
            Err(DecodeError::BadMagic)
        );
        assert_eq!(BlockHeader::decode(&buf[..10]), Err(DecodeError::BadMagic));
    }

    #[test]
    fn record_roundtrip_and_checks() {
        let r = JournalRecord {
            version: FORMAT_VERSION as u16,
            kind: RecordKind::Put,
            seq: 7,
            key: key(9),
            file: 0,
            offset: 8192,
            len: 4096,
            payload_sum: 1,
        };
        let mut b = [0u8; JOURNAL_RECORD_SIZE];
        r.encode(&mut b);
        assert_eq!(JournalRecord::decode(&b), Ok(r));
        b[130] ^= 4;
        assert_eq!(JournalRecord::decode(&b), Err(DecodeError::BadChecksum));
    }

    #[test]
    fn rounding() {
        assert_eq!(round_up(0), 0);
        assert_eq!(round_up(1), 4096);
        assert_eq!(round_up(4096), 4096);
        assert_eq!(extent_bytes(4097), 4096 + 8192);
        assert_eq!(extent_bytes(u64::MAX), u64::MAX);
    }
}
