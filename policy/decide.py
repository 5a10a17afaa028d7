"""The policy's decisions as pure functions of a span's rule and the throughput estimates read for it.

An arm is what a step runs: AR, spec at one block size, or lookup (drafts copied from the prompt
and output, engine/lookup.py) at its block. Given the rule of a (class, span kind)
and the estimates of its arms (`Throughput` per arm, read by the controller once per step):
- `arms`: the arms a rule allows under the drafter's largest block and the engine's lookup block;
- `choose`: the arm for a span, keeping the current one unless another is faster by the switch
  margin with confidence (a span's first decision picks its block afresh: `settled_block`);
- `settled_block`: the spec block to settle on (the largest, unless a smaller is clearly faster);
- `could_win`: whether spec at a block could beat the best arm at all (probing it is pure loss
  where it cannot);
- `probe_reason` / `pick_probe`: whether an arm deserves a probe, and which one;
  `probe_fits`: whether a probe of some length fits the request's probe share;
- `beats`: a probe's verdict from the estimates; `local_verdict`: an opening's, retry's or grow
  probe's from the request's own tokens per cycle;
- `grow_target`: the larger block to probe where the current one keeps accepting whole blocks.
Nothing here reads state or has effects: the controller reads, these decide.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from .config import SpanRule
from .stat import normal_cdf
from .throughput import UNKNOWN, Throughput

Arm = tuple[str, int]  # ("ar", 1), ("spec", block_size) or ("lookup", block_size)
Scope = tuple[str, str, str]  # model, class label, span kind
Verdict = Literal["spec", "ar", "unsure"]
# (arm, reason, decision kind)
Choice = tuple[Arm, str, str]

AR: Arm = ("ar", 1)


def arm_name(arm: Arm) -> str:
    return "ar" if arm[0] == "ar" else f"{arm[0]}{arm[1]}"


def fmt(arm: Arm, est: Mapping[Arm, Throughput]) -> str:
    """`spec8 600±3 tok/s`, or `spec8 ?` when not measured."""
    t = est.get(arm, UNKNOWN)
    if not t.known:
        return f"{arm_name(arm)} ?"
    return f"{arm_name(arm)} {t.tps:.0f}±{t.std:.0f} tok/s"


def p_better(alt: Throughput, cur: Throughput) -> float:
    """Confidence that `alt` is faster than `cur` (0.5 when either is unknown)."""
    if not (alt.known and cur.known):
        return 0.5
    std = math.sqrt(alt.std**2 + cur.std**2)
    if not math.isfinite(std):
        return 0.5
    if std <= 0:
        return 1.0 if alt.tps > cur.tps else 0.0
    return normal_cdf((alt.tps - cur.tps) / std)


def beats(alt: Throughput, cur: Throughput, rule: SpanRule) -> bool:
    """Whether `alt` is faster than `cur` by the switch margin with the confidence to switch."""
    return (
        alt.known
        and cur.known
        and alt.tps > cur.tps * (1.0 + rule.switch_margin)
        and p_better(alt, cur) >= rule.min_confidence
    )


def arms(rule: SpanRule, max_block: int, lookup_block: int = 0) -> list[Arm]:
    """The arms `rule` allows: spec at each of its blocks up to `max_block` (the drafter's
    largest; below 2: no drafter), largest first, then lookup at `lookup_block` (0: the engine
    runs none), then AR. A rule for an arm the engine cannot run falls back to AR."""
    out: list[Arm] = []
    if rule.mode in ("adaptive", "spec") and max_block >= 2:
        blocks = [b for b in rule.block_sizes if b <= max_block] or [max_block]
        out.extend(("spec", b) for b in blocks)
    if lookup_block >= 2 and (rule.mode == "lookup" or (rule.mode == "adaptive" and rule.lookup)):
        out.append(("lookup", lookup_block))
    if rule.mode in ("adaptive", "ar") or not out:
        out.append(AR)
    return out


def best_block(
    rule: SpanRule, allowed: Sequence[Arm], est: Mapping[Arm, Throughput], precedence: str
) -> int:
    """The spec block a decision for spec would settle on among the measured ones, else the one
    with the highest estimate (what a decision for AR records its surplus at, and an opening
    cycle runs at)."""
    spec = [a for a in allowed if a[0] == "spec"]
    if not spec:
        return max(b for b in rule.block_sizes)
    known = [a for a in spec if est[a].known]
    if known:
        return settled_block(known, est, rule, precedence)[1]
    return max(spec, key=lambda a: est[a].tps)[1]


def anchor_block(
    spec: Sequence[Arm], est: Mapping[Arm, Throughput], rule: SpanRule, precedence: str
) -> Arm:
    """The block `settled_block` keeps unless another is clearly faster: the largest, or with
    `precedence` "measured" the largest measured at least `min_samples` times here where one
    is (priors and a probe's few cycles do not take precedence over a block measured well)."""
    if precedence == "measured":
        measured = [a for a in spec if est[a].samples >= rule.min_samples]
        if measured:
            return max(measured, key=lambda a: a[1])
    return max(spec, key=lambda a: a[1])


def settled_block(
    known: Sequence[Arm], est: Mapping[Arm, Throughput], rule: SpanRule, precedence: str = "largest"
) -> Arm:
    """The largest measured spec block, unless a smaller one is faster by the switch margin with
    confidence; then, among those, the largest within the margin of the fastest. The decided
    block is a ceiling: the engine's adaptive draft length shrinks it after drafts that miss, but
    cannot grow past it. And a smaller block's cycles say nothing of what a larger one would
    commit once they are accepted whole, so near-equal estimates favoured the smaller block for
    good (a reasoning span of one or two cycles settled on 8 and cost a cycle a request against
    always-spec at 16). With `precedence` "measured" (`anchor_block`), a block measured well
    keeps precedence over a larger one known only from a prior or a probe's few cycles: three
    lucky probe cycles at 16 (357±210 tok/s against 345±20 at 4) settled short qwen3 answers on
    16, where a cycle of 16 costs several AR steps."""
    spec = [a for a in known if a[0] == "spec"]
    largest = anchor_block(spec, est, rule, precedence)
    top = est[largest]
    winners = [
        a
        for a in spec
        if est[a].tps > top.tps * (1.0 + rule.switch_margin)
        and p_better(est[a], top) >= rule.min_confidence
    ]
    if not winners:
        return largest
    fastest = max(est[a].tps for a in winners)
    near = [a for a in winners if est[a].tps * (1.0 + rule.switch_margin) >= fastest]
    return max(near, key=lambda a: a[1])


def choose(
    rule: SpanRule,
    span: str,
    current: Arm | None,
    allowed: Sequence[Arm],
    est: Mapping[Arm, Throughput],
    *,
    running: Arm,
    initial_mode: str,
    fresh_block: bool = False,
    caution: float = 0.0,
    block_precedence: str,
) -> Choice:
    """The arm for `span` among `allowed`, keeping `current` unless another arm is faster by the
    margin with enough confidence (None: a start, the best known arm by `start_rank`). With
    `fresh_block` (a span's first decision), a spec `current` first takes the span's settled
    block size.
    `running` is the arm the request runs now (the reason says "keep" for it); `caution` ranks a
    start (`start_rank`); `block_precedence` is `settled_block`'s."""
    if len(allowed) == 1:
        return allowed[0], f"{span}: policy mode {rule.mode}", "forced"
    kind = "start" if current is None else "span"
    known = [a for a in allowed if est[a].known]
    if current not in allowed:
        if not any(a[0] != "ar" for a in known):
            # No speculative arm measured here: start optimistic (or as configured); the first
            # cycles measure it, and a probe covers the other side.
            arm = AR if (initial_mode == "ar" or not allowed[0][0] == "spec") else allowed[0]
            if arm not in allowed:
                arm = allowed[0]
            return arm, f"{span}: spec not measured yet, initial {arm_name(arm)}", kind
        current = max(known, key=lambda a: start_rank(est[a], caution))
        if current[0] == "spec":
            current = settled_block(known, est, rule, block_precedence)
        return current, f"{span}: fastest known {fmt(current, est)}", kind
    assert current is not None
    if fresh_block and current[0] == "spec":
        # A new span: its block size is chosen afresh among the measured spec blocks, as at the
        # start (changing the block costs nothing and cannot flap within the span); spec vs AR
        # keeps the hysteresis below. A block chosen for a short reasoning span otherwise
        # carried into the tool call after it (8 where 16 commits twice as much).
        spec_known = [a for a in known if a[0] == "spec"]
        if spec_known:
            current = settled_block(spec_known, est, rule, block_precedence)
    cur = est[current]
    if not cur.known:
        return current, f"{span}: keep {arm_name(current)} (not measured here yet)", kind
    best, best_p = current, 0.0
    for a in known:
        if a == current:
            continue
        p = p_better(est[a], cur)
        if (
            est[a].tps > cur.tps * (1.0 + rule.switch_margin)
            and p >= rule.min_confidence
            and est[a].tps > est[best].tps
        ):
            best, best_p = a, p
    if best == current:
        verb = "keep" if current == running else "block size for this span:"
        return current, f"{span}: {verb} {fmt(current, est)}", kind
    return best, f"{span}: {fmt(best, est)} beats {fmt(current, est)} (p={best_p:.2f})", kind


def start_rank(t: Throughput, caution: float) -> float:
    """What a start ranks an arm by: its estimate less `caution` standard errors. A class whose
    requests either accept whole blocks or nothing has a high, uncertain spec estimate; starting
    in spec runs most of its short requests at a loss, where AR with an opening cycle
    (`request_trials`) finds the ones that accept."""
    return t.tps - caution * t.std


def could_win(bound: Throughput | None, best: Throughput, rule: SpanRule) -> bool:
    """Whether spec at a block could beat `best` at all. A cycle costs at least one AR step (a
    target forward of the block, plus the draft) and commits at most its block, so spec is
    bounded by its measured tau x AR tok/s and by the block over its measured cycle time
    (`bound`, with forced runs mixed in; None when neither is known). Where tau is that low, or
    a cycle that dear (a quantized target on a CPU: a verify of 16 costs ~10 AR steps), probing
    the block is pure loss."""
    if bound is None or not best.known:
        return True
    return bound.tps > best.tps * (1.0 + rule.switch_margin)


def probe_reason(
    alt: Throughput,
    cur: Throughput,
    *,
    min_samples: float,
    explore_p: float,
    min_confidence: float,
    prior_veto: str = "measured",
) -> str | None:
    """Why `alt` deserves a probe against `cur`, or None when the estimates already decide: it
    has fewer than `min_samples` effective samples, or the confidence that it beats `cur` lies
    between `explore_p` and the confidence needed to switch outright. A prior from this class
    and span's own calibration that gives `alt` less than `explore_p` decides too: probing it
    is the loss the prior predicts (a pool's prior, borrowed from other spans, does not); with
    `prior_veto` "measured", only against a `cur` measured `min_samples` times itself (a prior
    against another prior, or against an arm one request has run, is no ground to rule it out:
    on think-on agent turns spec's calibrated prior lost to lookup's pool prior, and reasoning
    spans ran lookup for a whole round at half spec's speed, never probing it)."""
    p = p_better(alt, cur)
    if alt.samples < min_samples:
        vetoes = prior_veto == "always" or cur.samples >= min_samples
        if alt.prior == "class" and p < explore_p and vetoes:
            return None
        return "few-samples"
    if explore_p <= p < min_confidence:
        return "uncertain"
    return None


def probe_fits(probe_steps: int, length: int, steps: int, share: float) -> bool:
    """Whether a probe of `length` steps may start after `steps` steps of a request that spent
    `probe_steps` of them probing: its probe steps, the new ones included, stay within `share`
    of its steps. A probe is a loss for the request that runs it when it loses (most do), and
    a short request has little left to win back: a 12-token answer that probed AR for 6 steps
    at its 4th ran half of itself on the probe. Long requests still probe, later and less."""
    return probe_steps + length <= share * (steps + length)


def pick_probe(
    candidates: Iterable[Arm],
    est: Mapping[Arm, Throughput],
    cur: Throughput,
    rule: SpanRule,
    explore_p: float,
    prior_veto: str = "measured",
) -> tuple[Arm, str] | None:
    """(arm, why) of the candidate most worth a probe against `cur`: few samples first, then the
    least likely to win (the most uncertain), or None when the estimates decide every one."""
    best: tuple[int, float, Arm, str] | None = None
    for arm in candidates:
        alt = est[arm]
        why = probe_reason(
            alt,
            cur,
            min_samples=rule.min_samples,
            explore_p=explore_p,
            min_confidence=rule.min_confidence,
            prior_veto=prior_veto,
        )
        if why is None:
            continue
        rank = (0 if why == "few-samples" else 1, -p_better(alt, cur), arm, why)
        if best is None or rank < best:
            best = rank
    return None if best is None else (best[2], best[3])


def grow_target(arm: Arm, allowed: Sequence[Arm], whole: int, grow_after: int) -> Arm | None:
    """The spec block a grow probe tries, or None: the next larger allowed block once `whole`
    cycles in a row at `arm`'s block accepted the whole block (`grow_after` 0: never). Those
    cycles are censored: they say only "at least this block", which no estimate of a larger
    block can learn from, so only a probe of it can."""
    if arm[0] != "spec" or grow_after <= 0 or whole < grow_after:
        return None
    larger = [a for a in allowed if a[0] == "spec" and a[1] > arm[1]]
    return min(larger, key=lambda a: a[1]) if larger else None


def local_verdict(tau: float, cycle_s: float, ar_tps: float, margin: float) -> Verdict:
    """A request's own verdict: spec when `tau` tokens per `cycle_s` beat AR by the margin, AR
    when AR beats it by the margin, else unsure."""
    if cycle_s <= 0 or ar_tps <= 0:
        return "unsure"
    spec_tps = tau / cycle_s
    if spec_tps >= ar_tps * (1.0 + margin):
        return "spec"
    if spec_tps * (1.0 + margin) <= ar_tps:
        return "ar"
    return "unsure"
