"""Prometheus metrics for one app (own registry), vLLM-style names under a `toolflash:` prefix.

Speculative counters follow vLLM's `spec_decode_*` schema, so its PromQL recipes apply:
mean acceptance length = 1 + num_accepted_tokens / num_drafts.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from toolflash.gateway.record import RequestRecord

LABELS = ("model", "request_class", "mode")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5)


def rss_bytes() -> int:
    """Current resident set size of this process (peak RSS where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def mlx_memory() -> tuple[int, int] | None:
    """(active, cache) bytes of MLX's allocator, or None when mlx is not importable."""
    if importlib.util.find_spec("mlx") is None:
        return None
    try:
        import mlx.core as mx

        return int(mx.get_active_memory()), int(mx.get_cache_memory())
    except (ImportError, AttributeError, RuntimeError):
        return None


class _ProcessCollector(Collector):
    """Memory gauges read at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "toolflash:process_resident_memory_bytes", "Resident set size.", value=rss_bytes()
        )
        mem = mlx_memory()
        if mem is not None:
            yield GaugeMetricFamily(
                "toolflash:mlx_active_memory_bytes", "MLX active memory.", value=mem[0]
            )
            yield GaugeMetricFamily(
                "toolflash:mlx_cache_memory_bytes", "MLX buffer cache memory.", value=mem[1]
            )


class StatsCollector(Collector):
    """Counters owned by other components (prefix cache, policy), read at scrape time.

    `flat()` returns {name: value} exported as `toolflash:<prefix>_<name>`; `labelled()`
    returns {name: [{"labels": {...}, "value": n}]} exported the same way with labels."""

    def __init__(
        self,
        prefix: str,
        flat: Callable[[], dict[str, int]] | None = None,
        labelled: Callable[[], dict[str, list[dict[str, Any]]]] | None = None,
    ) -> None:
        self.prefix = prefix
        self.flat = flat
        self.labelled = labelled

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, value in sorted((self.flat() if self.flat else {}).items()):
            yield GaugeMetricFamily(
                f"toolflash:{self.prefix}_{name}", f"{self.prefix} {name}.", value=value
            )
        for name, rows in sorted((self.labelled() if self.labelled else {}).items()):
            keys = sorted({k for row in rows for k in row["labels"]})
            family = GaugeMetricFamily(
                f"toolflash:{self.prefix}_{name}", f"{self.prefix} {name}.", labels=keys
            )
            for row in rows:
                family.add_metric([str(row["labels"].get(k, "")) for k in keys], row["value"])
            yield family


class GatewayMetrics:
    """The app's metrics; `render()` is the /metrics body."""

    def __init__(self, waiting: Callable[[], int], running: Callable[[], int]) -> None:
        # `*_created` timestamp series double the exposition for nothing a scraper needs
        # (a process-wide prometheus-client switch).
        disable_created_metrics()
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "toolflash:requests",
            "Finished requests, by API dialect (chat, completions, messages, responses).",
            [*LABELS, "api", "outcome", "finish_reason"],
            registry=r,
        )
        self.rejected = Counter(
            "toolflash:requests_rejected",
            "Requests refused before generation, by status.",
            ["status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "toolflash:prompt_tokens", "Prompt tokens.", LABELS, registry=r
        )
        self.cached_tokens = Counter(
            "toolflash:prompt_cached_tokens", "Prompt tokens served from cache.", LABELS, registry=r
        )
        self.generation_tokens = Counter(
            "toolflash:generation_tokens", "Generated tokens.", LABELS, registry=r
        )
        self.num_drafts = Counter(
            "toolflash:spec_decode_num_drafts",
            "Speculative cycles (drafts verified).",
            LABELS,
            registry=r,
        )
        self.num_draft_tokens = Counter(
            "toolflash:spec_decode_num_draft_tokens", "Draft tokens proposed.", LABELS, registry=r
        )
        self.num_accepted_tokens = Counter(
            "toolflash:spec_decode_num_accepted_tokens",
            "Draft tokens accepted.",
            LABELS,
            registry=r,
        )
        self.num_accepted_tokens_per_pos = Counter(
            "toolflash:spec_decode_num_accepted_tokens_per_pos",
            "Drafts accepted at each block position.",
            [*LABELS, "position"],
            registry=r,
        )
        self.tool_calls = Counter(
            "toolflash:tool_calls",
            "Tool-call spans in outputs, by how they parsed.",
            [*LABELS, "result"],
            registry=r,
        )
        self.cycles = Counter(
            "toolflash:decode_cycles", "Decode cycles (an AR step is a cycle).", LABELS, registry=r
        )
        # Grammar-constrained requests (response_format JSON, forced or strict tool calls).
        self.constraint_mask_rows = Counter(
            "toolflash:constraint_mask_rows", "Grammar mask rows computed.", LABELS, registry=r
        )
        self.constraint_mask_seconds = Counter(
            "toolflash:constraint_mask_seconds",
            "Time computing and applying grammar masks.",
            LABELS,
            registry=r,
        )
        self.constraint_drafted_tokens = Counter(
            "toolflash:constraint_drafted_tokens",
            "Drafted tokens the grammar checked (forced runs excluded).",
            LABELS,
            registry=r,
        )
        self.constraint_rejected_tokens = Counter(
            "toolflash:constraint_rejected_tokens",
            "Drafted tokens the grammar rejected (the first forbidden one and all after it).",
            LABELS,
            registry=r,
        )
        self.constraint_cuts = Counter(
            "toolflash:constraint_cuts", "Drafts the grammar cut short.", LABELS, registry=r
        )
        self.constraint_forced_runs = Counter(
            "toolflash:constraint_forced_runs",
            "Grammar-forced runs verified without drafting them.",
            LABELS,
            registry=r,
        )
        self.constraint_forced_tokens = Counter(
            "toolflash:constraint_forced_tokens",
            "Tokens in grammar-forced runs.",
            LABELS,
            registry=r,
        )
        self.ttft = Histogram(
            "toolflash:time_to_first_token_seconds",
            "Arrival to first generated token.",
            LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "toolflash:time_per_output_token_seconds",
            "Decode time per output token after the first.",
            LABELS,
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "toolflash:e2e_request_latency_seconds",
            "Arrival to last byte.",
            LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "toolflash:request_queue_time_seconds",
            "Time waiting for the engine.",
            LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        Gauge("toolflash:num_requests_waiting", "Requests queued.", registry=r).set_function(
            lambda: float(waiting())
        )
        Gauge("toolflash:num_requests_running", "Requests generating.", registry=r).set_function(
            lambda: float(running())
        )
        r.register(_ProcessCollector())

    def record(self, o: RequestRecord) -> None:
        """Count a finished request (one that was prepared; refusals go to `rejected`)."""
        labels = (o.model, o.request_class, o.mode)
        self.requests.labels(*labels, o.api, o.outcome, o.finish_reason or "none").inc()
        self.queue_time.labels(*labels).observe(o.timings.queue_s)
        self.e2e.labels(*labels).observe(o.timings.e2e_s)
        if o.timings.ttft_s is not None:
            self.ttft.labels(*labels).observe(o.timings.ttft_s)
        for result in o.tool_results:
            self.tool_calls.labels(*labels, result).inc()
        s = o.stats
        if s is None:
            return
        self.prompt_tokens.labels(*labels).inc(s.prompt_tokens)
        self.cached_tokens.labels(*labels).inc(s.cached_tokens)
        self.generation_tokens.labels(*labels).inc(s.completion_tokens)
        self.cycles.labels(*labels).inc(len(s.cycles))
        if s.completion_tokens > 1 and s.decode_s > 0:
            self.tpot.labels(*labels).observe(s.decode_s / (s.completion_tokens - 1))
        per_pos: dict[int, int] = {}
        for c in s.cycles:
            if c.mode != "spec":
                continue
            for k in range(c.accepted):
                per_pos[k] = per_pos.get(k, 0) + 1
        c = s.constraint
        if c is not None:
            self.constraint_mask_rows.labels(*labels).inc(c.mask_rows)
            self.constraint_mask_seconds.labels(*labels).inc(c.mask_s)
            self.constraint_drafted_tokens.labels(*labels).inc(c.drafted)
            self.constraint_rejected_tokens.labels(*labels).inc(c.grammar_rejected)
            self.constraint_cuts.labels(*labels).inc(c.grammar_cuts)
            self.constraint_forced_runs.labels(*labels).inc(c.forced_runs)
            self.constraint_forced_tokens.labels(*labels).inc(c.forced_tokens)
        if s.spec_cycles:
            self.num_drafts.labels(*labels).inc(s.spec_cycles)
            self.num_draft_tokens.labels(*labels).inc(s.drafted)
            self.num_accepted_tokens.labels(*labels).inc(s.accepted)
            for k, n in sorted(per_pos.items()):
                self.num_accepted_tokens_per_pos.labels(*labels, str(k)).inc(n)

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)
