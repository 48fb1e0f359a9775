"""Quick device probe (not part of the project): SDPA backends at the 1b/8b shapes, and
symmetric-memory all-reduce latency vs NCCL. Run: torchrun --standalone --nproc-per-node 2 scripts/gpu/sdpa_symm_probe.py (2 GPUs)"""
import json, os, sys, time
import torch, torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

rank = int(os.environ.get("RANK", 0)); world = int(os.environ.get("WORLD_SIZE", 1))
torch.cuda.set_device(rank)
out = {}

def timeit(fn, iters=20, warm=5):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); s = torch.cuda.Event(True); e = torch.cuda.Event(True)
    s.record()
    for _ in range(iters): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / iters

if rank == 0:
    for name, (b, h, kvh, s, d) in {"1b": (8, 32, 8, 2048, 64), "8b": (4, 32, 8, 2048, 128)}.items():
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, kvh, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, kvh, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for be in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            for gqa in (True, False):
                kk, vv = (k, v) if gqa else (k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1))
                def step():
                    with sdpa_kernel(getattr(SDPBackend, be)):
                        o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                    o.sum().backward(retain_graph=True)
                try:
                    ms = timeit(step)
                    flops = 4 * b * h * s * s * d / 2 * 3.5  # causal fwd+bwd (bwd=2.5x fwd)
                    out[f"sdpa_{name}_{be}_gqa{int(gqa)}"] = {"ms": ms, "tflops": flops / ms / 1e9}
                except Exception as exc:
                    out[f"sdpa_{name}_{be}_gqa{int(gqa)}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        del q, k, v
    # loss variants at 1b shape: eager fp32 vs compiled
    V, T, D = 32768, 16384, 2048
    h = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    W = torch.randn(V, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) * 0.02
    W = W.detach().requires_grad_(True)
    tgt = torch.randint(0, V, (T,), device="cuda")
    def eager():
        F.cross_entropy((h @ W.t()).float(), tgt).backward()
    ce_c = torch.compile(lambda lg, t: F.cross_entropy(lg.float(), t))
    def comp():
        ce_c(h @ W.t(), tgt).backward()
    for n, fn in (("eager", eager), ("compiled", comp)):
        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        ms = timeit(fn)
        out[f"loss_1b_{n}"] = {"ms": ms, "peak_extra_gib": (torch.cuda.max_memory_allocated() - base) / 2**30}

if world > 1:
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    import torch.distributed._symmetric_memory as symm_mem
    g = dist.group.WORLD.group_name
    res = {}
    for kib in (4, 16, 64, 256, 1024, 4096):
        n = kib * 1024 // 4
        x = torch.ones(n, device="cuda")
        row = {"nccl_us": timeit(lambda: dist.all_reduce(x), 200, 20) * 1000}
        try:
            buf = symm_mem.empty(n, device="cuda", dtype=torch.float32)
            symm_mem.rendezvous(buf, g)
            buf.fill_(1.0)
            row["one_shot_us"] = timeit(lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", g), 200, 20) * 1000
            row["one_shot_copy_us"] = timeit(lambda: torch.ops.symm_mem.one_shot_all_reduce_copy(buf, x, "sum", g), 200, 20) * 1000
            row["two_shot_us"] = timeit(lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", g), 200, 20) * 1000
            buf.fill_(1.0); y = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", g)
            row["one_shot_ok"] = bool((y == world).all())
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        res[kib] = row
    out["allreduce"] = res
    # small 4-float vector: cpu .tolist() round trip as in the trainer
    vec = torch.zeros(4, device="cuda")
    out["small4_nccl_tolist_us"] = timeit(lambda: (dist.all_reduce(vec), vec.tolist()), 200, 20) * 1000
    dist.destroy_process_group()
if rank == 0:
    print(json.dumps(out, indent=1))
    os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "sdpa_symm_probe.json"), "w"), indent=1)
