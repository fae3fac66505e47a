//! Tensor-parallel query control (contracts T1–T3 on one host): `LookupTp`
//! (one lookup over every shard of a TP group, the common prefix pinned under
//! one TP lease), `RedeemTp` (a rank's worker takes its shard's part: an
//! ordinary lease of its session) and `ReleaseTp` (the owner ends it).
//!
//! The lease's name is a token of 128 bits from the kernel's CSPRNG, bound to
//! the owner's uid and to the declared shard namespaces: only a session of the
//! same uid can redeem it, and only for one of those shards, once. T3: clients
//! speak only the Unix socket (0600, private directory). With `--tp-shard-peer`
//! some shards' workers are clients of peer Managers: `LookupTp` then goes to
//! `peer/tp.rs`, over the peer transport (literal loopback, else mutual TLS,
//! checked at start-up).

use std::io::Read;
use std::time::Duration;

use orbitkv_core::{CacheError, NsId, SessionId, TpToken};
use orbitkv_proto::{ErrorCode, LookupGrant, Request, Response, TP_TOKEN_BYTES, TpGrant};

use crate::parts::{Cache, Clock};
use crate::peer::PeerTier;
use crate::shared::Shared;

/// A fresh token from the kernel's CSPRNG (never all zeros: zero means "no lease").
fn draw_token() -> std::io::Result<TpToken> {
    let mut t = [0u8; TP_TOKEN_BYTES];
    let mut f = std::fs::File::open("/dev/urandom")?;
    while t == [0u8; TP_TOKEN_BYTES] {
        f.read_exact(&mut t)?;
    }
    Ok(TpToken(t))
}

/// `ttl` from now on the Manager's monotonic clock (the TP leases' deadlines).
fn deadline_ms(clock: Clock, ttl: Duration) -> u64 {
    clock
        .now_ms()
        .saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
}

/// Handle a TP request of session `s` (peer `uid`; `control`: control-only).
/// `None` when `req` is not a TP request.
pub fn handle(
    shared: &Shared,
    s: SessionId,
    uid: u32,
    control: bool,
    req: &Request,
    map: impl Fn(Result<Response, CacheError>) -> Response,
) -> Option<Response> {
    let what = match req {
        Request::LookupTp { .. } => "LookupTp",
        Request::RedeemTp { .. } => "RedeemTp",
        Request::ReleaseTp { .. } => "ReleaseTp",
        _ => return None,
    };
    if !shared.config.enable_query_control {
        return Some(Response::error(
            ErrorCode::InvalidArgument,
            format!(
                "{what}: tensor-parallel query control is off; start the Manager with --enable-query-control"
            ),
        ));
    }
    Some(match req {
        Request::LookupTp { nss, hashes } => {
            let token = match draw_token() {
                Ok(t) => t,
                Err(e) => {
                    return Some(Response::error(
                        ErrorCode::Internal,
                        format!("drawing a TP token: {e}"),
                    ));
                }
            };
            let nss: Vec<NsId> = nss.iter().map(|&n| NsId(n)).collect();
            let expires = deadline_ms(shared.clock(), shared.config.tp_lease_ttl);
            let found = match shared.peers.as_ref().filter(|p| p.has_tp_shard_peers()) {
                // Some ranks' workers are clients of peer Managers (T1 across hosts).
                Some(peer) => peer.lookup_across(
                    shared.cache(),
                    shared.config.tp_lease_ttl,
                    s,
                    uid,
                    &nss,
                    hashes,
                    token,
                    expires,
                ),
                None => shared
                    .cache()
                    .write()
                    .lookup_tp(s, uid, &nss, hashes, token, expires),
            };
            map(found.map(|r| {
                Response::TpLeaseOk(TpGrant {
                    token: r.token.map_or([0; TP_TOKEN_BYTES], |t| t.0),
                    hit_blocks: r.hit_blocks,
                    generation: r.generation,
                    ssd_blocks: r.ssd_blocks,
                })
            }))
        }
        Request::RedeemTp { token, ns } => {
            if control {
                // The redeemed lease is for copying: a session without the arena cannot.
                return Some(Response::error(
                    ErrorCode::InvalidArgument,
                    "RedeemTp hands a lease over for copying; this session is control-only (connect with the arena mapped)",
                ));
            }
            map(shared
                .cache()
                .write()
                .redeem_tp(s, uid, TpToken(*token), NsId(*ns))
                .map(|r| {
                    Response::LookupOk(LookupGrant {
                        lease: r.lease.0,
                        hit_blocks: r.hit_blocks,
                        generation: r.generation,
                        ssd_blocks: r.ssd_blocks,
                    })
                }))
        }
        Request::ReleaseTp { token } => {
            let local = shared.cache().write().release_tp(s, TpToken(*token));
            let remote = shared
                .peers
                .as_ref()
                .and_then(|p| p.release_across(s, TpToken(*token)));
            map(match (local, remote) {
                // Parts on peers only (or every local rank reported already).
                (Err(CacheError::UnknownTpLease), Some(r)) => r,
                (Ok(()), _) => Ok(()),
                (Err(e), _) => Err(e),
            }
            .map(|_| Response::Ok))
        }
        _ => return None,
    })
}

/// End TP leases past their deadline (`now` on the Manager's clock), and the
/// parts peers hold for TP leases whose owner is gone (called by the reaper thread).
pub fn expire(cache: &Cache, peers: Option<&PeerTier>, now: u64) {
    if let Some(peer) = peers {
        peer.tp_reap(cache, now);
    }
    // The exclusive lock stalls every lookup (and replays their touches first):
    // take it only when a TP lease is due, not on every pass of the reaper.
    if !cache.read().tp_expiry_due(now) {
        return;
    }
    let n = cache.write().expire_tp(now);
    if n > 0 {
        log!(
            Warn,
            "{n} TP lease(s) expired with parts never redeemed (a rank did not load within --tp-lease-ttl-ms); released"
        );
    }
}
