//! The answer to each kind of request of a session: namespaces, lookups (with a
//! peer fill on a local miss), restores (staging SSD-only blocks first), saves,
//! releases, generations, stats and fault injection.

use orbitkv_core::{
    CacheError, Fingerprint, LeaseId, NamespaceKey, NsId, Retain, SaveId, SaveStatus, SessionId,
};
use orbitkv_proto::{ErrorCode, LookupGrant, Request, Response, RetainHold, SaveItem};
use std::time::Instant;

use crate::parts::ServerCounters;
use crate::shared::Shared;
use crate::stats;
use crate::tier::{AcquireFailed, FillPins};

/// `ReleaseQuiet`: release each lease as `Release` would, answer nothing. A
/// lease that cannot be released (already ended, another session's) is
/// counted and logged; the client asked not to wait, so it is not told.
pub(super) fn release_quiet(shared: &Shared, s: SessionId, pid: i32, leases: &[u64]) {
    for &l in leases {
        ServerCounters::inc(&shared.counters.quiet_releases);
        if let Err(e) = release(shared, s, LeaseId(l)) {
            let n = ServerCounters::inc(&shared.counters.quiet_release_failures);
            warn_sampled!(n, "session {} (pid {pid}): quiet release of lease {l}: {e}", s.0);
        }
    }
}

/// Release one lease: the shared-lock path when ending it frees nothing.
fn release(shared: &Shared, s: SessionId, l: LeaseId) -> Result<(), CacheError> {
    // Bound first: the shared guard must be gone before the exclusive path
    // below takes the lock (a match scrutinee's temporaries live to its end).
    let fast = shared.cache().read().try_release_shared(s, l);
    match fast {
        Ok(true) => Ok(()),
        // A doomed block to reap or a TP part to end: the exclusive path.
        Ok(false) => shared.cache().write().release(s, l),
        Err(e) => Err(e),
    }
}

fn cache_code(e: &CacheError) -> ErrorCode {
    match e {
        CacheError::UnknownSession(_) | CacheError::SessionClosed(_) => ErrorCode::SessionClosed,
        CacheError::UnknownNamespace(_) => ErrorCode::UnknownNamespace,
        CacheError::BlockBytesMismatch { .. }
        | CacheError::BadBlockBytes(_)
        | CacheError::BlockLargerThanSegment { .. } => ErrorCode::InvalidArgument,
        CacheError::UnknownLease(_) | CacheError::UnknownSave(_) => ErrorCode::NotFound,
        CacheError::NotOwner { .. } => ErrorCode::NotOwner,
        CacheError::Busy { .. } => ErrorCode::Busy,
        CacheError::NoStagingSpace { .. } => ErrorCode::RestoreFailed,
        CacheError::TpGroup(_) => ErrorCode::InvalidArgument,
        CacheError::UnknownTpLease => ErrorCode::NotFound,
        CacheError::RetentionOff | CacheError::BadHint(_) => ErrorCode::InvalidArgument,
    }
}

pub(super) fn map(r: Result<Response, CacheError>) -> Response {
    r.unwrap_or_else(|e| Response::error(cache_code(&e), e.to_string()))
}

