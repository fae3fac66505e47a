"""OrbitKV's counters in vLLM's own KV-connector stats (vLLM 0.31.0).

vLLM collects connector stats each step: the worker's `get_kv_connector_stats()` rides
in `KVConnectorOutput.kv_connector_stats`, the Scheduler aggregates it with the
scheduler-side connector's `get_kv_connector_stats()` and ships `to_dict()` to the
stat loggers, which rebuild it with the connector class's `build_kv_connector_stats`
(the periodic "KV Transfer metrics: ..." log line, `reduce()`) and feed it to
`build_prom_metrics` (vLLM's Prometheus endpoint, `observe()`).

Every OrbitKV counter is a count (or a sum of seconds) over the interval since the last
call, so aggregating is adding; Prometheus exposes them as `vllm:orbitkv_*_total`
counters with vLLM's `model_name`/`engine` labels. The latency samples (`SAMPLE_KEYS`:
one duration per request and worker) are lists, joined when aggregated and observed
into the histograms `vllm:orbitkv_load_duration_seconds` and
`vllm:orbitkv_save_duration_seconds`; at most `MAX_SAMPLES` per key ride in one
interval's stats, the rest are counted in `latency_samples_dropped`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

# (key in the stats dict, Prometheus help). Keys are the adapter's own counter names.
SCHEDULER_KEYS: dict[str, str] = {
    "lookups": "Manager lookups made by the scheduler",
    "lookup_blocks": "Blocks asked for by those lookups",
    "hit_blocks": "Blocks found in OrbitKV (external prefix hits)",
    "lookup_seconds": "Seconds of Manager lookups (inline: the round trip; background: start to answer taken)",
    "presence_misses": "Requests answered a miss from the presence table (no Manager message)",
    "async_lookups": "Lookups of probable hits sent from the background thread",
    "lookups_answered_in_step": "Background lookups answered within the step's wait (orbitkv.lookup_wait_us)",
    "loads_started": "Asynchronous loads planned",
    "loads_finished": "Loads completed",
    "loads_failed": "Loads that failed (blocks recomputed by vLLM)",
    "saved_blocks": "Blocks newly stored by saves",
    "refused_blocks": "Save blocks refused by the Manager's admission",
    "failed_saves": "Saves lost to an error (the entry is lost, never the request)",
    "manager_errors": "Manager calls of the scheduler that failed (treated as misses)",
    "bypassed_requests": "Requests OrbitKV did not serve (bypass rules)",
    "hints_sent": "Retention hints sent to the Manager (kv_transfer_params orbitkv_retention)",
    "hints_rejected": "Malformed retention hints (logged; the request ran without one)",
}
WORKER_KEYS: dict[str, str] = {
    "loads": "Loads started by workers",
    "bytes_restored": "Bytes copied from OrbitKV into KV pages",
    "bytes_saved": "Bytes copied from KV pages into OrbitKV",
    "load_failures": "Loads a worker could not complete in full",
    "load_seconds": "Seconds from a load's start to its completion, summed",
    "latency_samples_dropped": "Load and save durations not sent (over MAX_SAMPLES in one interval)",
}
KEYS: dict[str, str] = {**SCHEDULER_KEYS, **WORKER_KEYS}
# (key, Prometheus help): per-request durations in seconds, measured by each worker.
SAMPLE_KEYS: dict[str, str] = {
    "load_duration": "Seconds from a request's load start (start_load_kv) to its completion, per worker",
    "save_duration": "Seconds from a request's save being issued to its commit, per worker",
}
MAX_SAMPLES = 4096  # per key in one interval's stats
# From a 2 MiB block over PCIe (~40 us) to a long prompt from a slow tier; seconds.
DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class LatencySamples:
    """Per-request durations a worker measured since the last `drain`, at most
    `MAX_SAMPLES` per key; the ones beyond are counted in `dropped`."""

    def __init__(self) -> None:
        self._samples: dict[str, list[float]] = {k: [] for k in SAMPLE_KEYS}
        self.dropped = 0

    def add(self, key: str, seconds: float) -> None:
        samples = self._samples[key]
        if len(samples) < MAX_SAMPLES:
            samples.append(seconds)
        else:
            self.dropped += 1

    def drain(self) -> dict[str, list[float]]:
        out = {k: v for k, v in self._samples.items() if v}
        if out:
            self._samples = {k: [] for k in SAMPLE_KEYS}
        return out


def with_samples(stats: OrbitKVConnectorStats | None, samples: dict[str, list[float]]) -> OrbitKVConnectorStats | None:
    """`stats` (counter increments, None when none moved) carrying `samples` too."""
    if not samples:
        return stats
    if stats is None:
        stats = OrbitKVConnectorStats(data={})
    stats.data.update(samples)
    return stats


def _quantile_ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)


class CounterDeltas:
    """Turns monotonically growing counters into per-interval increments (every value
    passed in, tracked or not, must never decrease)."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._keys = tuple(keys)
        self._last: dict[str, float] = dict.fromkeys(self._keys, 0)
        self._total: tuple[float, ...] = ()

    def take(self, counters: Mapping[str, float], **extra: float) -> OrbitKVConnectorStats | None:
        """Increments of `counters` (and of the `extra` values) since the last call; None
        when nothing moved (no allocation beyond the lookups in the common idle step)."""
        # Every counter only grows: an unchanged total means nothing moved (the idle step).
        total = (sum(counters.values()), *extra.values())
        if total == self._total:
            return None
        self._total = total
        delta: dict[str, float] | None = None
        last = self._last
        for k in self._keys:
            now = extra[k] if k in extra else counters.get(k, 0)
            if now != last[k]:
                if delta is None:
                    delta = {}
                delta[k] = now - last[k]
                last[k] = now
        return OrbitKVConnectorStats(data=delta) if delta is not None else None


