"""How close a distilled draft is to its target: greedy (top-1) and top-k agreement on held-out
sequences, read against the target's stored top-k, with the draft run as users run it (its
full-vocabulary logits, a reduced head's absent tokens at the lowest value)."""

from __future__ import annotations

import torch

from mcsd_runtime.distill.data import Sequence
from mcsd_runtime.distill.train import block_mask, pack

TOP_K_AGREEMENT = 4
LOGQ_FLOOR = -50.0  # the KL's floor on draft log-probabilities (tokens a reduced head lacks)


@torch.inference_mode()
def agreement(draft, seqs: list[Sequence], seq_len: int, pad_id: int, batch: int = 8,
              k: int = TOP_K_AGREEMENT) -> dict:
    """Over the trained positions of `seqs`: the fraction where the draft's argmax is the
    target's (`top1`), where the target's argmax is among the draft's `k` largest (`topk`),
    and the mean KL from the target's top-k (renormalised) to the draft, with the draft's
    log-probabilities floored at LOGQ_FLOOR (finite for tokens a reduced head lacks)."""
    if not seqs:
        return {"top1": None, f"top{k}": None, "kl_topk": None, "positions": 0}
    packed = pack(seqs, seq_len, pad_id, seqs[0].top_ids.shape[1])
    dtype = next(draft.parameters()).dtype
    hits = hits_k = kl = 0.0
    count = 0
    for i in range(0, packed["input_ids"].shape[0], batch):
        rows = {key: v[i : i + batch] for key, v in packed.items()}
        out = draft(input_ids=rows["input_ids"], position_ids=rows["position_ids"],
                    attention_mask=block_mask(rows["segment"], dtype), use_cache=False)
        trained = rows["trained"]
        logits = out.logits[trained].float()
        want = rows["top_ids"][trained].long()
        hits += (logits.argmax(-1) == want[:, 0]).sum().item()
        hits_k += (logits.topk(k, -1).indices == want[:, :1]).any(-1).sum().item()
        logq = torch.log_softmax(logits, -1).gather(-1, want).clamp(min=LOGQ_FLOOR)
        logp = torch.log_softmax(rows["top_logp"][trained].float(), -1)
        kl += (logp.exp() * (logp - logq)).sum().item()
        count += int(trained.sum())
    return {"top1": round(hits / count, 4), f"top{k}": round(hits_k / count, 4),
            "kl_topk": round(kl / count, 4), "positions": count}


def coverage(ids: torch.Tensor | None, seqs: list[Sequence]) -> float | None:
    """The fraction of the target's greedy tokens over `seqs` that a reduced head of `ids`
    can propose (None without a reduced head or sequences)."""
    if ids is None or not seqs:
        return None
    greedy = torch.cat([s.top_ids[:, 0].long() for s in seqs])
    return round(torch.isin(greedy, ids).float().mean().item(), 4)