pub(super) fn handle(shared: &Shared, s: SessionId, req: Request) -> Response {
    match req {
        Request::Hello { .. } => Response::error(ErrorCode::BadFrame, "Hello sent twice"),
        Request::RegisterNamespace {
            fingerprint,
            shard,
            salt,
            block_bytes,
        } => {
            let key = NamespaceKey {
                fingerprint: Fingerprint(fingerprint),
                shard,
                salt,
            };
            map(shared
                .cache()
                .write()
                .register_namespace(key, block_bytes)
                .map(|(ns, generation)| Response::Namespace {
                    ns: ns.0,
                    generation,
                    presence_key: shared.presence.as_ref().map_or([0; 16], |p| p.namespace_key(ns)),
                }))
        }
        Request::Lookup { ns, hashes } => map(lookup(shared, s, NsId(ns), &hashes).map(|r| {
            Response::LookupOk(LookupGrant {
                lease: r.lease.map_or(0, |l| l.0),
                hit_blocks: r.hit_blocks,
                generation: r.generation,
                ssd_blocks: r.ssd_blocks,
            })
        })),
        Request::Acquire { lease } => {
            if let Some(resp) = acquire_from_dram(shared, s, lease) {
                return resp;
            }
            let mut cache = shared.cache().write();
            let injected = shared.faults().take_restore();
            if injected {
                // Nothing was handed out, so no copy can be in flight: retire now.
                ServerCounters::inc(&shared.counters.restore_failures_injected);
                let released = cache.release(s, LeaseId(lease));
                return match released {
                    Ok(()) => Response::error(
                        ErrorCode::RestoreFailed,
                        format!("restore of lease {lease} failed: injected fault; lease released"),
                    ),
                    Err(e) => map(Err(e)),
                };
            }
            drop(cache);
            acquire(shared, s, LeaseId(lease))
        }
        Request::Release { lease } => map(release(shared, s, LeaseId(lease)).map(|_| Response::Ok)),
        Request::BeginSave { ns, hashes } => map(shared
            .cache()
            .write()
            .begin_save(s, NsId(ns), &hashes)
            .map(|(id, st)| Response::SaveBegun {
                save: id.0,
                items: st
                    .into_iter()
                    .map(|x| match x {
                        SaveStatus::Allocated(slot) => SaveItem::Allocated {
                            segment: slot.segment,
                            offset: slot.offset,
                        },
                        SaveStatus::Present => SaveItem::Present,
                        SaveStatus::Refused => SaveItem::Refused,
                    })
                    .collect(),
            })),
        Request::CommitSave { save } => {
            let mut cache = shared.cache().write();
            let injected = shared.faults().take_commit();
            if injected {
                ServerCounters::inc(&shared.counters.commit_failures_injected);
                return match cache.abort_save(s, SaveId(save)) {
                    Ok(()) => Response::error(
                        ErrorCode::SaveFailed,
                        format!(
                            "commit of save {save} failed: injected fault; the save was aborted, nothing became visible"
                        ),
                    ),
                    Err(e) => map(Err(e)),
                };
            }
            // The remote tier writes what this commit makes visible (after it, off this
            // thread), unless it admits blocks by their hits (then lookups make them due).
            let queued = shared
                .remote
                .as_ref()
                .filter(|_| cache.remote_admit_hits() == 0)
                .and_then(|r| cache.save_blocks(s, SaveId(save)).ok().map(|b| (r, b)));
            let done = cache.commit_save(s, SaveId(save));
            drop(cache);
            if let (Ok(_), Some((r, (ns, hashes)))) = (&done, queued) {
                r.queue_committed(ns, &hashes);
            }
            map(done.map(|blocks| Response::Committed { blocks }))
        }
        Request::AbortSave { save } => map(shared
            .cache()
            .write()
            .abort_save(s, SaveId(save))
            .map(|_| Response::Ok)),
        Request::ResetGeneration { ns } => {
            // Resets are ordered (their tables are written in bump order); the
            // cache lock is held only for the bump and the table's snapshot, not
            // across the fsync, so lookups and saves go on meanwhile.
            let _ordered = shared.generation_writes();
            let (r, table) = {
                let mut cache = shared.cache().write();
                let r = cache.bump_generation(NsId(ns));
                let table = r.is_ok().then(|| cache.generation_table());
                (r, table)
            };
            if let (Ok(g), Some(table)) = (&r, table) {
                log!(Info, "namespace {ns}: moved to generation {g}");
                if let Some(ssd) = &shared.config.ssd {
                    // Durable before the reply: a restart must never serve the old generation.
                    if let Err(e) = crate::tier::persist_generations(&ssd.dir, &table) {
                        log!(Error, "persisting generations in {}: {e}", ssd.dir.display());
                        return Response::error(
                            ErrorCode::Internal,
                            format!(
                                "generation {g} applied but not persisted in {}: {e}",
                                ssd.dir.display()
                            ),
                        );
                    }
                }
            }
            map(r.map(|generation| Response::Generation { generation }))
        }
        Request::Trace {
            arm_ms,
            fingerprint,
            pid,
            cursor,
        } => {
            if arm_ms > crate::trace::MAX_ARM_MS {
                return Response::error(
                    ErrorCode::InvalidArgument,
                    format!(
                        "trace arm_ms {arm_ms} exceeds {} (one hour); ask again to keep tracing",
                        crate::trace::MAX_ARM_MS
                    ),
                );
            }
            let now = shared.clock().now_ms();
            Response::TraceOk {
                json: shared.tracer().request(now, arm_ms, fingerprint, pid, cursor),
            }
        }
        Request::Retain { ns, hold, hashes } => {
            let what = match hold {
                RetainHold::Keep { ttl_ms } => Retain::Keep {
                    ttl_ms: u64::from(ttl_ms),
                },
                RetainHold::Done => Retain::Done,
                RetainHold::Clear => Retain::Clear,
            };
            let now = shared.clock().now_ms();
            map(shared
                .cache()
                .write()
                .retain(s, NsId(ns), &hashes, what, now)
                .map(|o| Response::Retained {
                    applied: o.applied,
                    pending: o.pending,
                    refused: o.refused,
                }))
        }
        Request::Stats => Response::StatsOk {
            json: stats::json(&shared.stats()),
        },
        Request::InjectFault {
            restore_failures,
            commit_failures,
        } => {
            if !shared.config.enable_fault_injection {
                return Response::error(
                    ErrorCode::FaultInjectionDisabled,
                    "fault injection is disabled; start the Manager with --enable-fault-injection",
                );
            }
            shared.faults().arm(restore_failures, commit_failures);
            Response::Ok
        }
        Request::Close => Response::Ok, // handled in the loop
        Request::ReleaseQuiet { .. } => {
            Response::error(ErrorCode::Internal, "ReleaseQuiet reached the answering handler") // the loop handles it
        }
        Request::LookupTp { .. } | Request::RedeemTp { .. } | Request::ReleaseTp { .. } => {
            Response::error(ErrorCode::Internal, "TP request reached the plain handler") // tp::handle answers these
        }
    }
}

