"""The one definition of each reported metric, shared by the decoder, replay and evaluation."""

from __future__ import annotations


def tau(tokens: int, target_calls: int) -> float:
    """Mean accepted length τ: committed tokens per target call (1.0 for AR)."""
    return tokens / target_calls if target_calls else 0.0


def acceptance_rate(acceptance_sum: float, drafting_steps: int) -> float:
    """The paper's acceptance rate: per drafting step, accepted / drafted depth, averaged."""
    return acceptance_sum / drafting_steps if drafting_steps else 0.0


def throughput(tokens: float, seconds: float) -> float:
    """Tokens (or any other count: rows, prompts) per second."""
    return tokens / seconds if seconds else 0.0


def oracle_share(ours: float, base: float, oracle: float) -> float | None:
    """The share of the oracle's gain over `base` (a deployable baseline's throughput) that
    `ours` takes; None when the oracle gains nothing over it."""
    return (ours - base) / (oracle - base) if oracle > base else None


def geomean(values: list[float]) -> float:
    """The geometric mean of positive `values`."""
    import numpy as np

    return float(np.exp(np.log(values).mean()))


def mean_ci(values: list[float], resamples: int = 10_000, seed: int = 0) -> dict:
    """Mean of `values` with its 95% bootstrap CI (percentile, resampled with replacement,
    seeded); Nones when empty."""
    import numpy as np

    if not len(values):
        return {"mean": None, "ci_low": None, "ci_high": None}
    x = np.asarray(values, dtype=float)
    boot = x[np.random.default_rng(seed).integers(0, len(x), (resamples, len(x)))].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"mean": float(x.mean()), "ci_low": float(lo), "ci_high": float(hi)}


def paired_speedup(method_tps: list[float], reference_tps: list[float], resamples: int = 10_000,
                   seed: int = 0) -> dict:
    """Speedup of a method over a reference from paired per-prompt tokens/s (same prompts, one
    interleaved run): geometric mean of the per-prompt ratios and its 95% bootstrap CI
    (`mean_ci` of the log ratios: prompts resampled with replacement, seeded)."""
    import numpy as np

    a, b = np.asarray(method_tps, dtype=float), np.asarray(reference_tps, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError("paired_speedup needs two equally long, non-empty lists of tokens/s")
    ok = (a > 0) & (b > 0)
    logs = np.log(a[ok] / b[ok])
    if not len(logs):
        return {"geomean": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "n": 0}
    ci = mean_ci(logs, resamples, seed)
    return {"geomean": float(np.exp(ci["mean"])), "ci_low": float(np.exp(ci["ci_low"])),
            "ci_high": float(np.exp(ci["ci_high"])), "n": int(len(logs))}
