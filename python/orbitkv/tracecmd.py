"""`orbitkv trace`: follow a running Manager's lookups live: for each, the namespace, how
many blocks hit (and how many came from SSD only), the block where it stopped and why
(evicted, absent, being saved by another session, present under another salt, doomed,
visible now), then the lease's restore and release with its lifetime; generation resets too.

The Manager records only while a trace is armed (each poll re-arms it for a few
seconds, so a trace whose reader died ends by itself), in a bounded ring; one filter
per Manager at a time (the last reader to arm sets it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

REARM_MS = 5000
MAX_ARM_MS = 3_600_000


def describe(e: dict[str, Any]) -> str:
    """One line for an event."""
    t = str(e.get("time", ""))[11:23]
    head = f"{t} pid {e.get('pid')} {e.get('event', '?'):7}"
    kind = e.get("event")
    if kind == "lookup":
        ns = str(e.get("namespace", ""))[:16]
        salt = " salted" if e.get("salted") else ""
        if "error" in e:
            return f"{head} ns {ns}{salt} {e['asked']} blocks: failed: {e['error']}"
        line = f"{head} ns {ns}{salt} gen {e.get('generation')} {e['asked']} blocks: {e['hit']} hit"
        if e.get("ssd_only"):
            line += f" ({e['ssd_only']} SSD-only)"
        if e.get("lease"):
            line += f", lease {e['lease']}"
        stop = e.get("stop")
        if stop:
            why = stop.get("reason")
            if why == "being saved":
                why = f"being saved by session {stop.get('saving_session')} (not committed yet)"
            elif why == "evicted":
                why = f"evicted {stop.get('left_us_ago', 0) / 1e6:.1f} s ago"
            line += f"; stopped at block {stop['block']} ({str(stop.get('hash', ''))[:16]}): {why}"
        return line
    if kind == "lookup_tp":
        ns = str(e.get("namespace", ""))[:16]
        if "error" in e:
            return f"{head} ns {ns} TP over {e.get('shards')} shards, {e['asked']} blocks: failed: {e['error']}"
        line = f"{head} ns {ns} TP over {e.get('shards')} shards, {e['asked']} blocks: {e['hit']} in every shard"
        stop = e.get("stop")
        if stop and "shard" in stop:
            line += f"; stopped at block {stop['block']}: shard {stop['shard']} {stop.get('reason')}"
        return line
    if kind == "redeem":
        return f"{head} TP part of ns {str(e.get('namespace', ''))[:16]}: {e.get('hit')} blocks, lease {e.get('lease')}"
    if kind == "save":
        ns = str(e.get("namespace", ""))[:16]
        if "error" in e:
            return f"{head} ns {ns} {e.get('asked')} blocks: failed: {e['error']}"
        refused = f", {e['refused']} refused (no room: the arena is full of pinned blocks)" if e.get("refused") else ""
        return (
            f"{head} ns {ns} save {e.get('save')}: {e.get('asked')} blocks: {e.get('allocated')} to write, "
            f"{e.get('present')} present{refused}"
        )
    if kind in ("commit", "abort"):
        what = f"failed: {e['error']}" if "error" in e else f"{e.get('committed', 0)} blocks visible"
        if kind == "abort":
            what = "aborted" if "error" not in e else what
        return f"{head} save {e.get('save')}: {what}, {e.get('after_begin_us', 0) / 1000:.2f} ms after it began"
    if kind == "acquire":
        what = f"failed: {e['error']}" if "error" in e else f"{e.get('blocks')} blocks"
        return f"{head} lease {e.get('lease')}: {what}, {e.get('after_lookup_us', 0) / 1000:.2f} ms after the lookup"
    if kind == "release":
        quiet = " (no reply)" if e.get("quiet") else ""
        return f"{head} lease {e.get('lease')} after {e.get('held_us', 0) / 1000:.2f} ms{quiet}"
    if kind == "fill":
        return (
            f"{t} session {e.get('session')} fill    ns {str(e.get('namespace', ''))[:16]}: {e.get('missing')} "
            f"missing locally: {e.get('from_peers')} from peers, {e.get('from_remote')} from the remote tier"
        )
    if kind == "reset":
        return f"{head} ns {str(e.get('namespace', ''))[:16]}: generation now {e.get('generation')}"
    return f"{head} {json.dumps(e, sort_keys=True)}"


def _fingerprint(text: str | None) -> tuple[bytes | None, str | None]:
    """(exact fingerprint for the Manager's filter, or a hex prefix filtered here)."""
    if text is None:
        return None, None
    t = text.lower()
    if not t or len(t) > 64 or any(c not in "0123456789abcdef" for c in t):
        raise ValueError(f"--namespace {text!r} must be the namespace fingerprint in hex (up to 64 digits)")
    return (bytes.fromhex(t), None) if len(t) == 64 else (None, t)


def main(argv: list[str]) -> int:
    from orbitkv.tokens import read_token_file

    p = argparse.ArgumentParser(prog="orbitkv trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", help="Manager socket (default: $ORBITKV_SOCKET or the per-user default)")
    p.add_argument("--token-file", help="file holding the Manager token, if it requires one")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to follow [60]")
    p.add_argument("--namespace", help="only this namespace: its fingerprint in hex, or a prefix of it")
    p.add_argument("--pid", type=int, default=0, help="only this engine process")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between polls [0.2]")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    a = p.parse_args(argv)
    try:
        exact, prefix = _fingerprint(a.namespace)
        if not 0 < a.seconds <= MAX_ARM_MS / 1000:
            raise ValueError(f"--seconds {a.seconds:g} must be above 0 and at most {MAX_ARM_MS // 1000}")
        if a.pid < 0 or not 0 < a.interval <= 10:
            raise ValueError("--pid must be >= 0 and --interval above 0 and at most 10")
        token = read_token_file(a.token_file) if a.token_file else None
    except (ValueError, OSError) as e:
        print(f"orbitkv trace: {e}", file=sys.stderr)
        return 2
    from orbitkv import _native

    try:
        client = _native.Client(a.socket, token=token, map_arena=False)
    except _native.OrbitKVError as e:
        print(f"orbitkv trace: {e}", file=sys.stderr)
        return 1
    end = time.monotonic() + a.seconds
    cursor: int | None = None
    shown = 0
    with client:
        try:
            while True:
                left_ms = int((end - time.monotonic()) * 1000)
                arm = max(0, min(REARM_MS, left_ms))
                kwargs: dict[str, Any] = {"fingerprint": exact, "pid": a.pid}
                if cursor is not None:
                    kwargs["cursor"] = cursor
                r = client.trace(arm, **kwargs)
                cursor = int(r["next"])
                if r.get("missed"):
                    print(f"orbitkv trace: {r['missed']} events dropped before they were read", file=sys.stderr)
                for event in r["events"]:
                    if prefix and not str(event.get("namespace", prefix)).startswith(prefix):
                        continue
                    print(json.dumps(event, sort_keys=True) if a.json else describe(event), flush=True)
                    shown += 1
                if arm == 0:
                    break
                if not r.get("more"):
                    time.sleep(a.interval)
        except KeyboardInterrupt:
            client.trace(0, cursor=cursor if cursor is not None else 2**64 - 1)
        except _native.OrbitKVError as e:
            print(f"orbitkv trace: {e}", file=sys.stderr)
            return 1
    print(f"orbitkv trace: {shown} events", file=sys.stderr)
    return 0