@dataclass
class OrbitKVConnectorStats(KVConnectorStats):
    """Per-interval increments of OrbitKV's counters (`KEYS`)."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}  # vLLM's KVConnectorStats.data

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            if k in KEYS:
                self.data[k] = self.data.get(k, 0) + v
            elif k in SAMPLE_KEYS:
                self.data[k] = [*self.data.get(k, ()), *v]
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: self.data[k] for k in KEYS if k in self.data}
        asked = self.data.get("lookup_blocks", 0)
        if asked:
            out["hit_rate"] = round(self.data.get("hit_blocks", 0) / asked, 4)
        for k in SAMPLE_KEYS:
            samples = self.data.get(k)
            if samples:
                out[f"{k}_p50_ms"] = _quantile_ms(samples, 0.5)
                out[f"{k}_p99_ms"] = _quantile_ms(samples, 0.99)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in (*KEYS, *SAMPLE_KEYS))


class OrbitKVPromMetrics(KVConnectorPromMetrics):
    """`vllm:orbitkv_<key>_total` counters and the `vllm:orbitkv_<sample key>_seconds`
    histograms, per engine."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters: dict[str, dict[int, Any]] = {}
        for key, doc in KEYS.items():
            counter = self._counter_cls(name=f"vllm:orbitkv_{key}", documentation=doc, labelnames=labelnames)
            self.counters[key] = {idx: counter.labels(*values) for idx, values in self.per_engine_labelvalues.items()}
        self.histograms: dict[str, dict[int, Any]] = {}
        for key, doc in SAMPLE_KEYS.items():
            hist = self._histogram_cls(
                name=f"vllm:orbitkv_{key}_seconds", documentation=doc, buckets=DURATION_BUCKETS, labelnames=labelnames
            )
            self.histograms[key] = {idx: hist.labels(*values) for idx, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            per_engine = self.counters.get(key)
            if per_engine is not None and value > 0:
                per_engine[engine_idx].inc(value)
                continue
            hist = self.histograms.get(key)
            if hist is not None:
                for seconds in value:
                    hist[engine_idx].observe(seconds)
