"""How predictable is reuse in a prefix-block trace? Answers the question an online
cache policy depends on: when a request's blocks are saved, is there a signal that
says whether (and how soon) they will be asked for again?

Reads the public Mooncake FAST25 trace format (one JSON object per line with
`hash_ids`, one id per 512-token prefix block, `timestamp` in milliseconds,
`input_length` and `output_length` in tokens), supplied by the user; nothing is
downloaded. With an unbounded cache, each request's hit depth is the longest prefix of
blocks some earlier request saved. A request *continues* an earlier one (its parent,
the request that first saved the deepest block hit) when the hit covers all of the
parent's blocks but at most its last (partial) one, and at least two blocks (every
conversation request shares block 0, a system prompt); its turn is the parent's turn + 1,
else 1. Printed and written as JSON (`--out`, default `bench-results/trace_reuse.json`):

- per turn: requests, the share later continued (P(continue)), and the gap to the first
  continuation (seconds and requests);
- P(continue) by input and by output length;
- the percentiles of the continuation gap;
- the hindsight-frequency reference at each `--capacity`: the hit rate of the best
  *static* set of that many blocks, chosen knowing every block's request count in the
  whole trace (served = count - 1 per kept block; counts never grow along a chain, so
  the most requested blocks form whole prefixes): what keeping the most requested
  blocks serves, knowing the counts in advance and ignoring when requests come.

  python benches/trace_reuse.py --trace conversation_trace.jsonl --capacity 4096,16384 \\
      --out bench-results/trace_reuse.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_replay import read_requests  # the same JSONL reader, one copy

INPUT_EDGES = (1024, 2048, 4096, 8192, 16384, 32768)
OUTPUT_EDGES = (10, 50, 100, 200, 400, 800)
GAP_QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)


@dataclass
class Request:
    hash_ids: list[int]
    timestamp_ms: float | None
    input_length: int | None
    output_length: int | None


@dataclass
class Chains:
    """The continuation structure of a trace, seen with an unbounded cache."""

    hit_depth: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    # request index -> the requests that continue it, in trace order
    continued_by: dict[int, list[int]] = field(default_factory=dict)


def load(path: str) -> list[Request]:
    return [
        Request(
            hash_ids=v["hash_ids"],
            timestamp_ms=_number(v.get("timestamp")),
            input_length=_int(v.get("input_length")),
            output_length=_int(v.get("output_length")),
        )
        for v in read_requests(path)
    ]


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def chains(reqs: list[Request]) -> Chains:
    first_saved_by: dict[int, int] = {}
    c = Chains()
    for i, r in enumerate(reqs):
        h = r.hash_ids
        d = 0
        while d < len(h) and h[d] in first_saved_by:
            d += 1
        c.hit_depth.append(d)
        turn = 1
        if d >= 2:
            parent = first_saved_by[h[d - 1]]
            if d >= len(reqs[parent].hash_ids) - 1:
                turn = c.turn[parent] + 1
                c.continued_by.setdefault(parent, []).append(i)
        c.turn.append(turn)
        for b in h[d:]:
            first_saved_by.setdefault(b, i)
    return c


def _bucket(x: int | None, edges: tuple[int, ...]) -> str:
    if x is None:
        return "unknown"
    lo = 0
    for e in edges:
        if x < e:
            return f"{lo}-{e - 1}"
        lo = e
    return f">={lo}"


def _gap_s(reqs: list[Request], a: int, b: int) -> float | None:
    ta, tb = reqs[a].timestamp_ms, reqs[b].timestamp_ms
    return None if ta is None or tb is None else (tb - ta) / 1000.0


def continuation_table(reqs: list[Request], c: Chains, max_turn: int = 6) -> list[dict[str, Any]]:
    rows = []
    for t in range(1, max_turn + 1):
        idx = [i for i, x in enumerate(c.turn) if (x == t if t < max_turn else x >= t)]
        if not idx:
            continue
        cont = [i for i in idx if i in c.continued_by]
        gaps = [g for i in cont if (g := _gap_s(reqs, i, c.continued_by[i][0])) is not None]
        rows.append(
            {
                "turn": t if t < max_turn else f">={t}",
                "requests": len(idx),
                "p_continue": round(len(cont) / len(idx), 3),
                "median_gap_s": round(statistics.median(gaps), 1) if gaps else None,
                "median_gap_requests": statistics.median(c.continued_by[i][0] - i for i in cont) if cont else None,
            }
        )
    return rows


def by_feature(reqs: list[Request], c: Chains, attr: str, edges: tuple[int, ...]) -> list[dict[str, Any]]:
    counts: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        row = counts.setdefault(_bucket(getattr(r, attr), edges), [0, 0])
        row[0] += 1
        row[1] += i in c.continued_by
    order = [_bucket(e - 1, edges) for e in edges] + [_bucket(edges[-1], edges), "unknown"]
    return [
        {"bucket": b, "requests": counts[b][0], "p_continue": round(counts[b][1] / counts[b][0], 3)}
        for b in order
        if b in counts
    ]


def gap_quantiles(reqs: list[Request], c: Chains) -> dict[str, float]:
    gaps = sorted(g for i, js in c.continued_by.items() if (g := _gap_s(reqs, i, js[0])) is not None)
    if not gaps:
        return {}
    return {f"p{int(q * 100)}": gaps[min(len(gaps) - 1, int(len(gaps) * q))] for q in GAP_QUANTILES}


def static_hindsight(reqs: list[Request], capacity: int) -> float:
    """Hit rate of the best fixed set of `capacity` blocks, chosen knowing every count."""
    counts = Counter(b for r in reqs for b in r.hash_ids)
    requested = sum(counts.values())
    best = sorted(counts.values(), reverse=True)[:capacity]
    return sum(n - 1 for n in best) / requested


def analyze(path: str, capacities: list[int]) -> dict[str, Any]:
    reqs = load(path)
    c = chains(reqs)
    return {
        "trace": path,
        "requests": len(reqs),
        "blocks_requested": sum(len(r.hash_ids) for r in reqs),
        "continuations": sum(len(v) for v in c.continued_by.values()),
        "by_turn": continuation_table(reqs, c),
        "by_input_length": by_feature(reqs, c, "input_length", INPUT_EDGES),
        "by_output_length": by_feature(reqs, c, "output_length", OUTPUT_EDGES),
        "continuation_gap_s": gap_quantiles(reqs, c),
        "static_hindsight": {str(k): round(static_hindsight(reqs, k), 4) for k in capacities},
    }


def _print(r: dict[str, Any]) -> None:
    print(f"{r['trace']}: {r['requests']} requests, {r['blocks_requested']} blocks, {r['continuations']} continuations")
    print("  turn  requests  P(continue)  median gap s  median gap requests")
    for row in r["by_turn"]:
        print(
            f"  {row['turn']!s:>4}  {row['requests']:>8}  {row['p_continue']:>11.3f}"
            f"  {row['median_gap_s']!s:>12}  {row['median_gap_requests']!s:>19}"
        )
    for key, name in (("by_input_length", "input tokens"), ("by_output_length", "output tokens")):
        cells = ", ".join(f"{x['bucket']}: {x['p_continue']:.2f} ({x['requests']})" for x in r[key])
        print(f"  P(continue) by {name}: {cells}")
    gaps = ", ".join(f"{k} {v:g}" for k, v in r["continuation_gap_s"].items())
    print(f"  continuation gap (s): {gaps or 'no timestamps'}")
    for k, v in r["static_hindsight"].items():
        print(f"  best static set of {k} blocks, with hindsight: hit rate {v:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", action="append", required=True, help="trace file (repeatable)")
    p.add_argument("--capacity", default="4096,16384", help="comma-separated block counts")
    p.add_argument("--out", default="bench-results/trace_reuse.json", help="write the results as JSON here")
    a = p.parse_args(argv)
    try:
        capacities = [int(x) for x in a.capacity.split(",") if x]
    except ValueError:
        p.error(f"--capacity: not a list of integers: {a.capacity!r}")
    if not capacities or min(capacities) <= 0:
        p.error("--capacity: block counts must be positive")
    results = [analyze(t, capacities) for t in a.trace]
    for r in results:
        _print(r)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
