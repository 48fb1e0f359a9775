"""scripts/gpu/kernel_profile.py: the per-step breakdown of a profiler trace, and the wrapper's
exit codes (on a GPU it wraps either side of `python3 scripts/gpu/tables.py vs-titan`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "kernel_profile.py"


def _module():
    spec = importlib.util.spec_from_file_location("kernel_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _x(name, cat, ts, dur, tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_breakdown_categories_idle_and_causes():
    kp = _module()
    trace = {"traceEvents": [
        _x("ProfilerStep#5", "user_annotation", 0, 1000),
        _x("optimizer", "user_annotation", 400, 500),
        _x("aten::_local_scalar_dense", "cpu_op", 420, 200),
        _x("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "kernel", 0, 300, tid=7),
        _x("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "kernel", 300, 100, tid=7),
        # idle 400..500 while the thread is in optimizer > aten::_local_scalar_dense
        _x("void at::native::multi_tensor_apply_kernel<FusedAdam>", "kernel", 500, 200, tid=7),
        _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 700, 50, tid=7),
        _x("triton_poi_fused_add_0", "kernel", 790, 10, tid=7),  # 40 us gap: counted as idle
    ]}
    b = kp.breakdown(trace, steps=1)
    cats = b["category_ms_per_step"]
    assert cats["gemm"] == 0.3 and cats["attention"] == 0.1 and cats["optimizer"] == 0.2
    assert cats["memcpy_memset"] == 0.05 and cats["triton"] == 0.01
    assert abs(b["window_ms_per_step"] - 0.8) < 1e-9
    assert abs(b["busy_ms_per_step"] - 0.66) < 1e-9
    assert abs(b["idle_ms_per_step"] - 0.14) < 1e-9
    top = b["idle_causes"][0]
    assert top["cpu"] == "optimizer > aten::_local_scalar_dense" and abs(top["idle_ms_per_step"] - 0.1) < 1e-9
    assert "Memcpy" not in " ".join(k["name"] for k in b["top_kernels"])
    assert "| gemm | 0.30 |" in kp.table("x", b)


def test_no_kernels_and_usage(tmp_path):
    kp = _module()
    assert "error" in kp.breakdown({"traceEvents": []}, steps=3)
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--name", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr


def test_wraps_a_program_and_keeps_its_exit_code(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import sys, torch\n"
        "p = torch.nn.Parameter(torch.ones(3))\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    p.sum().backward(); opt.step(); opt.zero_grad()\n"
        "sys.exit(3)\n")
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "o"), "--name", "w", "--skip", "1",
                        "--active", "2", "--", str(prog), "6"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    # CPU only: the window closes and says there were no CUDA kernels
    assert (tmp_path / "o" / "w.rank0.json").is_file()
    assert "no CUDA kernels" in (tmp_path / "o" / "w.md").read_text()


def test_memory_peak_composition():
    kp = _module()
    ours = [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"},
            {"filename": "/w/train/models/llama.py", "line": 88, "name": "forward"}]
    gen = [{"filename": "/tmp/torchinductor_root/ab/cabc.py", "line": 9, "name": "call"}]
    gib = 2 ** 30
    events = [
        {"action": "free_completed", "addr": 7, "size": gib, "frames": []},  # allocated before the step
        {"action": "alloc", "addr": 1, "size": gib, "frames": ours},
        {"action": "alloc", "addr": 2, "size": 2 * gib, "frames": gen},
        {"action": "alloc", "addr": 3, "size": gib // 2, "frames": ours},  # the peak: 4 - 1 + 1 + 2 + 0.5
        {"action": "free_requested", "addr": 2, "size": 2 * gib, "frames": gen},
        {"action": "free_completed", "addr": 2, "size": 2 * gib, "frames": gen},
        {"action": "alloc", "addr": 4, "size": gib, "frames": ours},
    ]
    m = kp.peak_composition(events, base=4 * gib)
    assert m["peak_gib"] == 6.5 and m["peak_event"] == 3
    assert m["before_step_gib"] == 3.0 and m["in_step_gib"] == 3.5
    rows = {r["site"]: (r["gib"], r["blocks"]) for r in m["live_at_peak"]}
    assert rows == {"llama.py:88 forward <- functional.py:linear": (1.5, 2), "cabc.py:9 call": (2.0, 1)}
    assert "6.50 GiB" in kp.memory_table("x", m)
