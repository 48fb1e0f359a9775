"""How fast tensorwise FP8 training can be at a preset's shapes, from timed kernels.

On one GPU, for the block linears of one layer (the output projection stays bf16 in this
project and torchtitan, so it is left out), at M = tokens per GPU per step:

* the three GEMMs of each linear (forward ``X W^T``, input gradient ``dY W``, weight
  gradient ``dY^T X``) in bf16 (``torch.mm``) and in float8 (``torch._scaled_mm``, e4m3
  inputs and weights, e5m2 gradients, fast accumulation in the forward only, operands in
  the row-/column-major layouts the Hopper kernels take);
* the least float8 conversion work tensorwise dynamic scaling needs, each step compiled by
  Inductor into as few kernels as it makes: ``cast`` = amax of the whole tensor, then
  scale + cast (a second read, since the scale needs the amax of every element), and
  ``cast_t`` = the same writing the row-major and the transposed copy in one pass. Also
  timed with the amax given (``*_noamax``), i.e. as if it were fused into the kernel that
  produced the tensor: the lower floor.

Under ``--recompute R`` of the layers (activation checkpointing), the least conversion work
per step is: forward of a recomputed layer: ``cast`` of the 4 distinct linear inputs (the
q/k/v and w1/w3 pairs share theirs) and of the 7 weights, then ``cast_t`` of the same in its
recompute (the transposes feed the backward GEMMs); forward of a layer that is not
recomputed: ``cast_t`` once; backward, every layer: ``cast_t`` of the 7 output gradients.
The GEMMs run (1 + R / n_layers) times in the forward and once each in the backward.

The printed bound: given a measured bf16 step time ``--bf16-step-ms`` (same machine),
``T_fp8 >= T_bf16 - (GEMM_bf16 - GEMM_fp8) + conversions``, so FP8 over bf16 is at most
``T_bf16 / T_fp8`` (everything else - attention, norms, optimizer, communication - is what
it is in bf16). Run (one GPU; shapes from train.models.presets):

    python3 scripts/gpu/fp8_floor.py --preset 8b --tokens 8192 --recompute 32 \
        --bf16-step-ms 933.4 --out fp8_floor.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from train.models.presets import MODEL_PRESETS  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# one static kernel per shape (a shape seen twice would otherwise turn the kernels dynamic)
torch._dynamo.config.automatic_dynamic_shapes = False
torch._dynamo.config.cache_size_limit = 256


def timed_ms(fn, iters: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _scale(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.finfo(dtype).max / x.abs().amax().float().clamp(min=1e-12)


def _to(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    top = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-top, top).to(dtype)


@torch.compile
def cast(x, dtype: torch.dtype = E4M3):
    return _to(x, _scale(x, dtype), dtype)


@torch.compile
def cast_t(x, dtype: torch.dtype = E4M3):
    y = _to(x, _scale(x, dtype), dtype)
    return y, y.t().contiguous()


@torch.compile
def cast_noamax(x, scale, dtype: torch.dtype = E4M3):
    return _to(x, scale, dtype)


@torch.compile
def cast_t_noamax(x, scale, dtype: torch.dtype = E4M3):
    y = _to(x, scale, dtype)
    return y, y.t().contiguous()


def layer_linears(preset: str) -> tuple[list[tuple[str, int, int]], list[int], int]:
    """(name, in K, out N) of a block's linears, the widths of its distinct linear inputs, layers."""
    cfg = MODEL_PRESETS[preset]
    d, f = cfg.dim, cfg.ffn_hidden
    kv = (cfg.n_kv_heads or cfg.n_heads) * (d // cfg.n_heads)
    linears = [("wq", d, d), ("wk", d, kv), ("wv", d, kv), ("wo", d, d), ("w1", d, f), ("w3", d, f), ("w2", f, d)]
    return linears, [d, d, d, f], cfg.n_layers


def gemm_ms(m: int, k: int, n: int) -> dict:
    dev, bf = "cuda", torch.bfloat16
    x, w, dy = (torch.randn(m, k, device=dev, dtype=bf), torch.randn(n, k, device=dev, dtype=bf),
                torch.randn(m, n, device=dev, dtype=bf))
    one = torch.ones((), device=dev)
    xf, wf, dyf = x.to(E4M3), w.to(E4M3), dy.to(E5M2)
    wtf, dytf, xtf = w.t().contiguous().to(E4M3), dy.t().contiguous().to(E5M2), x.t().contiguous().to(E4M3)
    mm8 = torch._scaled_mm
    return {
        "bf16": {"fwd": timed_ms(lambda: torch.mm(x, w.t())), "dgrad": timed_ms(lambda: torch.mm(dy, w)),
                 "wgrad": timed_ms(lambda: torch.mm(dy.t(), x))},
        "fp8": {"fwd": timed_ms(lambda: mm8(xf, wf.t(), one, one, out_dtype=bf, use_fast_accum=True)),
                "dgrad": timed_ms(lambda: mm8(dyf, wtf.t(), one, one, out_dtype=bf)),
                "wgrad": timed_ms(lambda: mm8(dytf, xtf.t(), one, one, out_dtype=bf))},
    }


def cast_ms(rows: int, cols: int, dtype: torch.dtype) -> dict:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    s = torch.ones((), device="cuda")
    return {"cast": timed_ms(lambda: cast(x, dtype)), "cast_t": timed_ms(lambda: cast_t(x, dtype)),
            "cast_noamax": timed_ms(lambda: cast_noamax(x, s, dtype)),
            "cast_t_noamax": timed_ms(lambda: cast_t_noamax(x, s, dtype)),
            "copy_GBps": 2 * x.numel() * x.element_size() / timed_ms(lambda: x.clone()) / 1e6}


def floor(preset: str, tokens: int, recompute: int) -> dict:
    linears, inputs, n_layers = layer_linears(preset)
    g = {name: gemm_ms(tokens, k, n) for name, k, n in linears}
    fwd_mult = 1 + recompute / n_layers
    gemm = {p: n_layers * sum(fwd_mult * v[p]["fwd"] + v[p]["dgrad"] + v[p]["wgrad"] for v in g.values())
            for p in ("bf16", "fp8")}
    c_in = [cast_ms(tokens, width, E4M3) for width in inputs]
    c_w = [cast_ms(n, k, E4M3) for _, k, n in linears]
    c_dy = [cast_ms(tokens, n, E5M2) for _, _, n in linears]
    conv = {}
    for tag, suffix in (("with_amax", ""), ("amax_fused", "_noamax")):
        plain = sum(c["cast" + suffix] for c in c_in + c_w)  # forward of a recomputed layer
        both = sum(c["cast_t" + suffix] for c in c_in + c_w)  # its recompute, or the forward of a kept one
        per_bwd = sum(c["cast_t" + suffix] for c in c_dy)
        conv[tag] = recompute * (plain + both) + (n_layers - recompute) * both + n_layers * per_bwd
    return {"preset": preset, "tokens": tokens, "recompute_layers": recompute, "n_layers": n_layers,
            "gemm_ms_per_layer": g, "gemm_ms_per_step": gemm, "conversion_ms_per_step": conv,
            "casts": {"inputs": c_in, "weights": c_w, "grad_outputs": c_dy}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="8b", choices=sorted(MODEL_PRESETS))
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per GPU per step (batch x seq)")
    ap.add_argument("--recompute", type=int, default=None, help="recomputed layers (default: all)")
    ap.add_argument("--bf16-step-ms", type=float, default=None, help="a measured bf16 step on this machine")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    n_layers = MODEL_PRESETS[a.preset].n_layers
    recompute = n_layers if a.recompute is None else a.recompute
    res = floor(a.preset, a.tokens, recompute)
    res["device"] = torch.cuda.get_device_name(0)
    res["torch"] = torch.__version__
    g, conv = res["gemm_ms_per_step"], res["conversion_ms_per_step"]
    print(f"{a.preset}, {a.tokens} tokens/GPU, {recompute}/{n_layers} layers recomputed, {res['device']}")
    print(f"block GEMMs per step: bf16 {g['bf16']:.1f} ms, fp8 {g['fp8']:.1f} ms ({g['bf16'] / g['fp8']:.2f}x)")
    print(f"least float8 conversion per step: {conv['with_amax']:.1f} ms (amax fused into producers: "
          f"{conv['amax_fused']:.1f} ms)")
    if a.bf16_step_ms:
        for tag, c in conv.items():
            t8 = a.bf16_step_ms - (g["bf16"] - g["fp8"]) + c
            res.setdefault("bound", {})[tag] = {"bf16_step_ms": a.bf16_step_ms, "fp8_step_ms_at_least": t8,
                                                "fp8_over_bf16_at_most": a.bf16_step_ms / t8}
            print(f"bf16 step {a.bf16_step_ms:.1f} ms -> FP8 step >= {t8:.1f} ms, FP8/bf16 <= "
                  f"{a.bf16_step_ms / t8:.3f} ({tag})")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
