"""Speculative sampling's rules as pure functions on the device: how a node's candidates are drawn
from the draft (`sample_without_replacement`, `sample_with_replacement`), and how each verifier
accepts them against the target (`verify_children`), all nodes at once. The verify phase of a step
(`mcsd_runtime.decode.verifying.Verifier`) applies them; drafting draws with them.

Verification returns, for the tree's rows (row 0 = root, row j = node j), which child each
row accepts and which token follows it if it accepts none. The decoder then takes the deepest
node whose whole path was accepted: one walk, no per-node Python.

Sampling verifiers (lossless, the MCSD baseline's):
- `mcss`: candidates drawn from q without replacement; candidate i is accepted with probability
  min(1, p(x)/q(x)); on rejection p <- norm(max(p - q, 0)) and x is removed from q.
- `mcss-replacement`: candidates drawn i.i.d. from q; the same rule without removal.
- `naive`: draw y ~ p; accept the child equal to y, else y is the next token.

A proposing distribution q may have fewer than k tokens with non-zero probability (a confident
draft, or any low temperature: float32 softmax underflows). Drawing k distinct candidates then
fills the spare slots with zero-probability ties; the tree's shape is fixed, so those slots stay,
but the two `mcss` verifiers never accept a candidate with q(x) = 0 (it was not drawn from q).
Such a slot leaves p unchanged, since the q it would subtract is zero. `naive` is exact for any
candidates (its output is always y ~ p). A residual with no mass left (p <= q everywhere, which
only float rounding can reach) falls back to p.
"""

from __future__ import annotations

import torch


def exponential(shape: tuple[int, ...], like: torch.Tensor,
                generator: torch.Generator) -> torch.Tensor:
    """Exp(1) noise of `shape` in `like`'s dtype and device: -log(u), u ~ U[0, 1) drawn in
    float64, so the race's smallest noises (u near 1) keep their precision. About 3x faster than
    `Tensor.exponential_` on a CPU, which made sampling 14 ms of a 64 ms step over SmolLM2's
    49k-token vocabulary. u = 0 (probability 2^-53) gives infinite noise: a weight of 0."""
    u = torch.rand(shape, generator=generator, device=like.device, dtype=torch.float64)
    return u.log_().neg_().to(like.dtype)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs` [..., V], without a host sync (exponential race)."""
    return (probs / exponential(probs.shape, probs, generator)).argmax(-1)


def sample_without_replacement(probs: torch.Tensor, k: int, generator: torch.Generator,
                               ) -> torch.Tensor:
    """`k` distinct tokens per row, in the order sequential sampling would draw them."""
    return (probs / exponential(probs.shape, probs, generator)).topk(k, dim=-1).indices


def sample_with_replacement(probs: torch.Tensor, k: int, generator: torch.Generator,
                            ) -> torch.Tensor:
    noise = exponential((*probs.shape[:-1], k, probs.shape[-1]), probs, generator)
    return (probs.unsqueeze(-2) / noise).argmax(-1)


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(-1, keepdim=True).clamp_min(1e-30)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) per row; p itself where that has no mass (p == q up to rounding)."""
    r = (p - q).clamp_min(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-30), p)


def verify_children(p: torch.Tensor, q: torch.Tensor, cands: torch.Tensor, mode: str,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify the `k` candidates of each of `n` parents.

    p, q: [n, V] target and draft distributions at the parents; cands: [n, k] candidate tokens in
    drafting order. Returns (accepted rank [n] or -1, next token [n] used when none is accepted).
    """
    n, k = cands.shape
    if mode == "naive":
        y = sample(p, generator)
        hit = cands == y[:, None]
        rank = torch.where(hit.any(-1), hit.int().argmax(-1), -1)
        return rank, y
    u = torch.rand(n, k, device=p.device, generator=generator, dtype=p.dtype)
    rank = torch.full((n,), -1, device=p.device, dtype=torch.long)
    p, q = p.clone(), q.clone()
    rows = torch.arange(n, device=p.device)
    for i in range(k):
        x = cands[:, i]
        px, qx = p[rows, x], q[rows, x]
        accept = (rank < 0) & (qx > 0) & (u[:, i] * qx < px)
        rank = torch.where(accept, i, rank)
        rejected = (rank < 0)[:, None]
        p = torch.where(rejected, residual(p, q), p)
        if mode == "mcss":
            q = torch.where(rejected, _normalize(q.scatter(1, x[:, None], 0.0)), q)
    return rank, sample(p, generator)
