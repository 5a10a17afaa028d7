"""Online throughput estimates and the speculative surplus, per model, request class and span kind.

Speculative throughput is tokens per cycle over seconds per cycle, and the two factors depend on
different things, so they are learned separately and combined at the context length at hand:
- tokens per cycle (tau) depends on what is generated: keyed by (model, class, span, block size);
- seconds per spec cycle depend on shapes: keyed by (model, block size, context bucket);
- seconds per AR step likewise: keyed by (model, context bucket).
Timings are learned from every request of a model, and also per (class, span) (`timing_scope`
"class", the default): a grammar's masks and a span's per-step work add to every step of a
constrained span (on the agent workload an AR step of a JSON answer or a forced tool call took
2.6-3.3 ms where free text took 1.9), so the model-wide mean, a mix of them, made AR look slower
than lookup (learned per class) in free text and faster than it is in JSON. A (class, span)
reads its own timing once measured, else the model's (`_timing`).
A spec cycle at block B that accepted `a` draft tokens also says what a smaller block b would have
committed (`min(a, b - 1) + 1`), so smaller block sizes learn tau from the same measurements.
Tau never falls with the block size: a larger block's tau is floored by a smaller block's
measured in the same scope (`_tau_mean`). Tau is also pooled per span kind over all classes
(label `*`) and over everything (span `*`): a class or span seen for the first time starts
from a prior (worth at most `PRIOR_SAMPLES` samples, and reported with 0 own samples, so it is
still probed): the class's calibrated tau (`prior_tau`, from `toolflash calibrate`), else the pool.

Grammar-forced runs (a constraint fixed the next tokens and the stretch was fed to the target in
one forward, without the drafter: `CycleRecord.forced`) are learned apart, per (model, class,
span): per mode, the share of that mode's committed tokens they commit, and per arm (the
block cuts a run: 16 takes a long stretch in one forward where 8 takes two) their seconds and
tokens per run; an arm with none measured borrows the least-cut runs (`_forced_runs`). They
never feed tau, the spec cycle timing or the AR step timing (they are no measure of the
drafter, are shorter than the block, and commit several tokens per AR step); a spec cycle and an AR step ("jump-forward")
both take forced runs, so each arm's seconds per token mix its plain cycles or steps with the
forced runs in its measured share (`with_forced`, `ar` with a scope). Throughput is always
committed tokens per second: an AR step that committed a run counts all its tokens.

Lookup drafting (engine/lookup.py) is learned whole, per (model, class, span, block): committed
tokens and seconds per lookup step, hits and misses alike (a miss is an AR step), since how often
the output copies its context and how long the copies run both depend on what is generated, and a
step's cost on how much it drafted. Pooled per span kind and over everything like tau. Whether an
output copies is a property of the request more than of the step (one JSON answer copies a
table's keys, the next copies nothing), so lookup's own samples count the requests it was measured
in, not its steps: a few steps of one request that copied nothing measure that request, not the
class (on the agent workload they ruled lookup out of JSON answers for good, where lookup was the
faster arm over the class).

Every estimate is an exponentially decayed mean with variance: each new sample multiplies the old
weight by `sample_decay`, and weight also halves every `half_life_s` seconds of the injected clock,
so estimates follow the workload and stale ones become uncertain (and get re-probed).
Surplus = spec tok/s - AR tok/s, with a standard error from both; `p_positive` is the confidence
that spec is faster. All of it is plain Python floats: called between cycles, microseconds each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator

from .stat import Stat, context_bucket, normal_cdf
from .throughput import UNKNOWN, Surplus, Throughput

__all__ = ["Estimates", "Stat", "context_bucket", "normal_cdf"]

Clock = Callable[[], float]

# Relative noise floors: a handful of identical samples must not look certain.
_TIME_REL_FLOOR = 0.05
_TAU_ABS_FLOOR = 0.5
# Timing samples above this multiple of the current mean are clipped to it (once the mean rests
# on a few samples): other processes' bursts only ever slow a step down, by up to several times
# on a shared machine, and one burst must not flip a decision. A real, lasting slowdown still
# moves the mean, by up to this factor per sample.
TIME_CLIP = 2.0
_CLIP_AFTER = 4
PRIOR_SAMPLES = 4.0
POOL = "*"
AR_RUNS = 0  # the block key of forced runs that AR steps took


TauKey = tuple[str, str, str, int]  # model, class label, span kind, block size
ScopeKey = tuple[str, str, str]  # model, class label, span kind
CycleKey = tuple[str, int, int]  # model, block size, context bucket
ArKey = tuple[str, int]  # model, context bucket


class Estimates:
    """All learned estimates of one process (every model it serves)."""

    def __init__(
        self,
        *,
        sample_half_life: float = 200.0,
        half_life_s: float = 6 * 3600.0,
        smallest_bucket: int = 256,
        clock: Clock = time.time,
        timing_scope: str = "class",
        lookup_samples: str = "requests",
    ) -> None:
        self.sample_decay = 0.5 ** (1.0 / sample_half_life) if sample_half_life > 0 else 1.0
        self.half_life_s = half_life_s
        self.smallest_bucket = smallest_bucket
        self.clock = clock
        self.timing_scope = timing_scope
        self.lookup_samples = lookup_samples
        self.tau: dict[TauKey, Stat] = {}
        # Tau per class measured on calibration's built-in prompts (`policy/calibration.py`):
        # a prior like the pooled ones (read before them), never an own measurement, since
        # those prompts only guess at this class's traffic.
        self.prior_tau: dict[TauKey, Stat] = {}
        self.cycle_s: dict[CycleKey, Stat] = {}
        self.ar_s: dict[ArKey, Stat] = {}
        # The same timings per (class, span): every step is added to both (`_timing` reads).
        self.cycle_scope_s: dict[tuple[str, str, str, int, int], Stat] = {}
        self.ar_scope_s: dict[tuple[str, str, str, int], Stat] = {}
        # Forced runs per scope: committed tokens of every spec cycle and of the forced ones only
        # (added together, so the ratio of their sums is the decayed forced share), and per
        # forced cycle its seconds and committed tokens, by the block of the arm that ran it
        # (a run is cut at the block: 16 commits longer runs per forward than 8; AR is 0).
        self.spec_tokens: dict[ScopeKey, Stat] = {}
        self.forced_tokens: dict[ScopeKey, Stat] = {}
        self.forced_block_s: dict[TauKey, Stat] = {}
        self.forced_block_n: dict[TauKey, Stat] = {}
        self._forced_blocks: dict[ScopeKey, set[int]] = {}
        # The same share for AR: tokens of every AR step, and of those that took a forced run.
        self.ar_tokens: dict[ScopeKey, Stat] = {}
        self.ar_forced_tokens: dict[ScopeKey, Stat] = {}
        # Block sizes with a tau entry, per scope (for the monotone floor, `_tau_mean`).
        self._tau_blocks: dict[ScopeKey, set[int]] = {}
        # Tau observations for the pooled priors (every class of a span; every span), applied
        # when a prior is read or the tables are saved: the priors serve classes and spans
        # without their own measurements, so the per-cycle path need not update them.
        self._pooled: list[tuple[str, str, int, float, float]] = []
        # Lookup steps: committed tokens and seconds per step (the pools under POOL labels).
        self.lookup_tokens: dict[TauKey, Stat] = {}
        self.lookup_s: dict[TauKey, Stat] = {}
        # ... and the requests they came from (1 per request and key: its effective weight is
        # lookup's own samples there).
        self.lookup_requests: dict[TauKey, Stat] = {}

    def bucket(self, context_len: int) -> int:
        return context_bucket(context_len, self.smallest_bucket)

    # -- observations -----------------------------------------------------------------------
    def observe_spec(
        self,
        model: str,
        label: str,
        span: str,
        block_size: int,
        accepted: int,
        seconds: float | None,
        context_len: int,
        block_sizes: Iterable[int] = (),
    ) -> None:
        """One speculative cycle at `block_size` that accepted `accepted` draft tokens in
        `seconds` (None: tau only, the cycle ran a shorter block than `block_size` because the
        grammar ended the draft). `block_sizes` lists smaller candidate blocks to credit
        counterfactually."""
        now = self.clock()
        self._add_share((model, label, span), accepted + 1.0, 0.0, now)
        if seconds is not None:
            bucket = self.bucket(context_len)
            self._add(self.cycle_s, (model, block_size, bucket), seconds, now, True)
            key = (model, label, span, block_size, bucket)
            self._add(self.cycle_scope_s, key, seconds, now, True)
        scope = (model, label, span)
        blocks = self._tau_blocks.setdefault(scope, set())
        for b in {block_size, *block_sizes}:
            if 1 < b <= block_size:
                x = min(accepted, b - 1) + 1.0
                self._add(self.tau, (*scope, b), x, now)
                blocks.add(b)
                self._pooled.append((model, span, b, x, now))

    def flush_pooled(self) -> None:
        """Apply the pending observations to the pooled priors (in their order, at their time)."""
        pending, self._pooled = self._pooled, []
        for model, span, b, x, now in pending:
            for scope in ((model, POOL, span), (model, POOL, POOL)):
                self._add(self.tau, (*scope, b), x, now)
                self._tau_blocks.setdefault(scope, set()).add(b)

    def observe_forced(
        self,
        model: str,
        label: str,
        span: str,
        committed: int,
        seconds: float | None,
        mode: str = "spec",
        block_size: int | None = None,
    ) -> None:
        """One grammar-forced run, a spec cycle of the arm at `block_size` or (`mode` "ar") an
        AR step: `committed` tokens (the forced run and the target's token after it) in
        `seconds`, without a drafter run (None: its share of the tokens only, untimed)."""
        if committed <= 0:
            return
        now = self.clock()
        key = (model, label, span)
        if mode == "ar":
            self._add_ar_share(key, float(committed), float(committed), now)
            block_size = AR_RUNS
        elif block_size is None or block_size < 2:
            raise ValueError("a spec forced run needs the block size of the arm that ran it")
        else:
            self._add_share(key, float(committed), float(committed), now)
        if seconds is None:
            return
        self._add(self.forced_block_s, (*key, block_size), seconds, now, True)
        self._add(self.forced_block_n, (*key, block_size), float(committed), now)
        self._forced_blocks.setdefault(key, set()).add(block_size)

    def _add_share(self, key: ScopeKey, committed: float, forced: float, now: float) -> None:
        self._add(self.spec_tokens, key, committed, now)
        self._add(self.forced_tokens, key, forced, now)

    def _add_ar_share(self, key: ScopeKey, committed: float, forced: float, now: float) -> None:
        self._add(self.ar_tokens, key, committed, now)
        self._add(self.ar_forced_tokens, key, forced, now)

    def observe_lookup(
        self,
        model: str,
        label: str,
        span: str,
        block_size: int,
        committed: int,
        seconds: float | None,
        first: bool = False,
    ) -> None:
        """One lookup step at `block_size` (a verified continuation, or an AR step where none
        matched) that committed `committed` tokens in `seconds` (None: tokens only, untimed);
        `first`: the request's first lookup step in this span and block (it counts a request)."""
        now = self.clock()
        for scope_label, scope_span in ((label, span), (POOL, span), (POOL, POOL)):
            key = (model, scope_label, scope_span, block_size)
            if first:
                self._add(self.lookup_requests, key, 1.0, now)
            self._add(self.lookup_tokens, key, float(committed), now)
            if seconds is not None:
                self._add(self.lookup_s, key, seconds, now, True)

    def observe_ar(
        self, model: str, seconds: float | None, context_len: int, scope: ScopeKey | None = None
    ) -> None:
        """One target-only step of one token that took `seconds` (None: untimed; an AR step
        that took a forced run goes to `observe_forced`). `scope` (model, class, span) also
        counts its token for the AR forced share there."""
        now = self.clock()
        bucket = self.bucket(context_len)
        if seconds is not None:
            self._add(self.ar_s, (model, bucket), seconds, now, True)
            if scope is not None:
                self._add(self.ar_scope_s, (*scope, bucket), seconds, now, True)
        if scope is not None:
            self._add_ar_share(scope, 1.0, 0.0, now)

    def _add(self, table: dict, key: tuple, x: float, now: float, clip: bool = False) -> None:
        stat = table.get(key)
        if stat is None:
            stat = table[key] = Stat()
        if clip and stat.count >= _CLIP_AFTER:
            x = min(x, TIME_CLIP * stat.mean)
        stat.add(x, now, self.sample_decay, self.half_life_s)

    # -- reads --------------------------------------------------------------------------------
    def ar(
        self, model: str, context_len: int, label: str | None = None, span: str | None = None
    ) -> Throughput:
        """AR tokens/s at this context length: one-token steps only, or, for a class and span,
        with the forced runs AR steps took there mixed in at their measured share."""
        stat = self._timing(self.ar_s, self.ar_scope_s, model, label, span, (), context_len)
        if stat is None:
            return UNKNOWN
        plain = self._rate(1.0, 0.0, stat, self.clock())
        if label is None or span is None:
            return plain
        key = (model, label, span)
        # An AR step feeds the whole run (up to 16 rows, as long as any block's): one forced
        # step per measured run, wherever it was measured.
        runs = self._forced_runs(key, AR_RUNS)
        if runs is None:
            return plain
        return self._mix_forced(
            runs, _share(self.ar_tokens, self.ar_forced_tokens, key), 1.0, plain
        )

    def spec(
        self, model: str, label: str, span: str, block_size: int, context_len: int
    ) -> tuple[Throughput, float]:
        """Spec tokens/s and tau for this class, span and block at this context length."""
        now = self.clock()
        tau = self.tau.get((model, label, span, block_size))
        own = tau.effective(now, self.half_life_s) if tau is not None else 0.0
        n_tau = own
        prior = ""
        if tau is None or own <= 0:
            if self._pooled:
                self.flush_pooled()
            prior = "class"
            tau = self.prior_tau.get((model, label, span, block_size))
            if tau is None:
                prior = "pool"
                tau = self.tau.get((model, POOL, span, block_size)) or self.tau.get(
                    (model, POOL, POOL, block_size)
                )
            if tau is None:
                return UNKNOWN, 0.0
            n_tau, own = min(tau.effective(now, self.half_life_s), PRIOR_SAMPLES), 0.0
        cyc = self._timing(
            self.cycle_s, self.cycle_scope_s, model, label, span, (block_size,), context_len
        )
        mean = self._tau_mean(model, label, span, block_size, tau) if own > 0 else tau.mean
        if cyc is None or n_tau <= 0:
            return UNKNOWN, mean
        tau_se = math.sqrt(max(tau.var, _TAU_ABS_FLOOR**2) / n_tau)
        drafted = self._rate(mean, tau_se, cyc, now, own, prior)
        return self.with_forced(model, label, span, block_size, drafted), mean

    def lookup(
        self, model: str, label: str, span: str, block_size: int
    ) -> tuple[Throughput, float]:
        """Lookup tokens/s and tokens per step for this class, span and block: its own, else
        the span's or the model's pool as a prior (0 own samples, so it is still probed). Own
        samples are the requests measured (`lookup_requests`); the spread is the steps'."""
        now = self.clock()
        own = 0.0
        for scope_label, scope_span in ((label, span), (POOL, span), (POOL, POOL)):
            key = (model, scope_label, scope_span, block_size)
            tokens, secs = self.lookup_tokens.get(key), self.lookup_s.get(key)
            if tokens is None or secs is None:
                continue
            n = tokens.effective(now, self.half_life_s)
            if n <= 0:
                continue
            if scope_label == label:
                own = n
                if self.lookup_samples == "requests":
                    requests = self.lookup_requests.get(key)
                    own = min(n, requests.effective(now, self.half_life_s) if requests else 0.0)
            else:
                n = min(n, PRIOR_SAMPLES)
            tokens_se = math.sqrt(max(tokens.var, (_TIME_REL_FLOOR * tokens.mean) ** 2) / n)
            return self._rate(tokens.mean, tokens_se, secs, now, own), tokens.mean
        return UNKNOWN, 0.0

    def _tau_mean(self, model: str, label: str, span: str, block_size: int, tau: Stat) -> float:
        """Tau at `block_size`, floored by the tau measured at any smaller block here: a larger
        block commits at least what a smaller one would (`min(a, b - 1) + 1 <= a + 1`), so a
        lower mean at the larger block is sampling noise (a few probe cycles on harder text).
        Without the floor, three unlucky probe cycles at 16 kept block 16 looking hopeless,
        and never probed again, in a class where it was the best block."""
        mean = tau.mean
        now = self.clock()
        for b in self._tau_blocks.get((model, label, span), ()):
            if b < block_size:
                smaller = self.tau.get((model, label, span, b))
                if smaller is not None and smaller.effective(now, self.half_life_s) > 0:
                    mean = max(mean, smaller.mean)
        return mean

    def cycle_seconds(self, model: str, block_size: int, context_len: int) -> float | None:
        """Mean seconds of a drafted cycle at this block near this context length, or None."""
        stat = self._near(self.cycle_s, model, (block_size,), self.bucket(context_len))
        return stat.mean if stat is not None and stat.mean > 0 else None

    def forced_share(self, model: str, label: str, span: str) -> float:
        """Share of spec-committed tokens that forced cycles committed here (0.0 unknown)."""
        return _share(self.spec_tokens, self.forced_tokens, (model, label, span))

    def ar_forced_share(self, model: str, label: str, span: str) -> float:
        """Share of AR-committed tokens that AR steps with a forced run committed here."""
        return _share(self.ar_tokens, self.ar_forced_tokens, (model, label, span))

    def with_forced(
        self, model: str, label: str, span: str, block_size: int, drafted: Throughput
    ) -> Throughput:
        """The spec arm's throughput at `block_size` when a share of its tokens comes from
        forced cycles: seconds per token are the drafted cycles' and the forced cycles' in
        their measured shares. A forced run is at most `block_size - 1` tokens plus the
        target's one: runs measured at this block count as they are; else the runs measured
        where they were cut least (most tokens per forward) stand in, taking proportionally
        more cycles at a smaller block. (Runs cut at 8 standing in for 16 made 16 look no
        better than 8 on forced tool calls, where it takes one cycle fewer.) Unchanged where
        nothing forced was measured."""
        key = (model, label, span)
        runs = self._forced_runs(key, block_size)
        if runs is None:
            return drafted
        cycles = max(1.0, runs[1].mean / block_size)  # cycles per measured forced cycle
        return self._mix_forced(runs, self.forced_share(model, label, span), cycles, drafted)

    def _forced_runs(self, key: ScopeKey, block_size: int) -> tuple[Stat, Stat] | None:
        """(seconds, committed tokens) per forced cycle for an arm at `block_size` (AR:
        `AR_RUNS`): its own, else those with the most tokens per forced cycle here."""
        best: tuple[Stat, Stat] | None = None
        for b in self._forced_blocks.get(key, ()):
            secs = self.forced_block_s.get((*key, b))
            toks = self.forced_block_n.get((*key, b))
            if secs is None or toks is None or toks.mean <= 0:
                continue
            if b == block_size:
                return secs, toks
            if best is None or toks.mean > best[1].mean:
                best = (secs, toks)
        return best

    def _mix_forced(
        self, runs: tuple[Stat, Stat], phi: float, cycles: float, base: Throughput
    ) -> Throughput:
        """`base` (tokens/s of plain cycles or steps) with a share `phi` of the tokens from
        forced runs, each taking `cycles` forwards of the measured forced-run time."""
        secs, toks = runs
        if not base.known or phi <= 0 or toks.mean <= 0:
            return base
        forced_spt = secs.mean * cycles / toks.mean
        base_spt = 1.0 / base.tps
        spt = (1.0 - phi) * base_spt + phi * forced_spt
        tps = 1.0 / spt
        # The plain part carries its relative error in proportion to its share of the time;
        # the forced part adds its own timing noise (floored like every timing).
        n = max(secs.effective(self.clock(), self.half_life_s), 1e-9)
        forced_rel = math.sqrt(max(secs.var, (_TIME_REL_FLOOR * secs.mean) ** 2) / n) / secs.mean
        d_share = (1.0 - phi) * base_spt / spt
        f_share = phi * forced_spt / spt
        rel = math.hypot(d_share * base.std / base.tps, f_share * forced_rel)
        return Throughput(tps, tps * rel, base.samples, base.prior)

    def measured_tau(self, model: str, label: str, span: str, block_size: int) -> float | None:
        """Tau measured for exactly this class and span (no prior), or None."""
        tau = self.tau.get((model, label, span, block_size))
        if tau is None or tau.effective(self.clock(), self.half_life_s) <= 0:
            return None
        return self._tau_mean(model, label, span, block_size, tau)

    def surplus(
        self, model: str, label: str, span: str, block_size: int, context_len: int
    ) -> Surplus:
        spec, tau = self.spec(model, label, span, block_size, context_len)
        return Surplus(spec, self.ar(model, context_len, label, span), tau, block_size)

    def _rate(
        self,
        tokens: float,
        tokens_se: float,
        stat: Stat,
        now: float,
        n_tokens: float = math.inf,
        prior: str = "",
    ) -> Throughput:
        n = stat.effective(now, self.half_life_s)
        mean_s = stat.mean
        if mean_s <= 0 or n <= 0:
            return UNKNOWN
        s_se = math.sqrt(max(stat.var, (_TIME_REL_FLOOR * mean_s) ** 2) / max(n, 1e-9))
        tps = tokens / mean_s
        # Delta method for a ratio of independent estimates.
        rel = (tokens_se / tokens) ** 2 if tokens > 0 else 0.0
        std = tps * math.sqrt(rel + (s_se / mean_s) ** 2)
        return Throughput(tps, std, min(n, n_tokens), prior)

    def _timing(
        self,
        pool: dict,
        scoped: dict,
        model: str,
        label: str | None,
        span: str | None,
        mid: tuple,
        context_len: int,
    ) -> Stat | None:
        """A timing near this context: the (class, span)'s own where it has one (and
        `timing_scope` is "class"), else the model's."""
        bucket = self.bucket(context_len)
        if self.timing_scope == "class" and label is not None and span is not None:
            own = self._near(scoped, model, (label, span, *mid), bucket)
            if own is not None:
                return own
        return self._near(pool, model, mid, bucket)

    def _near(self, table: dict, model: str, mid: tuple, bucket: int) -> Stat | None:
        """The stat at this bucket, else the nearest bucket that has one (a cold bucket borrows
        its neighbour's timing rather than knowing nothing)."""
        stat = table.get((model, *mid, bucket))
        if stat is not None:
            return stat
        best: Stat | None = None
        best_d = math.inf
        for key, value in table.items():
            if key[0] == model and tuple(key[1:-1]) == mid:
                d = abs(math.log2(key[-1]) - math.log2(bucket))
                if d < best_d:
                    best, best_d = value, d
        return best

    # -- persistence --------------------------------------------------------------------------
    def to_json(self) -> dict[str, list[list]]:
        self.flush_pooled()
        return {
            name: [[*k, *v.to_list()] for k, v in getattr(self, name).items()] for name in _TABLES
        }

    def load_json(self, data: dict) -> int:
        """Merge persisted estimates (replacing same keys); returns how many were loaded.
        Raises ValueError on a malformed document."""
        parsed: dict[str, dict] = {}
        # Files from before forced runs (or AR's) were learned lack their tables: those stay empty.
        for name, kinds in _TABLES.items():
            rows = data.get(name, [])
            if not isinstance(rows, list):
                raise ValueError(f"{name}: not a list")
            width = len(kinds)
            table: dict = parsed.setdefault(name, {})
            for row in rows:
                if not isinstance(row, list) or len(row) != width + 5:
                    raise ValueError(f"{name}: bad row {row!r}")
                key = tuple(row[:width])
                if not all(type(v) is kind for kind, v in zip(kinds, key)):
                    raise ValueError(f"{name}: bad key {key!r}")
                table[key] = Stat.from_list(row[width:])
        # Only a wholly valid document is merged.
        for name, table in parsed.items():
            getattr(self, name).update(table)
        for model, label, span, b in self.tau:
            self._tau_blocks.setdefault((model, label, span), set()).add(b)
        for model, label, span, b in self.forced_block_s:
            self._forced_blocks.setdefault((model, label, span), set()).add(b)
        return sum(len(t) for t in parsed.values())

    def models(self) -> Iterator[str]:
        seen = {k[0] for name in _TABLES for k in getattr(self, name)}
        return iter(sorted(seen))


# Persisted tables and the types of their key fields.
_TABLES: dict[str, tuple[type, ...]] = {
    "tau": (str, str, str, int),
    "prior_tau": (str, str, str, int),
    "cycle_s": (str, int, int),
    "ar_s": (str, int),
    "cycle_scope_s": (str, str, str, int, int),
    "ar_scope_s": (str, str, str, int),
    "spec_tokens": (str, str, str),
    "forced_tokens": (str, str, str),
    # Per (scope, arm block); named apart from the per-scope tables of older files (whose
    # rows are ignored, so a run cut at one block is never read as another's).
    "forced_block_s": (str, str, str, int),
    "forced_block_n": (str, str, str, int),
    "ar_tokens": (str, str, str),
    "ar_forced_tokens": (str, str, str),
    "lookup_tokens": (str, str, str, int),
    "lookup_s": (str, str, str, int),
    "lookup_requests": (str, str, str, int),
}


def _share(total: dict[ScopeKey, Stat], part: dict[ScopeKey, Stat], key: ScopeKey) -> float:
    """The decayed share part / total at `key` (0.0 unknown): both sums get every sample."""
    t, f = total.get(key), part.get(key)
    if t is None or f is None or t.s1 <= 0:
        return 0.0
    return min(max(f.s1 / t.s1, 0.0), 1.0)
