//! Bounded little-endian reader and writer.

use crate::HASH_BYTES;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("body truncated: needed {needed} more byte(s) for {field}")]
    Truncated { field: &'static str, needed: usize },
    #[error("{field}: count {count} exceeds the limit {limit}")]
    TooMany {
        field: &'static str,
        count: usize,
        limit: usize,
    },
    #[error("{0} trailing byte(s) after the message")]
    Trailing(usize),
    #[error("unknown message kind {0:#06x}")]
    UnknownKind(u16),
    #[error("{field}: invalid value {value}")]
    Invalid { field: &'static str, value: u64 },
    #[error("{0}: not UTF-8")]
    NotUtf8(&'static str),
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated {
                field,
                needed: n - self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn tp_token(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; crate::TP_TOKEN_BYTES], DecodeError> {
        self.array(field)
    }

    pub(crate) fn presence_key(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; crate::PRESENCE_KEY_BYTES], DecodeError> {
        self.array(field)
    }

    pub(crate) fn hash(&mut self, field: &'static str) -> Result<[u8; HASH_BYTES], DecodeError> {
        self.array(field)
    }

    /// A `u32` count, checked against `limit` and against the bytes left
    /// (`elem` bytes each), so a lying count cannot trigger a huge allocation.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        limit: usize,
        elem: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.u32(field)? as usize;
        if n > limit {
            return Err(DecodeError::TooMany {
                field,
                count: n,
                limit,
            });
        }
        let need = n.saturating_mul(elem);
        if need > self.buf.len() {
            return Err(DecodeError::Truncated {
                field,
                needed: need - self.buf.len(),
            });
        }
        Ok(n)
    }

    /// As `count`, and refused (`Invalid`) when zero: a list that must name
    /// at least one element.
    pub(crate) fn count_some(
        &mut self,
        field: &'static str,
        limit: usize,
        elem: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.count(field, limit, elem)?;
        if n == 0 {
            return Err(DecodeError::Invalid { field, value: 0 });
        }
        Ok(n)
    }

    /// A counted list of block hashes (at most `MAX_HASHES`).
    pub(crate) fn hashes(&mut self) -> Result<Vec<[u8; HASH_BYTES]>, DecodeError> {
        let n = self.count("hashes", crate::MAX_HASHES, HASH_BYTES)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.hash("hash")?);
        }
        Ok(out)
    }

    pub(crate) fn bytes(&mut self, field: &'static str, limit: usize) -> Result<Vec<u8>, DecodeError> {
        let n = self.count(field, limit, 1)?;
        Ok(self.take(n, field)?.to_vec())
    }

    pub(crate) fn text(&mut self, field: &'static str, limit: usize) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes(field, limit)?).map_err(|_| DecodeError::NotUtf8(field))
    }

    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.buf.len()))
        }
    }
}

#[derive(Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    pub(crate) fn count(&mut self, n: usize) -> &mut Self {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX))
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.count(v.len()).raw(v)
    }
    /// A counted list, each item written by `put`.
    pub(crate) fn list<T>(&mut self, items: &[T], mut put: impl FnMut(&mut Self, &T)) -> &mut Self {
        self.count(items.len());
        for it in items {
            put(self, it);
        }
        self
    }
    /// A counted list of `u32`s.
    pub(crate) fn u32s(&mut self, v: &[u32]) -> &mut Self {
        self.list(v, |w, x| {
            w.u32(*x);
        })
    }
    /// A counted list of `u64`s.
    pub(crate) fn u64s(&mut self, v: &[u64]) -> &mut Self {
        self.list(v, |w, x| {
            w.u64(*x);
        })
    }
    /// A counted list of block hashes ([`Reader::hashes`] reads it).
    pub(crate) fn hashes(&mut self, hs: &[[u8; HASH_BYTES]]) -> &mut Self {
        self.list(hs, |w, h| {
            w.raw(h);
        })
    }
}
