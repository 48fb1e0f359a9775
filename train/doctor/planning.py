"""Which layout and micro-batch fit a GPU: candidate layouts in order of preference, the
largest micro-batch under a memory budget, and the recommendation ``train doctor`` prints
(on top of :func:`train.memory.estimate`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from train.memory import USABLE_FRACTION, Plan, estimate
from train.models.presets import ModelConfig


def max_batch(cfg: ModelConfig, seq: int, plan: Plan, budget: int, limit: int = 4096) -> int:
    """Largest per-GPU micro-batch whose peak fits in ``budget`` bytes (0 if none)."""
    if estimate(cfg, 1, seq, plan).peak > budget:
        return 0
    lo, hi = 1, 2
    while hi <= limit and estimate(cfg, hi, seq, plan).peak <= budget:
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:  # peak grows with batch: invariant lo fits, hi does not
        mid = (lo + hi) // 2
        if estimate(cfg, mid, seq, plan).peak <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def tp_degree(cfg: ModelConfig, gpus: int, max_tp: int = 8) -> int:
    """Largest TP degree <= max_tp (one NVLink domain) dividing gpus, the heads and the FFN."""
    for t in range(min(gpus, max_tp), 1, -1):
        if gpus % t == 0 and cfg.n_heads % t == 0 and cfg.kv_heads % t == 0 and cfg.hidden_dim % t == 0:
            return t
    return 1


def candidate_plans(cfg: ModelConfig, gpus: int, norm_fp32: bool = True) -> list[Plan]:
    """Layouts in order of preference: no sharding before sharding (FSDP2's all-gathers
    and reduce-scatters move about as many bytes as DDP's all-reduce but add latency),
    no recomputation before AC (full AC costs about one extra forward, ~+33 % compute),
    TP last (needs NVLink and makes the GEMMs smaller)."""
    if gpus == 1:
        plans = [Plan("single", 1), Plan("single", 1, ac="full")]
    else:
        plans = [Plan("ddp", gpus), Plan("fsdp", gpus), Plan("ddp", gpus, ac="full"), Plan("fsdp", gpus, ac="full")]
        t = tp_degree(cfg, gpus)
        if t > 1:
            plans += [Plan("tp", gpus, tp=t), Plan("tp", gpus, tp=t, ac="full")]
    return [replace(p, norm_fp32=norm_fp32) for p in plans]


@dataclass
class Recommendation:
    plan: Plan | None
    batch: int  # per-GPU micro-batch to use: largest power of two that fits, at least the one asked for
    max_batch: int
    reason: str
    rows: list[dict]

    def to_dict(self) -> dict:
        return {
            "strategy": self.plan.strategy if self.plan else None,
            "label": self.plan.label if self.plan else None,
            "ac": self.plan.ac if self.plan else None,
            "tp": self.plan.tp if self.plan else None,
            "batch_per_gpu": self.batch,
            "max_batch_per_gpu": self.max_batch,
            "reason": self.reason,
        }


def recommend(cfg: ModelConfig, seq: int, batch: int, gpus: int, gpu_bytes: int | None,
              norm_fp32: bool = True) -> Recommendation:
    """First layout (in :func:`candidate_plans` order) that fits ``batch`` sequences per
    GPU into ``USABLE_FRACTION`` of ``gpu_bytes``; else the first that fits any batch."""
    rows = []
    budget = int(gpu_bytes * USABLE_FRACTION) if gpu_bytes else None
    plans = candidate_plans(cfg, gpus, norm_fp32)
    for plan in plans:
        est = estimate(cfg, batch, seq, plan)
        row = est.to_dict()
        if budget is not None:
            row["max_batch"] = max_batch(cfg, seq, plan, budget)
            row["fits"] = est.peak <= budget
        rows.append(row)
    if budget is None:
        return Recommendation(None, 0, 0, "GPU memory unknown: no recommendation", rows)
    pow2 = lambda n: 1 << (n.bit_length() - 1)  # noqa: E731  largest power of two <= n
    for plan, row in zip(plans, rows):
        if row["fits"]:
            mb = row["max_batch"]  # >= batch; suggest a power of two, never less than asked for
            return Recommendation(plan, max(pow2(mb), batch), mb,
                                  f"{plan.label} is the first layout that fits batch {batch} per GPU", rows)
    for plan, row in zip(plans, rows):
        if row["max_batch"] > 0:
            mb = row["max_batch"]
            return Recommendation(plan, pow2(mb), mb,
                                  f"batch {batch} per GPU fits no layout; {plan.label} fits {mb}: reach the "
                                  "global batch with gradient accumulation (train.global_batch_size)", rows)
    return Recommendation(None, 0, 0, f"does not fit in {gpus} GPU(s) even at batch 1 with FSDP2 + AC: "
                                      "add GPUs (nodes) or use a smaller preset / sequence", rows)
