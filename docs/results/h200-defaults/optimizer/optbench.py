"""One AdamW step over 8b's per-rank shards under 2-way FSDP2 (291 fp32 tensors, 4.015 B
parameters) on one GPU: torch's fused kernel, the same with the clip's ``grad_scale`` and
``found_inf`` (as the trainer runs it), the foreach implementation, and the foreach step compiled
by Inductor; then the gradient norm, eager and compiled. Writes $OUT/optbench.json.

TBps is the AdamW step's traffic (read parameter, gradient and both moments, write parameter and
both moments: 7 x 4 bytes a parameter) over the time, for every row; a norm reads 4 bytes a
parameter, a seventh of that.
"""
import json
import os
import time

import torch

torch.manual_seed(0)
dev = torch.device("cuda")
dim, hid, kv, vocab, layers = 4096, 14336, 1024, 128256, 32
shapes = [(vocab // 2, dim)]
for _ in range(layers):
    shapes += [(dim // 2, dim), (kv // 2, dim), (kv // 2, dim), (dim // 2, dim), (hid // 2, dim), (dim // 2, hid),
               (hid // 2, dim), (dim // 2,), (dim // 2,)]
shapes += [(dim // 2,), (vocab // 2, dim)]
n = sum(torch.Size(s).numel() for s in shapes)
print(f"{len(shapes)} tensors, {n / 1e9:.3f} B params", flush=True)
params = [torch.nn.Parameter(torch.randn(s, device=dev) * 0.02) for s in shapes]
for p in params:
    p.grad = torch.randn_like(p) * 1e-3
bytes_moved = n * 4 * 7
out = {}


def groups():
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def timeit(name, fn, iters=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    med = ts[len(ts) // 2]
    out[name] = {"ms": med, "min_ms": ts[0], "TBps": bytes_moved / med / 1e9}
    print(f"{name}: {med:.2f} ms (min {ts[0]:.2f}), {bytes_moved / med / 1e9:.2f} TB/s", flush=True)


kw = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8}
opt = torch.optim.AdamW(groups(), fused=True, **kw)
timeit("fused", opt.step)
scale = torch.tensor(1.5, device=dev)
inf = torch.zeros((), device=dev)


def fused_scaled():
    for g in opt.param_groups:
        torch._fused_adamw_(g["params"], [p.grad for p in g["params"]],
                            [opt.state[p]["exp_avg"] for p in g["params"]],
                            [opt.state[p]["exp_avg_sq"] for p in g["params"]], [],
                            [opt.state[p]["step"] for p in g["params"]],
                            lr=3e-4, beta1=0.9, beta2=0.95, weight_decay=g["weight_decay"], eps=1e-8,
                            amsgrad=False, maximize=False, grad_scale=scale, found_inf=inf)


timeit("fused_grad_scale_found_inf", fused_scaled)
del opt
torch.cuda.empty_cache()
opt = torch.optim.AdamW(groups(), foreach=True, **kw)
timeit("foreach", opt.step)
del opt
torch.cuda.empty_cache()
# Inductor: the foreach step compiled (lr a tensor: no recompile when the schedule moves it)
opt = torch.optim.AdamW(groups(), foreach=True, lr=torch.tensor(3e-4, device=dev), betas=(0.9, 0.95), eps=1e-8,
                        capturable=True)


@torch.compile(fullgraph=False)
def cstep():
    opt.step()


t0 = time.perf_counter()
cstep()
torch.cuda.synchronize()
out["compile_s"] = time.perf_counter() - t0
print(f"compile {out['compile_s']:.1f} s", flush=True)
timeit("inductor_foreach", cstep)


def norm():  # the gradient norm for the clip, as the trainer computes it
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in params], 2.0)), 2.0)


timeit("grad_norm_foreach", norm)
cn = torch.compile(norm)
cn()
timeit("grad_norm_inductor", cn)
out["gpu"] = torch.cuda.get_device_name()
with open(os.path.join(os.environ.get("OUT", "."), "optbench.json"), "w") as f:
    json.dump(out, f, indent=1)
