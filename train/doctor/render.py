"""``train doctor``'s report as text (tables) or JSON; pure functions of the report dict."""

from __future__ import annotations

import json

from train.memory import GiB


def render_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str)


def render_text(report: dict) -> str:
    out = ["train doctor: GPU setup check", ""]
    out += _versions(report)
    out.append("")
    out += _gpus(report)
    out.append("")
    out += _libraries(report)
    out += _profile(report.get("profile"))
    out += _memory(report.get("memory"))
    out.append("")
    for label, key in (("note", "notes"), ("warning", "warnings"), ("PROBLEM", "problems")):
        for msg in report.get(key, []):
            out.append(f"{label}: {msg}")
    out.append(f"result: {'OK' if report['ok'] else 'PROBLEMS FOUND'} (exit {report['exit_code']})")
    return "\n".join(out)


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    fmt = lambda r: indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(headers), indent + "  ".join("-" * w for w in widths), *[fmt(r) for r in rows]]


def _versions(report: dict) -> list[str]:
    v = report["versions"]
    out = [f"host      {report['host']} ({report['platform']}), Python {report['python']}",
           f"torch     {v['torch']}   CUDA {v['cuda'] or 'none'}   cuDNN {v['cudnn'] or 'none'}   "
           f"NCCL {v['nccl'] or 'none'}   driver {v['driver'] or 'none'}"]
    if "driver_cuda" in report:
        out.append(report["driver_cuda"]["line"])
    if "net_plugin" in report:
        out.append(report["net_plugin"]["line"])
    return out


def _gpus(report: dict) -> list[str]:
    gpus = report["gpus"]
    if not gpus:
        return ["GPUs      none visible"]
    rows = [[g["index"], g["name"], g["sm"], f"{g['memory_gib']:.1f}", g["multiprocessors"],
             ", ".join(g["fp8"]) or "no", ", ".join(g["mxfp8"]) or "no",
             g["peak_bf16_tflops"] or "?"] for g in gpus]
    out = ["GPUs", *_table(["#", "name", "arch", "GiB", "SMs", "FP8", "MXFP8 backends", "bf16 TFLOPS"], rows)]
    if len(gpus) > 1:
        out += ["", "Peer access (P2P) / link from nvidia-smi topo -m"]
        links = report["topology"]["links"]
        head = [""] + [f"GPU{j}" for j in range(len(gpus))]
        rows = []
        for i, row in enumerate(report["peer_access"]):
            cells = []
            for j, ok in enumerate(row):
                if ok is None:
                    cells.append("X")
                else:
                    link = links[i][j] if links else None
                    cells.append(("yes" if ok else "NO") + (f"/{link}" if link else ""))
            rows.append([f"GPU{i}", *cells])
        out += _table(head, rows)
    return out


def _libraries(report: dict) -> list[str]:
    ao, te = report["libraries"]["torchao"], report["libraries"]["transformer_engine"]
    ao_line = "not installed" if not ao["installed"] else (
        f"{ao['version']}  C++ extensions: {ao['cpp_extensions']}" + (f" ({ao['detail']})" if ao["detail"] else ""))
    te_line = "not installed" if not te["installed"] else (
        f"{te['version']}" + (f"  ({te['detail']})" if te["detail"] else ""))
    out = ["Libraries", f"  torchao             {ao_line}", f"  transformer_engine  {te_line}"]
    nccl = report["nccl"]
    if nccl.get("selftest"):
        out.append(f"  NCCL self-test      {nccl['selftest']}")
    return out


def _profile(prof: dict | None) -> list[str]:
    if not prof:
        return []
    fp8 = ", ".join(prof["fp8_by_arch"] or []) or "no"
    mx = ", ".join(prof["mxfp8_backends"] or []) or "none"
    return ["",
            f"Profile   {prof['name']}: {prof['model']}, {prof['arch']}, {prof['gpus_per_node']} GPUs/node, "
            f"{prof['memory_gb'] or '?'} GB, NVLink {'yes' if prof['nvlink'] else 'no'}"
            + (f", CPU {prof['cpu_arch']}" if prof.get("cpu_arch") else ""),
            f"          FP8 ({prof['arch']}): {fp8}; MXFP8 backends: {mx}; profile lists: "
            f"{', '.join(prof['fp8']) or 'none'}"]


def _memory(mem: dict | None) -> list[str]:
    if not mem:
        return []
    out = ["",
           f"Memory per GPU: preset {mem['preset']} ({mem['params'] / 1e9:.2f} B params), seq {mem['seq']}, "
           f"batch {mem['batch']} per GPU, {mem['gpus']} GPU(s) [{mem['source']}]",
           f"  {mem['precision']}; GiB; peak = max over forward, backward, AC recompute, optimizer step"]
    rows = [[r["label"], _gib(r["params"]), _gib(r["grads"]), _gib(r["optimizer"]),
             _gib(r["weights_backward"]), _gib(r["activations"]), _gib(r["loss_buffers"]),
             _gib(r["peak"]), r.get("max_batch", "-") if mem["gpu_memory_gib"] else "-"]
            for r in mem["estimates"]]
    out += _table(["layout", "params", "grads", "optim", "bf16 w", "activ.", "loss", "peak", "max batch"], rows)
    rec = mem["recommendation"]
    budget = (f"{mem['usable_fraction'] * 100:.0f}% of {mem['gpu_memory_gib']} GiB"
              if mem["gpu_memory_gib"] else "unknown GPU memory")
    if rec["strategy"]:
        out.append(f"  recommended: {rec['label']}, batch {rec['batch_per_gpu']} per GPU "
                   f"(max {rec['max_batch_per_gpu']} within {budget}); {rec['reason']}")
    else:
        out.append(f"  recommended: none ({rec['reason']})")
    if mem.get("plan"):
        p = mem["plan"]
        out.append(f"  automatic plan for --config {p['config']}: {p['line'].removeprefix('plan: ')}")
        if p["values"]:
            out.append("    " + " ".join(f"{k}={v}" for k, v in p["values"].items()))
    out += _measured(mem.get("measured", []))
    return out


def _measured(measured: list[dict]) -> list[str]:
    out = []
    for m in measured:
        if "error" in m and isinstance(m["error"], float):
            out.append(f"  measured (ac={m['ac']}, {m['steps']} steps on {m['device']}): "
                       f"{_gib(m['measured_bytes'])} GiB vs estimate {_gib(m['estimate_bytes'])} GiB "
                       f"({m['error'] * 100:+.1f}%)")
        else:
            out.append(f"  measured (ac={m.get('ac')}): {m.get('skipped') or m.get('failed')}")
    return out