/// A lookup; on a local miss (partial or whole) with peers configured, the
/// missing suffix is filled from a peer into this Manager's DRAM first
/// (`peer::PeerTier::fill`) and the lookup runs again, so the reply is an
/// ordinary local hit. The local prefix stays pinned by the first lease while
/// the peer blocks are stored (they must not evict it), then that lease is
/// released in favour of the second lookup's.
fn lookup(
    shared: &Shared,
    s: SessionId,
    ns: NsId,
    hashes: &[orbitkv_core::BlockHash],
) -> Result<orbitkv_core::LookupResult, CacheError> {
    let first = {
        let cache = shared.cache().read();
        let r = cache.lookup_shared(s, ns, hashes);
        // The policy thread replays the touch log; if it is far behind, this
        // lookup does (unless another replay runs: no lookup waits for one).
        cache.apply_touches_shared(false);
        r
    }?;
    let hit = first.hit_blocks as usize;
    if hit >= hashes.len() || (shared.peers.is_none() && shared.remote.is_none()) {
        return Ok(first);
    }
    // Below DRAM and SSD: peers, then the remote tier, each for what is still missing;
    // what they store stays pinned until the second lookup holds it (`FillPins`).
    let rest = &hashes[hit..];
    let mut pins = FillPins::new(shared.arena());
    let from_peers = shared.peers.as_ref().map_or(0, |p| {
        let t = Instant::now();
        let n = p.fill(shared.arena(), ns, rest);
        shared.counters.latency.peer_fill.since(t);
        n
    });
    let from_remote = match shared.remote.as_ref() {
        Some(r) if from_peers < rest.len() => {
            let t = Instant::now();
            if from_peers > 0 {
                pins.pin(&mut shared.cache().write(), ns, &rest[..from_peers]);
            }
            let n = r.fill(shared.arena(), &mut pins, ns, &rest[from_peers..]);
            shared.counters.latency.remote_fill.since(t);
            n
        }
        _ => 0,
    };
    if shared.tracer().armed(shared.clock()) {
        shared
            .tracer()
            .filled(shared.cache(), s, ns, rest.len(), from_peers, from_remote);
    }
    if from_peers + from_remote == 0 {
        return Ok(first);
    }
    let mut cache = shared.cache().write();
    let second = cache.lookup(s, ns, hashes);
    if let Some(l) = first.lease {
        let _ = cache.release(s, l);
    }
    drop(cache);
    drop(pins); // takes the lock itself
    second
}

