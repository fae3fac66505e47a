//! vLLM's KV-event wire format (`vllm/distributed/kv_events.py`, the same in 0.31.0,
//! 0.33.0 and 0.34.0): a ZeroMQ message of three frames, (topic, sequence number as 8
//! bytes big-endian, payload); the payload is msgspec's MessagePack of `KVEventBatch`,
//! an array `[ts, events, data_parallel_rank]`, each event a map tagged by `"type"`.
//! Written with `rmp`'s primitives so every byte is chosen here; the tests check it
//! against vLLM's own decoder (`python/tests/vllm/test_kv_events.py`).

use orbitkv_core::BlockHash;

use crate::config::HashForm;

/// Where a block is served from: vLLM's `MEDIUM_CPU` (the Manager's DRAM) or
/// `MEDIUM_STORAGE` (its SSD only; vLLM 0.33's name for its file-system tier); SGLang's
/// `CPU_PINNED` (host memory, its L2) and `DISK` (its L3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Cpu,
    Storage,
}

impl Medium {
    pub fn of(in_dram: bool) -> Medium {
        if in_dram { Medium::Cpu } else { Medium::Storage }
    }

    pub fn name(self, form: HashForm) -> &'static str {
        match (self, form) {
            (Medium::Cpu, HashForm::Sglang) => "CPU_PINNED",
            (Medium::Storage, HashForm::Sglang) => "DISK",
            (Medium::Cpu, _) => "CPU",
            (Medium::Storage, _) => "STORAGE",
        }
    }
}

/// One change, in the order the cache made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Stored(BlockHash, Medium),
    Removed(BlockHash, Medium),
}

/// The payload of one batch: `changes` of one namespace at time `ts` (seconds since
/// the epoch). A run of removals from one medium is one `BlockRemoved`; each store is its own
/// `BlockStored` (its hashes would otherwise claim to be one chain), in vLLM's placeholder
/// form: no parent, no token ids, block size 0 (the Manager does not hold tokens).
pub fn encode_batch(ts: f64, changes: &[Change], form: HashForm) -> Vec<u8> {
    let mut events: Vec<(bool, Medium, Vec<BlockHash>)> = Vec::new();
    for c in changes {
        match *c {
            Change::Stored(h, m) => events.push((true, m, vec![h])),
            Change::Removed(h, m) => match events.last_mut() {
                Some((false, last, hs)) if *last == m => hs.push(h),
                _ => events.push((false, m, vec![h])),
            },
        }
    }
    let mut out = Vec::with_capacity(32 + changes.len() * 140);
    // Writing into a Vec cannot fail: the `Result`s below carry only the Vec's errors.
    let w = &mut out;
    let _ = rmp::encode::write_array_len(w, 3);
    let _ = rmp::encode::write_f64(w, ts);
    let _ = rmp::encode::write_array_len(w, events.len() as u32);
    for (stored, medium, hashes) in &events {
        // Each event: a map of its fields, "type" (msgspec's tag) and the hashes first,
        // the medium last.
        let (ty, fields) = if *stored {
            ("BlockStored", 8)
        } else {
            ("BlockRemoved", 3)
        };
        let _ = rmp::encode::write_map_len(w, fields);
        str_(w, "type");
        str_(w, ty);
        str_(w, "block_hashes");
        hash_list(w, hashes, form);
        if *stored {
            str_(w, "parent_block_hash");
            let _ = rmp::encode::write_nil(w);
            str_(w, "token_ids");
            let _ = rmp::encode::write_array_len(w, 0);
            str_(w, "block_size");
            let _ = rmp::encode::write_uint(w, 0);
            str_(w, "lora_id");
            let _ = rmp::encode::write_nil(w);
        }
        str_(w, "medium");
        str_(w, medium.name(form));
        if *stored {
            str_(w, "lora_name");
            let _ = rmp::encode::write_nil(w);
        }
    }
    let _ = rmp::encode::write_nil(w); // data_parallel_rank: not a DP rank
    out
}

fn str_(w: &mut Vec<u8>, s: &str) {
    let _ = rmp::encode::write_str(w, s);
}

fn hash_list(w: &mut Vec<u8>, hashes: &[BlockHash], form: HashForm) {
    let _ = rmp::encode::write_array_len(w, hashes.len() as u32);
    for h in hashes {
        let _ = match form {
            HashForm::Bytes => rmp::encode::write_bin(w, h),
            HashForm::VllmInt => rmp::encode::write_uint(w, low64(h)).map(|_| ()),
            HashForm::Sglang => rmp::encode::write_sint(w, high64_signed(h)).map(|_| ()),
        };
    }
}

/// SGLang's `hash_str_to_int64` of the hash's hex: its first 16 hex digits (the first 8
/// bytes, big-endian) as a signed 64-bit int.
pub fn high64_signed(h: &BlockHash) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    i64::from_be_bytes(b)
}

