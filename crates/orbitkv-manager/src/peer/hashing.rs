//! Checksums of a transfer's blocks (xxh3-64), taken inline or, for a large
//! transfer with `--peer-hash-thread`, on a helper thread while the next block
//! moves.

use super::PeerTier;

/// A transfer of at least this many bytes checksums each block on a helper
/// thread while the next one moves, so the thread on the socket only moves
/// bytes. Below it, starting the thread (tens of µs) would cost about what
/// hashing inline does (~30 GB/s from cache: 4 MiB in ~140 µs).
const HASH_AHEAD_MIN_BYTES: usize = 4 << 20;
/// Blocks waiting for the helper at most (then the socket thread waits).
const HASH_AHEAD_QUEUE: usize = 64;

impl PeerTier {
    /// Whether a transfer of `blocks` blocks of `len` bytes hashes on a helper
    /// (`--peer-hash-thread`, and big enough).
    pub(crate) fn hash_ahead(&self, blocks: usize, len: usize) -> bool {
        self.settings.hash_thread && blocks >= 2 && len.saturating_mul(blocks) >= HASH_AHEAD_MIN_BYTES
    }
}

/// One block of a transfer, to checksum: its bytes (in an arena slot the
/// caller keeps frozen until [`checksums_alongside`] returns), or the sum of
/// bytes already hashed (a block the reader read past).
pub(crate) enum Piece<'a> {
    Bytes(&'a [u8]),
    Sum(u64),
}

impl Piece<'_> {
    fn sum(self) -> u64 {
        match self {
            Piece::Bytes(b) => crate::checksum::xxh3_64(b),
            Piece::Sum(s) => s,
        }
    }
}

/// Run `io`, which moves a transfer's blocks over the socket and hands each
/// to its sink in block order, and return the blocks' xxh3-64 in that order.
/// With `ahead`, a scoped helper thread (`orbitkv-peer-hash`) hashes block `i`
/// while `io` moves block `i + 1`; otherwise (or if the thread cannot start)
/// each block is hashed in the sink. The helper has ended — every slice it held
/// dropped — when this returns, whatever happened, so the caller may then
/// commit, abort or release what the slices point into.
pub(crate) fn checksums_alongside<'a, E>(
    ahead: bool,
    io: impl FnOnce(&mut dyn FnMut(Piece<'a>)) -> Result<(), E>,
    panicked: impl FnOnce() -> E,
) -> Result<Vec<u64>, E> {
    let mut sums = Vec::new();
    if !ahead {
        io(&mut |p| sums.push(p.sum()))?;
        return Ok(sums);
    }
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Piece<'a>>(HASH_AHEAD_QUEUE);
        let helper = std::thread::Builder::new()
            .name("orbitkv-peer-hash".into())
            .spawn_scoped(scope, move || {
                rx.into_iter().map(Piece::sum).collect::<Vec<u64>>()
            });
        let Ok(helper) = helper else {
            io(&mut |p| sums.push(p.sum()))?;
            return Ok(sums);
        };
        // A send fails only if the helper is gone (it panicked): the join says so.
        let moved = io(&mut |p| {
            let _ = tx.send(p);
        });
        drop(tx);
        let hashed = helper.join();
        moved?;
        hashed.map_err(|_| panicked())
    })
}