/// The common restore under the shared lock: every block in DRAM and no
/// fault armed. `None` when the lease needs the exclusive path (`acquire`).
fn acquire_from_dram(shared: &Shared, s: SessionId, lease: u64) -> Option<Response> {
    if shared.faults().restore_armed() {
        return None;
    }
    let fast = shared.cache().read().try_acquire_shared(s, LeaseId(lease));
    match fast {
        Ok(Some(slots)) => {
            ServerCounters::inc(&shared.counters.leases_acquired);
            Some(Response::Slots {
                slots: slots.iter().map(|x| (x.segment, x.offset)).collect(),
            })
        }
        Ok(None) => None,
        Err(e) => Some(map(Err(e))),
    }
}

/// Hand out a lease's source slots (`tier::acquire_slots`: SSD-only blocks staged
/// first). A block that fails its integrity checks is dropped (a miss from now on)
/// and the restore fails, with the lease retired: no copy was handed out.
fn acquire(shared: &Shared, s: SessionId, l: LeaseId) -> Response {
    let ssd_read = &shared.counters.latency.ssd_read;
    match crate::tier::acquire_slots(shared.arena(), shared.tier.as_deref(), ssd_read, s, l) {
        Ok(slots) => {
            ServerCounters::inc(&shared.counters.leases_acquired);
            Response::Slots {
                slots: slots.iter().map(|x| (x.segment, x.offset)).collect(),
            }
        }
        Err(AcquireFailed::Lost { blocks }) => Response::error(
            ErrorCode::RestoreFailed,
            format!(
                "restore of lease {}: {blocks} block(s) failed integrity checks on SSD and were dropped; lease released",
                l.0
            ),
        ),
        Err(AcquireFailed::Cache { err, released: true }) => {
            Response::error(ErrorCode::RestoreFailed, format!("{err}; lease released"))
        }
        Err(AcquireFailed::Cache { err, .. }) => map(Err(err)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use orbitkv_core::{BlockHash, LeaseId, NsId, SaveStatus, SessionId};
    use orbitkv_proto::{ErrorCode, Response};

    use super::acquire;
    use crate::config::ManagerConfig;
    use crate::shared::Shared;
    use crate::tier::{MoveGuard, Spilled};

    const BLOCK: u64 = 4096;

    fn h(i: u8) -> BlockHash {
        [i; 32]
    }

    /// A Manager's state with `slots` DRAM slots of one block and the real SSD
    /// tier in `dir` with eager write-behind, built as `orbitkv serve` builds it.
    fn with_ssd(dir: &Path, slots: u64) -> (Shared, SessionId, NsId) {
        let dir = dir.to_str().expect("utf-8 path");
        let argv = [
            "x",
            "--socket",
            "/nonexistent/orbitkv-test.sock",
            "--ssd-dir",
            dir,
            "--ssd-capacity",
            "16MiB",
            "--ssd-write-policy",
            "eager",
        ];
        let config = ManagerConfig::from_argv(argv).expect("config");
        let settings = config.ssd.clone().expect("ssd settings");
        Shared::for_test(config, slots, BLOCK, |cache| {
            Box::new(crate::tier::open(&settings, cache).expect("ssd tier"))
        })
    }

    /// Save block `i` with every byte `i`, as a client does: slot, bytes, commit.
    fn save(shared: &Shared, s: SessionId, ns: NsId, i: u8) {
        let mut c = shared.cache().write();
        let (id, st) = c.begin_save(s, ns, &[h(i)]).expect("begin");
        let SaveStatus::Allocated(slot) = st[0] else {
            panic!("no slot for block {i}: {st:?}");
        };
        let seg = &shared.segments[slot.segment as usize];
        seg.mapping()
            .write_at(slot.offset, &[i; BLOCK as usize])
            .expect("write");
        c.commit_save(s, id).expect("commit");
    }

    /// Spill what write-behind would spill now, through the real tier.
    fn spill_now(shared: &Shared) {
        let jobs = shared.cache().write().spill_candidates(8);
        spill(shared, jobs);
    }

    /// Write `jobs` to the tier and report them, as write-behind does.
    fn spill(shared: &Shared, jobs: Vec<orbitkv_core::SpillJob>) {
        let tier = shared.tier.as_deref().expect("tier");
        let ok: Vec<bool> = tier
            .spill(&shared.segments, &jobs)
            .iter()
            .map(|r| matches!(r, Spilled::Durable))
            .collect();
        MoveGuard::new(shared.cache(), jobs).finish(&ok);
    }

    fn lease(shared: &Shared, s: SessionId, ns: NsId, i: u8) -> LeaseId {
        let mut c = shared.cache().write();
        c.lookup(s, ns, &[h(i)]).expect("lookup").lease.expect("a hit")
    }

    /// Two DRAM slots holding blocks 2 and 3 (not yet spilled); block 1 on SSD only.
    fn block_1_on_ssd_only(dir: &Path) -> (Shared, SessionId, NsId) {
        let (shared, s, ns) = with_ssd(dir, 2);
        save(&shared, s, ns, 1);
        spill_now(&shared);
        save(&shared, s, ns, 2);
        save(&shared, s, ns, 3);
        (shared, s, ns)
    }

    #[test]
    fn a_restore_waits_for_spills_in_flight_to_free_dram_for_its_staging() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, s, ns) = block_1_on_ssd_only(dir.path());
        // A slow SSD: blocks 2 and 3 are being spilled, so neither DRAM slot can
        // be evicted for block 1's staging read until those writes end.
        let slow = shared.cache().write().spill_candidates(8);
        assert_eq!(slow.len(), 2);
        assert_eq!(shared.cache().read().spills_in_flight(), 2);
        let l = lease(&shared, s, ns, 1);
        let started = Instant::now();
        let reply = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                spill(&shared, slow);
            });
            acquire(&shared, s, l)
        });
        let Response::Slots { slots } = reply else {
            panic!("the restore failed instead of waiting for the spills: {reply:?}");
        };
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "it waited for the spills"
        );
        let (seg, off) = slots[0];
        let mut got = vec![0u8; BLOCK as usize];
        shared.segments[seg as usize]
            .mapping()
            .read_at(off, &mut got)
            .expect("read");
        assert!(got.iter().all(|&b| b == 1), "block 1 staged byte-exact from SSD");
        assert_eq!(shared.cache().read().spills_in_flight(), 0);
        shared.cache().write().check_invariants().expect("invariants");
    }

    #[test]
    fn a_restore_with_every_slot_pinned_and_no_spill_in_flight_fails_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, s, ns) = block_1_on_ssd_only(dir.path());
        spill_now(&shared);
        // Both DRAM blocks pinned by acquired leases: nothing will free a slot.
        for i in [2, 3] {
            let l = lease(&shared, s, ns, i);
            assert!(matches!(acquire(&shared, s, l), Response::Slots { .. }));
        }
        let l = lease(&shared, s, ns, 1);
        let started = Instant::now();
        let reply = acquire(&shared, s, l);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "no wait without spills in flight"
        );
        let Response::Error { code, message } = reply else {
            panic!("expected a failed restore, got {reply:?}");
        };
        assert_eq!(code, ErrorCode::RestoreFailed as u16);
        assert!(
            message.contains("every slot is pinned by a lease") && message.contains("lease released"),
            "{message}"
        );
    }

    #[test]
    fn the_wire_and_the_core_bound_a_keep_alike() {
        assert_eq!(
            u64::from(orbitkv_proto::MAX_RETAIN_TTL_MS),
            orbitkv_core::MAX_RETAIN_TTL_MS
        );
    }
}
