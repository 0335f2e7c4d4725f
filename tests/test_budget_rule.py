"""The verification budget's two decisions (mcsd_runtime.decisions.budget): plain floats in, rows'
counts out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mcsd_runtime.decisions.budget import draft_rows, verify_counts


def affine(floor: float, per_token: float):
    return lambda t: floor + per_token * t


def exact_survival(accepted: list[int], drafted: int) -> list[list[float]]:
    return [[1.0 if j < a else 0.0 for j in range(drafted)] for a in accepted]


@pytest.mark.parametrize("rows", [1, 4, 8, 16])
def test_verify_reproduces_the_oracle_on_exact_survival(rows):
    accepted = [(3 * r + 1) % 6 for r in range(rows)]  # 0..5, some rows accept nothing
    counts = verify_counts(exact_survival(accepted, 4), affine(0.03, 0.0009))
    assert counts == [min(a, 4) for a in accepted]


def test_verify_nothing_when_every_token_is_rejected():
    assert verify_counts([[0.0, 0.0], [0.0]], affine(1.0, 0.1)) == [0, 0]
    assert verify_counts([[], []], affine(1.0, 0.1)) == [0, 0]


def test_verify_admits_by_survival_and_parent_first():
    # row 1's second token (0.5) outranks row 0's first (0.4); a rising survival is clipped
    counts = verify_counts([[0.4], [0.9, 0.5, 0.7]], affine(1.0, 0.3))
    assert counts == [0, 3]  # the rising 0.7 counts as 0.5, still above row 0's 0.4
    # a rising value never puts a child before its parent
    counts = verify_counts([[0.1, 0.95]], affine(1.0, 0.2))
    assert counts == [0]


def test_verify_costlier_tokens_verify_less():
    surv = [[0.9, 0.7, 0.5, 0.3, 0.1]] * 8
    totals = [sum(verify_counts(surv, affine(1.0, c))) for c in (0.01, 0.05, 0.1, 0.3, 1.0, 3.0)]
    assert totals == sorted(totals, reverse=True)
    assert totals[0] > totals[-1] == 0


def test_verify_with_a_rate_is_the_marginal_rule():
    # with lam tokens/s, a token pays when its survival beats lam x its marginal seconds
    counts = verify_counts([[0.9, 0.6, 0.3]], affine(1.0, 0.1), rate=5.0)  # threshold 0.5
    assert counts == [2]


def test_draft_rows_reproduces_the_oracle_depth_by_depth():
    accepted = [0, 1, 3, 5, 2, 0, 4, 1]
    rows = len(accepted)
    target = affine(0.03, 0.0009)
    draft = lambda tokens, k: (0.0005 + 0.0002 * tokens) if k else 0.0  # noqa: E731
    depth = dict.fromkeys(range(rows), 0)
    active = list(range(rows))
    paid, verified, expected = 0.0, rows, float(rows)
    for d in range(1, 7):
        accept = [1.0 if accepted[r] >= d else 0.0 for r in active]
        chosen = draft_rows([1.0] * len(active), accept, draft,
                            lambda t, p=paid: p + target(t), verified, expected)
        go = [active[i] for i in chosen]
        if not go:
            break
        paid += draft(len(go), len(go))
        verified += len(go)
        expected += len(go)
        for r in go:
            depth[r] = d
        active = go
    assert [depth[r] for r in range(rows)] == accepted


def test_draft_rows_no_draft_when_the_floor_is_not_paid_back():
    target = affine(1.0, 0.01)
    cheap = lambda tokens, k: 0.05 * bool(k) + 0.001 * tokens  # noqa: E731
    dear = lambda tokens, k: 2.0 * bool(k) + 0.001 * tokens  # noqa: E731
    surv, accept = [1.0] * 4, [0.6] * 4
    assert draft_rows(surv, accept, cheap, target, 4, 4.0) == [0, 1, 2, 3]
    assert draft_rows(surv, accept, dear, target, 4, 4.0) == []


def test_draft_rows_a_costlier_draft_drafts_less():
    target = affine(1.0, 0.02)
    surv = [1.0, 0.9, 0.8, 0.6, 0.5, 0.3, 0.2, 0.1]
    accept = [0.9] * 8
    counts = []
    for per_row in (0.001, 0.05, 0.1, 0.2, 0.5):
        draft = lambda tokens, k, c=per_row: (0.02 + c * tokens) if k else 0.0  # noqa: E731
        counts.append(len(draft_rows(surv, accept, draft, target, 8, 8.0, rate=6.0)))
        counts[-1] = (counts[-1], len(draft_rows(surv, accept, draft, target, 8, 8.0)))
    fixed = [c[0] for c in counts]
    own = [c[1] for c in counts]
    assert fixed == sorted(fixed, reverse=True) and fixed[0] > fixed[-1]
    assert own == sorted(own, reverse=True) and own[0] > own[-1]


def test_draft_rows_feeds_and_ranks():
    target = affine(1.0, 0.01)
    draft = lambda tokens, k: (0.01 + 0.1 * tokens) if k else 0.0  # noqa: E731
    # the row with most pending tokens pays more to feed but ranks by its gain alone
    chosen = draft_rows([1.0, 1.0, 1.0], [0.2, 0.95, 0.9], draft, target, 3, 3.0, feed=[1, 1, 1])
    assert chosen == [1, 2]
    fed = draft_rows([1.0, 1.0, 1.0], [0.2, 0.95, 0.9], draft, target, 3, 3.0, feed=[1, 9, 1])
    assert fed == []  # row 1's nine pending tokens make the forward too dear


def test_budget_module_stays_plain_python():
    src = Path(__file__).resolve().parents[1] / "mcsd_runtime" / "decisions" / "budget.py"
    tree = ast.parse(src.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "collections"}
