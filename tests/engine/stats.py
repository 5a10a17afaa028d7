"""Chi-square goodness of fit for sampled-token tests, with the power to detect a shift."""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-3  # false alarm rate per test


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """(p-value, degrees of freedom) of `counts` against `probs` (flattened). Cells with
    zero probability must be empty (else the p-value is 0); cells expected under 5 counts are
    pooled so the asymptotic test holds."""
    counts, probs = counts.ravel().astype(float), probs.ravel().astype(float)
    probs = probs / probs.sum()
    n = counts.sum()
    if counts[probs == 0].sum() > 0:
        return 0.0, 0
    support = probs > 0
    counts, probs = counts[support], probs[support]
    small = probs * n < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        probs = np.append(probs[~small], probs[small].sum())
    stat = float(((counts - n * probs) ** 2 / (n * probs)).sum())
    df = len(probs) - 1
    return float(stats.chi2.sf(stat, df)), df


def shift_power(probs: np.ndarray, n: int, shift: float = 0.02) -> float:
    """Probability that `chi_square` at ALPHA rejects when `shift` of mass moves from the most
    likely cell to the second most likely (noncentral chi-square approximation)."""
    p = np.sort(probs.ravel()[probs.ravel() > 0])[::-1]
    p = p / p.sum()
    delta2 = shift**2 / p[0] + shift**2 / p[1]
    df = len(p) - 1
    critical = stats.chi2.isf(ALPHA, df)
    return float(stats.ncx2.sf(critical, df, n * delta2))


def detectable_shift(probs: np.ndarray, n: int, power: float = 0.9) -> float:
    """The smallest top-to-second mass shift that `chi_square` catches with `power` at n."""
    lo, hi = 0.0, 0.5
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if shift_power(probs, n, mid) >= power else (mid, hi)
    return hi