/// vLLM's `maybe_convert_block_hash` with int hashes: the hash read big-endian, low 64 bits.
pub fn low64(h: &BlockHash) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[h.len() - 8..]);
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_the_bytes_msgspec_writes() {
        // msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[b"\x01"*32],
        // parent_block_hash=None, token_ids=[], block_size=0, lora_id=None, medium="CPU",
        // lora_name=None), BlockRemoved(block_hashes=[b"\x02"*32, b"\x03"*32], medium="CPU")]))
        let h = |b: u8| [b; 32];
        let got = encode_batch(
            1.5,
            &[
                Change::Stored(h(1), Medium::Cpu),
                Change::Removed(h(2), Medium::Cpu),
                Change::Removed(h(3), Medium::Cpu),
            ],
            HashForm::Bytes,
        );
        let mut want = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x92, 0x88];
        want.extend(fixstr("type"));
        want.extend(fixstr("BlockStored"));
        want.extend(fixstr("block_hashes"));
        want.extend([0x91, 0xc4, 32]);
        want.extend(h(1));
        want.extend(fixstr("parent_block_hash"));
        want.push(0xc0);
        want.extend(fixstr("token_ids"));
        want.push(0x90);
        want.extend(fixstr("block_size"));
        want.push(0x00);
        want.extend(fixstr("lora_id"));
        want.push(0xc0);
        want.extend(fixstr("medium"));
        want.extend(fixstr("CPU"));
        want.extend(fixstr("lora_name"));
        want.push(0xc0);
        want.push(0x83);
        want.extend(fixstr("type"));
        want.extend(fixstr("BlockRemoved"));
        want.extend(fixstr("block_hashes"));
        want.extend([0x92, 0xc4, 32]);
        want.extend(h(2));
        want.extend([0xc4, 32]);
        want.extend(h(3));
        want.extend(fixstr("medium"));
        want.extend(fixstr("CPU"));
        want.push(0xc0);
        assert_eq!(got, want);
    }

    fn fixstr(s: &str) -> Vec<u8> {
        assert!(s.len() < 32);
        let mut v = vec![0xa0 | s.len() as u8];
        v.extend(s.as_bytes());
        v
    }

    #[test]
    fn int_hashes_are_the_low_64_bits_big_endian() {
        let mut h = [0u8; 32];
        h[24..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        h[0] = 0xff;
        assert_eq!(low64(&h), 0x0102_0304_0506_0708);
        let got = encode_batch(0.0, &[Change::Removed(h, Medium::Cpu)], HashForm::VllmInt);
        let tail = [0x91, 0xcf, 1, 2, 3, 4, 5, 6, 7, 8];
        assert!(got.windows(tail.len()).any(|w| w == tail), "{got:02x?}");
    }

    #[test]
    fn sglang_hashes_are_the_first_64_bits_signed_with_sglangs_media() {
        // SGLang's hash_str_to_int64("ff01...") = int("ff01020304050607", 16) - 2**64.
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&[0xff, 1, 2, 3, 4, 5, 6, 7]);
        h[31] = 0xee;
        assert_eq!(high64_signed(&h), 0xff01_0203_0405_0607u64 as i64);
        assert!(high64_signed(&h) < 0);
        let got = encode_batch(
            0.0,
            &[
                Change::Stored(h, Medium::Cpu),
                Change::Removed(h, Medium::Storage),
            ],
            HashForm::Sglang,
        );
        let tail = [0x91, 0xd3, 0xff, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(
            got.windows(tail.len()).filter(|w| *w == tail).count(),
            2,
            "{got:02x?}"
        );
        let find = |s: &[u8]| got.windows(s.len()).filter(|w| *w == s).count();
        assert_eq!((find(&fixstr("CPU_PINNED")), find(&fixstr("DISK"))), (1, 1));
        // A positive one is written as the shortest unsigned int, as msgpack does.
        h[0] = 0x01;
        let got = encode_batch(0.0, &[Change::Removed(h, Medium::Cpu)], HashForm::Sglang);
        let tail = [0x91, 0xcf, 1, 1, 2, 3, 4, 5, 6, 7];
        assert!(got.windows(tail.len()).any(|w| w == tail), "{got:02x?}");
        for f in [HashForm::Bytes, HashForm::VllmInt, HashForm::Sglang] {
            assert_eq!(HashForm::parse(f.name()), Some(f));
        }
    }

    #[test]
    fn a_move_to_ssd_is_stored_in_storage_then_removed_from_cpu_and_runs_split_by_medium() {
        let h = |b: u8| [b; 32];
        let got = encode_batch(
            0.0,
            &[
                Change::Stored(h(1), Medium::Storage),
                Change::Removed(h(1), Medium::Cpu),
                Change::Removed(h(2), Medium::Cpu),
                Change::Removed(h(3), Medium::Storage),
            ],
            HashForm::Bytes,
        );
        // Three events: the store, one removal of two CPU blocks, one of a STORAGE block.
        assert_eq!(&got[10..11], &[0x93], "{got:02x?}");
        let find = |s: &[u8]| got.windows(s.len()).filter(|w| *w == s).count();
        assert_eq!(find(&fixstr("STORAGE")), 2);
        assert_eq!(find(&fixstr("CPU")), 1);
        assert_eq!(find(&fixstr("BlockRemoved")), 2);
    }
}
