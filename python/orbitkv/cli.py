"""`orbitkv` command line: serve, status, demo, qualify, trace."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from orbitkv.tokens import read_token_file

USAGE = """orbitkv <command> [options]

commands:
  serve    run the Manager in the foreground (flags: orbitkv serve --help)
  status   show a running Manager's counters and gauges
  demo     start (or use) a Manager and replay a multi-turn chat workload
           from several client processes; prints hit rate and GB/s
  qualify  check and measure this host for OrbitKV (limits, huge pages, socket
           directory, arena copies, SSD direct I/O, GPU pinning and copies):
           a verdict per item with the fix (orbitkv qualify --help)
  trace    follow a running Manager's lookups live: hits, the block each
           stopped at and why, restores and lease lifetimes (orbitkv trace --help)
"""


def _serve(argv: Sequence[str]) -> int:
    from orbitkv import _native

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    return int(_native.serve(["orbitkv serve", *argv]))


def _status(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="orbitkv status", description="Show a running Manager's state.")
    p.add_argument("--socket", help="Manager socket (default: $ORBITKV_SOCKET or the per-user default)")
    p.add_argument("--token-file", help="file holding the Manager token, if it requires one")
    p.add_argument("--json", action="store_true", help="print raw JSON")
    a = p.parse_args(argv)
    from orbitkv import _native

    try:
        token = read_token_file(a.token_file) if a.token_file else None
    except OSError as e:
        print(f"orbitkv status: {e}", file=sys.stderr)
        return 1
    try:
        with _native.Client(a.socket, token=token) as c:
            st = c.stats()
    except _native.OrbitKVError as e:
        print(f"orbitkv status: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return 0
    gib = 1 << 30

    def size(n: int) -> str:
        return f"{n / gib:.2f} GiB" if n >= gib else f"{n / (1 << 20):.1f} MiB"

    used = st["dram_capacity_bytes"] - st["dram_free_bytes"]
    lookups = st["lookup_blocks_total"] or 1
    print(f"Manager pid {st['pid']} v{st['version']} on {st['socket']} (up {st['uptime_seconds']} s)")
    print(f"  metrics      {('http://' + st['metrics_addr'] + '/metrics') if st['metrics_addr'] else 'off'}")
    print(
        f"  DRAM arena   {size(used)} / {size(st['dram_capacity_bytes'])} used, "
        f"{st['dram_visible_blocks']} blocks visible, {st['dram_pinned_blocks']} pinned, "
        f"{len(st['segment_sizes'])} segment(s) of {_page(st['dram_page_bytes'])} pages"
    )
    print(
        f"  lookups      {st['lookups_total']} ({st['hit_blocks_total']}/{st['lookup_blocks_total']} blocks hit, "
        f"{100 * st['hit_blocks_total'] / lookups:.1f} %)"
    )
    print(
        f"  saves        {st['blocks_committed_total']} committed, {st['blocks_present_total']} already present, "
        f"{st['blocks_refused_total']} refused, {st['evictions_total']} evicted"
    )
    print(
        f"  sessions     {st['sessions']} live, {st['quarantined_sessions']} quarantined, "
        f"{st['auth_refused_total']} refused, {st['bad_frames_total']} bad frames"
    )
    print(f"  leases       {st['live_leases']} live; saves pending {st['live_saves']}")
    if st["hint_cap_bytes"]:
        print(
            f"  hints        {st['hint_kept_blocks']} blocks kept ({size(st['hint_kept_bytes'])} of "
            f"{size(st['hint_cap_bytes'])} allowed), {st['hint_done_blocks']} done, "
            f"{st['hint_refused_blocks_total']} refused; {st['hint_requests_total']} hints received"
        )
    else:
        print("  hints        off (--retain-share 0)")
    ssd = st.get("ssd", {})
    if ssd.get("enabled"):
        fallback = f" (fell back: {ssd['fallback_reason']})" if ssd.get("fallback_reason") else ""
        print(
            f"  SSD tier     {ssd['dir']} {ssd['mode']} mode, {ssd['engine']} engine{fallback}; "
            f"{size(st['ssd_used_bytes'])} / {size(st['ssd_capacity_bytes'])}, {st['ssd_blocks']} blocks, "
            f"{st['ssd_only_blocks']} SSD-only"
        )
        print(
            f"  SSD traffic  {st['ssd_spilled_blocks_total']} spilled, {st['ssd_staged_blocks_total']} staged, "
            f"{st['ssd_checksum_failures_total'] + st['ssd_header_failures_total']} integrity failures, "
            f"{st['ssd_dormant_blocks']} recovered blocks awaiting their namespace"
        )
    else:
        print("  SSD tier     off (enable with --ssd or --ssd-dir)")
    _print_peers(st.get("peers", {}))
    return 0


def _print_peers(peers: dict[str, Any]) -> None:
    if not peers.get("enabled"):
        print("  peers        off (enable with --peer-listen / --peer / --etcd-endpoints)")
        return
    src = peers["source"]
    listen = peers["listen"] or "not serving"
    tls = "mutual TLS" if peers["tls"] else "plain TCP (loopback)"
    print(
        f"  peers        listen {listen}, {tls}, etcd {peers['etcd']}; as source: "
        f"{src['blocks_sent']} blocks sent, {src['leases_open']} leases open, "
        f"{src['refused']} refused, {src['bad_frames']} bad frames"
    )
    for p in peers["peers"]:
        err = f", last error: {p['last_error']}" if p.get("last_error") else ""
        print(
            f"    {p['addr']:<24} {p['health']:<7} ({p['source']}) {p['fetches']} fetches, "
            f"{p['blocks']} blocks / {p['bytes']} bytes in, {p['errors']} errors, "
            f"mean {p['mean_latency_us']} us{err}"
        )


def _page(n: int) -> str:
    return {4096: "4 KiB", 2 << 20: "2 MiB (huge)", 1 << 30: "1 GiB (huge)"}.get(n, f"{n}-byte")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "serve":
        return _serve(rest)
    if cmd == "status":
        return _status(rest)
    if cmd == "demo":
        from orbitkv.demo import main as demo_main

        return demo_main(rest)
    if cmd == "trace":
        from orbitkv.tracecmd import main as trace_main

        return trace_main(rest)
    if cmd == "qualify":
        from orbitkv.qualify import main as qualify_main

        return qualify_main(rest)
    if cmd in ("--version", "version"):
        from orbitkv import __version__

        print(__version__)
        return 0
    print(f"orbitkv: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2
