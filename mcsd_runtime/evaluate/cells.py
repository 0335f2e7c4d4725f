"""How a report writes a number in a table cell: `–` for a missing value, shares as
percentages, speedups with their 95% CI, signed NLL differences."""

from __future__ import annotations


def fmt(v, pct: bool = False) -> str:
    """A value as a cell: `–` for None, yes/no, a float to 2 decimals or (`pct`) as a share."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.1%}" if pct else f"{v:.2f}"
    return str(v)


def fmt_ci(geomean: float | None, ci: list) -> str:
    """A geometric-mean speedup with its CI: `1.234x [1.100, 1.380]`."""
    if geomean is None or None in ci:
        return "–"
    return f"{geomean:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"


def fmt_nll(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def fmt_delta(v: float | None, ci: list | None) -> str:
    """A signed NLL difference with its CI: `+0.120 [+0.050, +0.190]`."""
    if v is None:
        return "–"
    if not ci or None in ci:
        return f"{v:+.3f}"
    return f"{v:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def fmt_times(v: float | None, missing: str = "–") -> str:
    """A speedup: `1.23x`, or `missing` for None."""
    return missing if v is None else f"{v:.2f}x"
