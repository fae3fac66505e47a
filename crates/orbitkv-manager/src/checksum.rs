//! Block checksums of the peer tier: XXH3-64 (seed 0, default secret), the
//! value `xxhash_rust::xxh3::xxh3_64` returns, so Managers of either build
//! agree on the wire.
//!
//! The build targets baseline x86-64, where `xxhash-rust` picks its SSE2
//! loop at compile time. Peer transfers hash every block twice (source and
//! reader), so long inputs take an AVX2 loop here when the CPU has AVX2
//! (detected at run time, once); everything else (short inputs, other CPUs)
//! is `xxhash-rust` itself. The AVX2 path is checked against `xxhash-rust` on
//! every length class in the tests below.

/// Inputs shorter than this go to `xxhash-rust` (its short and mid-size
/// paths differ from the long one; the AVX2 loop pays off on long inputs only).
const LONG_MIN: usize = 1024;

/// XXH3-64 of `data` (seed 0, default secret).
pub fn xxh3_64(data: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= LONG_MIN && std::arch::is_x86_feature_detected!("avx2") {
        return long::hash(data);
    }
    xxhash_rust::xxh3::xxh3_64(data)
}

/// XXH3-64 of a buffer of known length that fills front to back (a block
/// arriving from a socket), hashed while the bytes just written are still in
/// cache: [`Progressive::update`] after each receive with the prefix filled so
/// far, [`Progressive::finish`] with the whole buffer. The value equals
/// [`xxh3_64`] of the whole buffer. Only the AVX2 long-input loop hashes
/// progressively; elsewhere (short inputs, other CPUs) `finish` hashes it all.
#[derive(Debug, Clone)]
pub struct Progressive {
    len: usize,
    /// 1 KiB stripe blocks already folded into `acc`.
    blocks: usize,
    acc: [u64; 8],
    on: bool,
}

#[allow(unsafe_code)] // the AVX2 loop, only where run-time detection found AVX2
impl Progressive {
    pub fn new(len: usize) -> Progressive {
        #[cfg(target_arch = "x86_64")]
        let on = len >= LONG_MIN && std::arch::is_x86_feature_detected!("avx2");
        #[cfg(not(target_arch = "x86_64"))]
        let on = false;
        Progressive {
            len,
            blocks: 0,
            acc: INIT_ACC,
            on,
        }
    }

