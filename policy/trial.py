"""Trials: run another arm for a while, judge it, and back off after losing.

Four decisions share this shape, and are configurations of one `Trial` and one `Backoff`:

| trial | what runs | judged by | backs off per | counted in |
|---|---|---|---|---|
| probe | the other arm (or block) for a few steps, where the estimates are uncertain | the class estimates (`decide.beats`) | model, class, span, arm (process-wide) | steps of that class and span |
| opening | one spec cycle at a request's start and at each span it enters, where the class says AR | this request's own tokens per cycle (`decide.local_verdict`) | model, class, span (process-wide) | chances to open there |
| retry | one spec cycle in a span this request moved to AR | this request's own tokens per cycle, the retry included | span (this request) | steps of this request |
| grow | the next larger spec block for a probe's cycles, where the current block keeps accepting whole blocks | this request's own tokens per cycle at the larger block against the whole smaller block | model, class, span, block (process-wide, the probes' backoff) | steps of that class and span |

A `Backoff` waits nothing for its first `free` losses in a row, then `first`, `2 * first`,
`4 * first`... up to `most`, on a clock its caller keeps per scope; a win resets it. dflash-mlx
instead re-probes block 16 every 64 reduced cycles forever, which loses every time on machines
where it never pays; here an arm that never pays costs a logarithmic number of trials. The first
openings lost are free because a class can mix winners and losers: a loss says little about the
next request, and a lost opening costs one cycle where a won one saves most of the decode.
A request runs its trials through `RequestTrials` (`request_trials.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Literal

from .decide import Arm

TrialKind = Literal["probe", "opening", "retry", "grow"]


@dataclass
class Trial:
    """A trial in flight: `arm` runs for `remaining` more steps of `span` instead of `base`; it
    ends early when the span changes (a probe is then judged, an opening or retry dropped)."""

    kind: TrialKind
    span: str
    arm: Arm
    base: Arm
    remaining: int


@dataclass
class _Wait:
    losses: int = 0
    since: int = 0  # the clock at the last loss
    until: int = 0  # the clock from which a trial is allowed again


class Backoff:
    """Waits after lost trials per (scope, what), counted on a clock per scope: its own, which
    the caller advances (`tick`: steps of a class and span, chances to open), or `clock`, read
    when asked (steps of a request)."""

    def __init__(
        self,
        first: int,
        most: int,
        free: int = 0,
        *,
        clock: Callable[[Hashable], int] | None = None,
    ) -> None:
        self.first = first
        self.most = most
        self.free = free
        self._clock: dict[Hashable, int] = {}
        self._read = clock
        self._waits: dict[tuple[Hashable, Hashable], _Wait] = {}

    def tick(self, scope: Hashable, n: int = 1) -> None:
        self._clock[scope] = self._clock.get(scope, 0) + n

    def now(self, scope: Hashable) -> int:
        if self._read is not None:
            return self._read(scope)
        return self._clock.get(scope, 0)

    def allowed(self, scope: Hashable, what: Hashable = None) -> bool:
        wait = self._waits.get((scope, what))
        return wait is None or self.now(scope) >= wait.until

    def ask(self, scope: Hashable, what: Hashable = None) -> bool:
        """`allowed`, on a clock of chances: every ask moves it on (an opening skipped after a
        loss is one of the chances it waits)."""
        ok = self.allowed(scope, what)
        self.tick(scope)
        return ok

    def losses(self, scope: Hashable, what: Hashable = None) -> int:
        wait = self._waits.get((scope, what))
        return wait.losses if wait else 0

    def waited(self, scope: Hashable, what: Hashable = None) -> int:
        """Clock ticks since the last loss."""
        wait = self._waits.get((scope, what))
        return self.now(scope) - (wait.since if wait else 0)

    def lost(self, scope: Hashable, what: Hashable = None) -> int:
        """Record a lost trial; returns the ticks until the next is allowed."""
        wait = self._waits.setdefault((scope, what), _Wait())
        wait.losses += 1
        over = wait.losses - self.free
        ticks = min(self.first << (over - 1), self.most) if over > 0 else 0
        wait.since = self.now(scope)
        wait.until = wait.since + ticks
        return ticks

    def won(self, scope: Hashable, what: Hashable = None) -> None:
        self._waits.pop((scope, what), None)


def probe_target(arm: Arm, spec_backoff: str) -> Hashable:
    """What a probe of `arm` waits on after a loss: the arm, or (`spec_backoff` "drafter") for
    spec at any block, the drafter."""
    return "spec" if arm[0] == "spec" and spec_backoff == "drafter" else arm


def probe_backoff(base_steps: int, max_steps: int) -> Backoff:
    """Process-wide, per (model, class, span) and arm, in steps of that scope."""
    return Backoff(base_steps, max_steps)


def opening_backoff(free_losses: int = 2, max_skip: int = 16) -> Backoff:
    """Process-wide, per (model, class, span), in chances to open: after `free_losses` lost in a
    row, the next 1, 2, 4... chances are skipped (at most `max_skip`)."""
    return Backoff(1, max_skip, free_losses)


# A span that this request moved to AR retries one spec cycle after 16 AR steps, then 32, ...
RETRY_FIRST = 16
RETRY_MAX = 256


def retry_backoff(steps: Callable[[], int]) -> Backoff:
    """Per request, per span, in `steps` of the request: the request's own verdict for AR counts
    as the first loss (a retry after `RETRY_FIRST` steps), each lost retry as another."""
    return Backoff(RETRY_FIRST, RETRY_MAX, clock=lambda _span: steps())
