"""Token choosers: which tokens a step commits. One rule serves both modes, so a session can
switch between AR and speculation at any cycle and still emit exactly what AR would.

A `TokenChooser` (`base`) turns target logits into committed tokens (AR: one position;
speculative: verify a drafted block) and the drafter's logits into a `Proposal`. Greedy
decoding is `GreedyChooser` (`greedy`), sampled decoding `SamplingChooser` (`sampled`, over the
`sampling` package's shaping, keys and rejection rule); penalties, bias and grammar masks plug
in as `LogitsProcessor`s, which rewrite the target's logits row by row with the drafted tokens
before each row taken into account. `build_chooser` (`build`) makes a request's chooser.
"""

from .base import LogitsProcessor, Proposal, TokenChooser, Verdict
from .build import build_chooser
from .greedy import GreedyChooser
from .sampled import SamplingChooser

__all__ = [
    "GreedyChooser",
    "LogitsProcessor",
    "Proposal",
    "SamplingChooser",
    "TokenChooser",
    "Verdict",
    "build_chooser",
]
