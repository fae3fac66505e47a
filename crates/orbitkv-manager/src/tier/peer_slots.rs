//! The peer tier's slot borrowing: receiving a peer's block straight into a
//! save slot of our arena, and sending a leased block straight from its slot,
//! each under the cache-protocol right that freezes the slot.
#![allow(unsafe_code)]

use orbitkv_core::{LeasedSlot, SaveSlot};
use orbitkv_shm::Segment;

/// Let `fill` write the first `len` bytes of save slot `slot`, then return
/// them read-only with what `fill` returned: the one place the peer tier's
/// receives get at an arena slot (the callers' obligations are those of
/// [`recv_into_save_slot`]).
fn fill_save_slot<'a, T>(
    segments: &'a [Segment],
    slot: &SaveSlot,
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> std::io::Result<T>,
) -> std::io::Result<(&'a [u8], T)> {
    let seg = segments
        .get(slot.segment as usize)
        .ok_or_else(|| std::io::Error::other(format!("no arena segment {}", slot.segment)))?;
    if len as u64 > slot.len {
        return Err(std::io::Error::other("block larger than its slot"));
    }
    // SAFETY: the slot was allocated by `begin_save` (only the cache makes a
    // `SaveSlot`) to a save of the Manager-internal session that calls this
    // (caller's obligation above): it
    // is invisible, its location was handed to no client, and the cache
    // allocates it to nothing else until that save is committed or aborted, which
    // happens after the returned slice is dropped; so within this process this
    // is the only reference to these bytes (the mutable one ends when it
    // becomes the shared one returned). A client of a trusted uid maps the whole
    // arena read-write and could still write here; it can only damage cache
    // content, which the trust model (same or allowed uid) already grants it,
    // and the bytes are checked against the source's checksum before commit.
    let buf = unsafe { seg.mapping().slice_mut(slot.offset, len) }.map_err(std::io::Error::other)?;
    let out = fill(buf)?;
    Ok((buf, out))
}

/// The peer tier's reads into DRAM: fill the first `len` bytes of `slot` from
/// `r` and return them, for the caller to checksum (on this thread or a
/// helper's).
///
/// The caller must hold `slot` as an allocated, uncommitted save slot of a
/// Manager-internal session (`CacheState::begin_save` in `peer::fill_session`
/// and `remote`), and
/// must commit or abort that save only after the returned slice is dropped.
pub fn recv_into_save_slot<'a>(
    segments: &'a [Segment],
    slot: &SaveSlot,
    len: usize,
    r: &mut impl std::io::Read,
) -> std::io::Result<&'a [u8]> {
    fill_save_slot(segments, slot, len, |buf| r.read_exact(buf)).map(|(bytes, ())| bytes)
}

/// [`recv_into_save_slot`] that also hashes (xxh3-64) the bytes as they land:
/// after each receive (as much as the socket holds, up to the rest of the
/// block) its bytes are folded in while still in cache, instead of one pass
/// over the whole block after it. Returns the bytes and their sum; the same obligations as [`recv_into_save_slot`]. The sum is of the
/// bytes as received: a change to the slot after its part was folded in (only
/// a trusted client could make one) is not seen here, and the bytes were
/// received into a slot no client has been told of.
pub fn recv_into_save_slot_hashed<'a>(
    segments: &'a [Segment],
    slot: &SaveSlot,
    len: usize,
    r: &mut impl std::io::Read,
) -> std::io::Result<(&'a [u8], u64)> {
    let (bytes, sum) = fill_save_slot(segments, slot, len, |buf| {
        let mut sum = crate::checksum::Progressive::new(len);
        let mut got = 0;
        while got < len {
            match r.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "peer closed mid-block",
                    ));
                }
                Ok(n) => {
                    got += n;
                    sum.update(&buf[..got]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(sum)
    })?;
    Ok((bytes, sum.finish(bytes)))
}

/// The peer tier's sends: write the first `len` bytes of `slot` to `w` and
/// return them, for the caller to checksum after (on this thread or a
/// helper's: from cache, the socket copy having read them from memory). The
/// caller must hold an acquired lease on the block in `slot`
/// (`AcquireStep::Ready` in `peer::source` and `remote::writer`) until the
/// returned slice is dropped.
pub fn send_leased_slot<'a>(
    segments: &'a [Segment],
    slot: &LeasedSlot,
    len: usize,
    w: &mut impl std::io::Write,
) -> std::io::Result<&'a [u8]> {
    let seg = segments
        .get(slot.segment as usize)
        .ok_or_else(|| std::io::Error::other(format!("no arena segment {}", slot.segment)))?;
    // SAFETY: the block is pinned by an acquired lease of the caller's session
    // (only the cache makes a `LeasedSlot`, from `acquire`; caller's obligation
    // above): a pinned, visible block's slot is frozen
    // (never freed, reallocated or written by the Manager) until the lease ends,
    // which happens after the returned slice is dropped. A client of a trusted
    // uid could still write into its mapping of this range between the copy
    // and the hash; the reader then finds its checksum of the bytes it received
    // differs from the source's and stores nothing (it stores only what it
    // received and verified).
    let buf = unsafe { seg.mapping().slice(slot.offset, len) }.map_err(std::io::Error::other)?;
    w.write_all(buf)?;
    Ok(buf)
}
