//! Lookups and the lease calls that follow them: [`LookupHit`] and `lookup`,
//! the TP calls ([`TpHit`], `lookup_tp`, `redeem_tp`, `release_tp`; contract
//! T1), `acquire`, the three ways to release (waiting, quiet, deferred), and
//! `lease`, a lookup held by a [`Lease`] guard.

use std::sync::atomic::Ordering;

use orbitkv_proto::{ErrorCode, MAX_QUIET_RELEASES, MAX_TP_SHARDS, Request, Response, TP_TOKEN_BYTES};

use crate::{Client, ClientError, Hash, Lease, Namespace, check_count};

/// Result of a lookup: the longest contiguous hit, pinned under `lease`
/// (`lease == 0` when nothing was hit); the Manager's `LookupOk` as it came.
pub use orbitkv_proto::LookupGrant as LookupHit;

/// Result of a TP lookup (contract T1): the common prefix of every declared
/// shard, pinned in each under one TP lease named by `token` (None when the
/// common prefix is empty: nothing is pinned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpHit {
    pub token: Option<[u8; TP_TOKEN_BYTES]>,
    pub hit_blocks: u32,
    /// Indices of hit blocks some shard held on SSD only at lookup time.
    pub ssd_blocks: Vec<u32>,
    pub generation: u64,
}

/// A `LookupOk` reply as a [`LookupHit`]; a `Protocol` error `inconsistent`
/// unless `consistent(lease, hit_blocks)` holds.
fn lookup_hit(
    reply: Response,
    inconsistent: &str,
    consistent: impl FnOnce(u64, u32) -> bool,
) -> Result<LookupHit, ClientError> {
    match reply {
        Response::LookupOk(hit) => {
            if !consistent(hit.lease, hit.hit_blocks) {
                return Err(ClientError::Protocol(inconsistent.into()));
            }
            Ok(hit)
        }
        r => Err(Client::unexpected(r)),
    }
}

impl Client {
    pub fn lookup(&self, ns: &Namespace, hashes: &[Hash]) -> Result<LookupHit, ClientError> {
        check_count(hashes.len())?;
        let reply = self.call(&Request::Lookup {
            ns: ns.id,
            hashes: hashes.to_vec(),
        })?;
        // The decoder checked the SSD indices against hit_blocks.
        lookup_hit(reply, "inconsistent lookup reply", |lease, hit_blocks| {
            hit_blocks as usize <= hashes.len() && (hit_blocks > 0) == (lease != 0)
        })
    }

    /// One lookup over every shard of a TP group (`shards[i]` must be shard
    /// `i` of one fingerprint and salt): the common prefix, pinned in every
    /// shard under one TP lease. Needs a Manager with `--enable-query-control`.
    pub fn lookup_tp(&self, shards: &[Namespace], hashes: &[Hash]) -> Result<TpHit, ClientError> {
        check_count(hashes.len())?;
        if shards.is_empty() || shards.len() > MAX_TP_SHARDS {
            return Err(ClientError::Invalid(format!(
                "a TP lookup declares 1 to {MAX_TP_SHARDS} shards, got {}",
                shards.len()
            )));
        }
        match self.call(&Request::LookupTp {
            nss: shards.iter().map(|n| n.id).collect(),
            hashes: hashes.to_vec(),
        })? {
            Response::TpLeaseOk(g) => {
                if g.hit_blocks as usize > hashes.len() {
                    return Err(ClientError::Protocol("inconsistent TP lookup reply".into()));
                }
                Ok(TpHit {
                    token: (g.hit_blocks > 0).then_some(g.token),
                    hit_blocks: g.hit_blocks,
                    ssd_blocks: g.ssd_blocks,
                    generation: g.generation,
                })
            }
            r => Err(Self::unexpected(r)),
        }
    }

    /// Take shard `ns`'s part of the TP lease `token` into this session: an
    /// ordinary lease of this session from now on (acquire, copy, release).
    pub fn redeem_tp(&self, token: [u8; TP_TOKEN_BYTES], ns: &Namespace) -> Result<LookupHit, ClientError> {
        let reply = self.call(&Request::RedeemTp { token, ns: ns.id })?;
        lookup_hit(reply, "inconsistent redeem reply", |lease, hit_blocks| {
            hit_blocks != 0 && lease != 0
        })
    }

    /// The owner ends its TP lease: parts not redeemed are released. `Ok(false)`
    /// when it had ended already (every rank reported done, it expired, or it
    /// ended with an earlier session of this owner): nothing was left to release.
    pub fn release_tp(&self, token: [u8; TP_TOKEN_BYTES]) -> Result<bool, ClientError> {
        match self.call(&Request::ReleaseTp { token }) {
            Ok(Response::Ok) => Ok(true),
            Ok(r) => Err(Self::unexpected(r)),
            Err(ClientError::Server {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Stage the leased blocks and learn where they are: `(segment, offset)`
    /// per hit block. From here until [`Client::release`] copies may read them.
    pub fn acquire(&self, lease: u64) -> Result<Vec<(u32, u64)>, ClientError> {
        match self.call(&Request::Acquire { lease })? {
            Response::Slots { slots } => Ok(slots),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Retire a lease: the caller asserts every copy out of it has drained.
    pub fn release(&self, lease: u64) -> Result<(), ClientError> {
        self.call_ok(&Request::Release { lease })
    }

    /// Retire leases without waiting for the Manager (`ReleaseQuiet`: no
    /// reply, one message for all of them): the caller asserts every copy out
    /// of each has drained. Requests sent after this one see them released.
    /// A lease the Manager no longer knows is counted and logged there
    /// (`quiet_release_failures_total`), not reported here; an error here
    /// means the request was not sent (the connection is gone, or too many
    /// leases: at most [`MAX_QUIET_RELEASES`]).
    pub fn release_quiet(&self, leases: &[u64]) -> Result<(), ClientError> {
        if self.quiet_release_wanted(leases)? {
            self.conn.send_releases(leases)?;
        }
        Ok(())
    }

    /// The argument checks of a quiet release: `false` for no leases (nothing
    /// to do), an error for too many or a closed client.
    fn quiet_release_wanted(&self, leases: &[u64]) -> Result<bool, ClientError> {
        if leases.len() > MAX_QUIET_RELEASES {
            return Err(ClientError::Invalid(format!(
                "a quiet release names at most {MAX_QUIET_RELEASES} leases, got {}",
                leases.len()
            )));
        }
        if leases.is_empty() {
            return Ok(false);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::Closed);
        }
        Ok(true)
    }

    /// [`Client::release_quiet`], deferred: the leases are written in front of
    /// this connection's next request (the same `write`, so the Manager's
    /// session thread wakes once for both), or by this connection's flusher
    /// thread once they have waited `ORBITKV_RELEASE_DELAY_US` (default 200;
    /// 0 sends at once). Ordered like an immediate release with every later
    /// request of this client; other sessions may see the leases held for up
    /// to the delay. An error means the connection is closing or closed.
    pub fn release_later(&self, leases: &[u64]) -> Result<(), ClientError> {
        if self.quiet_release_wanted(leases)? {
            self.conn.defer_releases(leases)?;
        }
        Ok(())
    }

    /// [`Client::lookup`] as a guard that releases the lease when dropped.
    pub fn lease(&self, ns: &Namespace, hashes: &[Hash]) -> Result<Lease<'_>, ClientError> {
        let hit = self.lookup(ns, hashes)?;
        Ok(Lease::new(self, hit))
    }
}