    /// Fold in what is complete of `filled`, the buffer's first
    /// `filled.len()` bytes (the same buffer at every call, growing).
    pub fn update(&mut self, filled: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if self.on && filled.len() <= self.len {
            // The input's last 1 KiB block (even a whole one) is folded by `finish`.
            let upto = (filled.len() / long::BLOCK).min((self.len - 1) / long::BLOCK);
            if upto > self.blocks {
                // SAFETY: `on` is set only when the CPU has AVX2.
                unsafe { long::blocks_avx2(&mut self.acc, filled, self.blocks, upto) };
                self.blocks = upto;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = filled;
    }

    /// The XXH3-64 of `data`, the whole buffer.
    pub fn finish(mut self, data: &[u8]) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.on && data.len() == self.len {
            self.update(data);
            // SAFETY: `on` is set only when the CPU has AVX2.
            return unsafe { long::finish_avx2(&mut self.acc, data, self.blocks) };
        }
        xxh3_64(data)
    }
}

/// The accumulators' initial values (the specification's `XXH3_INIT_ACC`).
const INIT_ACC: [u64; 8] = [
    0xC2B2_AE3D,
    0x9E37_79B1_85EB_CA87,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
    0x85EB_CA77,
    0x27D4_EB2F_1656_67C5,
    0x9E37_79B1,
];

/// Which loop [`xxh3_64`] uses for long inputs on this CPU (for bench reports).
pub fn long_path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return "avx2";
    }
    "xxhash-rust (compile-time SIMD)"
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 intrinsics behind run-time detection
mod long {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi64, _mm256_loadu_si256, _mm256_mul_epu32, _mm256_set1_epi64x,
        _mm256_shuffle_epi32, _mm256_slli_epi64, _mm256_srli_epi64, _mm256_storeu_si256, _mm256_xor_si256,
    };

    /// The XXH3 specification's default secret (`kSecret`, 192 bytes).
    const SECRET: [u8; 192] = [
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde,
        0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79,
        0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46,
        0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb,
        0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2,
        0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c,
        0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59,
        0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3,
        0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3,
        0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8,
        0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb,
        0xca, 0xbb, 0x4b, 0x40, 0x7e,
    ];

    const P32_1: u64 = 0x9E37_79B1;
    const P64_1: u64 = 0x9E37_79B1_85EB_CA87;
    const STRIPE: usize = 64;
    /// Secret bytes consumed per stripe.
    const STEP: usize = 8;
    const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / STEP;
    pub(super) const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;

    /// The long-input XXH3-64 (inputs over 240 bytes), AVX2 accumulators.
    pub(super) fn hash(data: &[u8]) -> u64 {
        debug_assert!(data.len() > 240);
        let mut acc = super::INIT_ACC;
        // SAFETY: only called after `is_x86_feature_detected!("avx2")` (the caller, above).
        unsafe { finish_avx2(&mut acc, data, 0) }
    }

    /// Fold 1 KiB blocks `from..to` of `data` into `acc`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn blocks_avx2(acc: &mut [u64; 8], data: &[u8], from: usize, to: usize) {
        let mut lanes = load(acc);
        for b in from..to {
            let block = &data[b * BLOCK..(b + 1) * BLOCK];
            for s in 0..STRIPES_PER_BLOCK {
                accumulate(
                    &mut lanes,
                    &block[s * STRIPE..(s + 1) * STRIPE],
                    &SECRET[s * STEP..],
                );
            }
            scramble(&mut lanes, &SECRET[SECRET.len() - STRIPE..]);
        }
        store(&lanes, acc);
    }

    /// The hash of `data` (over 240 bytes) whose first `done` 1 KiB blocks
    /// are already folded into `acc`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn finish_avx2(acc: &mut [u64; 8], data: &[u8], done: usize) -> u64 {
        let len = data.len();
        let blocks = (len - 1) / BLOCK;
        // SAFETY: the caller's obligation (AVX2) is ours.
        unsafe { blocks_avx2(acc, data, done.min(blocks), blocks) };
        let mut lanes = load(acc);
        // The last, partial block: whole stripes, then the input's last 64
        // bytes (overlapping) with a secret offset of its own.
        let tail = &data[blocks * BLOCK..];
        let stripes = (len - 1 - blocks * BLOCK) / STRIPE;
        for s in 0..stripes {
            accumulate(
                &mut lanes,
                &tail[s * STRIPE..(s + 1) * STRIPE],
                &SECRET[s * STEP..],
            );
        }
        accumulate(
            &mut lanes,
            &data[len - STRIPE..],
            &SECRET[SECRET.len() - STRIPE - 7..],
        );
        store(&lanes, acc);
        let mut h = (len as u64).wrapping_mul(P64_1);
        for i in 0..4 {
            let k = &SECRET[11 + 16 * i..];
            h = h.wrapping_add(mul_fold(acc[2 * i] ^ read64(k, 0), acc[2 * i + 1] ^ read64(k, 8)));
        }
        avalanche(h)
    }

    #[target_feature(enable = "avx2")]
    fn load(acc: &[u64; 8]) -> [__m256i; 2] {
        // SAFETY: `acc` is 64 bytes; unaligned loads.
        unsafe {
            [
                _mm256_loadu_si256(acc.as_ptr().cast()),
                _mm256_loadu_si256(acc.as_ptr().add(4).cast()),
            ]
        }
    }

    #[target_feature(enable = "avx2")]
    fn store(lanes: &[__m256i; 2], acc: &mut [u64; 8]) {
        // SAFETY: `acc` is 64 bytes; unaligned stores.
        unsafe {
            _mm256_storeu_si256(acc.as_mut_ptr().cast(), lanes[0]);
            _mm256_storeu_si256(acc.as_mut_ptr().add(4).cast(), lanes[1]);
        }
    }

    /// One 64-byte stripe into the accumulators: each 64-bit lane gains the
    /// product of the low and high halves of (input ^ secret), and its
    /// neighbour's input word.
    #[target_feature(enable = "avx2")]
    fn accumulate(lanes: &mut [__m256i; 2], stripe: &[u8], secret: &[u8]) {
        assert!(stripe.len() >= STRIPE && secret.len() >= STRIPE);
        for (i, acc) in lanes.iter_mut().enumerate() {
            // SAFETY: both slices hold at least 64 bytes (asserted), so
            // 32-byte unaligned loads at offsets 0 and 32 stay inside them.
            let (d, k) = unsafe {
                (
                    _mm256_loadu_si256(stripe.as_ptr().add(32 * i).cast()),
                    _mm256_loadu_si256(secret.as_ptr().add(32 * i).cast()),
                )
            };
            let dk = _mm256_xor_si256(d, k);
            let product = _mm256_mul_epu32(dk, _mm256_srli_epi64::<32>(dk));
            // Swap the two 64-bit words of each 128-bit half (lane i gets word i ^ 1).
            let swapped = _mm256_shuffle_epi32::<0b01_00_11_10>(d);
            *acc = _mm256_add_epi64(product, _mm256_add_epi64(*acc, swapped));
        }
    }

    /// Mix the accumulators after each block: acc = (acc ^ acc >> 47 ^ key) * P32_1.
    #[target_feature(enable = "avx2")]
    fn scramble(lanes: &mut [__m256i; 2], secret: &[u8]) {
        assert!(secret.len() >= STRIPE);
        let prime = _mm256_set1_epi64x(P32_1 as i64);
        for (i, acc) in lanes.iter_mut().enumerate() {
            // SAFETY: `secret` holds at least 64 bytes (asserted).
            let k = unsafe { _mm256_loadu_si256(secret.as_ptr().add(32 * i).cast()) };
            let a = _mm256_xor_si256(_mm256_xor_si256(*acc, _mm256_srli_epi64::<47>(*acc)), k);
            // 64 × 32-bit multiply from two 32 × 32 → 64 products.
            let lo = _mm256_mul_epu32(a, prime);
            let hi = _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), prime);
            *acc = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
        }
    }

    fn read64(b: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    }

    fn mul_fold(a: u64, b: u64) -> u64 {
        let p = u128::from(a) * u128::from(b);
        (p as u64) ^ ((p >> 64) as u64)
    }

    fn avalanche(mut h: u64) -> u64 {
        h ^= h >> 37;
        h = h.wrapping_mul(0x1656_6791_9E37_79F9);
        h ^ (h >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic byte stream (SplitMix64).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            v.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        v.truncate(n);
        v
    }

    #[test]
    fn equals_xxhash_rust_on_every_length_class() {
        // Short, mid-size, the long threshold, block and stripe edges, and
        // peer block sizes; each at several offsets into the buffer.
        let mut lens: Vec<usize> = (0..=2100).collect();
        for edge in [4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20] {
            lens.extend([
                edge - 65,
                edge - 64,
                edge - 1,
                edge,
                edge + 1,
                edge + 63,
                edge + 64,
            ]);
        }
        let buf = bytes((1 << 20) + 200, 7);
        for &n in &lens {
            for off in [0, 1, 7] {
                let d = &buf[off..off + n];
                assert_eq!(
                    xxh3_64(d),
                    xxhash_rust::xxh3::xxh3_64(d),
                    "length {n}, offset {off}"
                );
            }
        }
    }

    #[test]
    fn progressive_equals_one_shot_whatever_the_pieces() {
        // Lengths around the 1 KiB stripe-block edges and peer block sizes,
        // fed in pieces that do and do not fall on those edges (one byte,
        // odd sizes, exactly 1 KiB, whole), each prefix handed over once.
        let buf = bytes((256 << 10) + 100, 11);
        let lens = [
            0,
            100,
            240,
            1023,
            1024,
            1025,
            2048,
            4096 + 1,
            (64 << 10) - 1,
            64 << 10,
            (256 << 10) + 3,
        ];
        for len in lens {
            let d = &buf[..len];
            for piece in [1, 63, 1000, 1024, 4096, 65_537, usize::MAX] {
                let mut p = Progressive::new(len);
                let mut at = 0;
                while at < len {
                    at = at.saturating_add(piece).min(len);
                    p.update(&d[..at]);
                }
                assert_eq!(
                    p.finish(d),
                    xxhash_rust::xxh3::xxh3_64(d),
                    "length {len}, pieces of {piece}"
                );
            }
            // `update` called twice with the same prefix, and never at all.
            let mut p = Progressive::new(len);
            p.update(&d[..len / 2]);
            p.update(&d[..len / 2]);
            assert_eq!(p.finish(d), xxhash_rust::xxh3::xxh3_64(d), "length {len}");
            assert_eq!(Progressive::new(len).finish(d), xxhash_rust::xxh3::xxh3_64(d));
        }
    }

    #[test]
    fn progressive_sees_a_byte_changed_after_its_block_was_folded() {
        // The sum is over the bytes as they were when folded: a later change
        // to a folded block is not seen; a change to the unfolded rest is.
        let mut d = bytes(64 << 10, 5);
        let whole = xxh3_64(&d);
        let mut p = Progressive::new(d.len());
        p.update(&d[..32 << 10]);
        d[40 << 10] ^= 1;
        assert_ne!(p.clone().finish(&d), whole);
        d[40 << 10] ^= 1;
        assert_eq!(p.finish(&d), whole);
    }

    #[test]
    fn a_flipped_bit_changes_the_sum() {
        let mut d = bytes(256 << 10, 3);
        let before = xxh3_64(&d);
        d[100_000] ^= 0x10;
        assert_ne!(xxh3_64(&d), before);
    }
}
