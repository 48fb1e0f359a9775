"""Re-render (or check) the committed example outputs: ``k8s/*.yaml`` and ``docs/examples/*``.

Stale files under ``k8s/`` that no example produces any more are removed when writing.
A developer tool (not part of the ``launch`` package): it runs the ``launch`` of this checkout.

    python scripts/render_examples.py            # write them (the `make render-k8s` target)
    python scripts/render_examples.py --check    # exit 1 if a committed file differs from a fresh render

Each file's first line records the exact ``launch`` command that produced it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout's `launch`, whatever the current directory
    sys.path.insert(0, str(ROOT))

IMAGE_HOPPER = "registry.example.invalid/hopper-train:hopper"
IMAGE_BLACKWELL = "registry.example.invalid/hopper-train:blackwell"

# (output file, subcommand, launch options, training arguments after `--`)
EXAMPLES: list[tuple[str, str, list[str], list[str]]] = [
    (
        "k8s/runtime-h100-nvlink.yaml",
        "k8s-runtime",
        ["--profile", "h100", "--image", IMAGE_HOPPER],
        [],
    ),
    (
        "k8s/runtime-h100-infiniband-gang.yaml",
        "k8s-runtime",
        ["--profile", "h100", "--nnodes", "2", "--fabric", "infiniband", "--gang", "--image", IMAGE_HOPPER],
        [],
    ),
    (
        "k8s/runtime-gb200-nvlink.yaml",
        "k8s-runtime",
        ["--profile", "gb200", "--image", IMAGE_BLACKWELL],
        [],
    ),
    (
        "k8s/trainjob-h100-1x8.yaml",
        "k8s",
        ["--profile", "h100", "--name", "h100-1x8", "--image", IMAGE_HOPPER],
        ["--config", "1b", "--out", "/checkpoints/h100-1x8", "--resume"],
    ),
    (
        "k8s/trainjob-h100-2x8-infiniband-kueue.yaml",
        "k8s",
        ["--profile", "h100", "--nnodes", "2", "--fabric", "infiniband", "--gang", "--name", "h100-2x8-ib",
         "--image", IMAGE_HOPPER, "--queue", "gpu-training"],
        ["--config", "8b", "--out", "/checkpoints/h100-2x8-ib", "--resume"],
    ),
    (
        "k8s/trainjob-gb200-1x4.yaml",
        "k8s",
        ["--profile", "gb200", "--name", "gb200-1x4", "--image", IMAGE_BLACKWELL],
        ["--config", "1b", "--out", "/checkpoints/gb200-1x4", "--resume"],
    ),
    (
        "k8s/trainjob-gb200-nvl72-2x4.yaml",
        "k8s",
        ["--profile", "gb200", "--nnodes", "2", "--name", "gb200-2x4", "--image", IMAGE_BLACKWELL],
        ["--config", "8b", "--out", "/checkpoints/gb200-2x4", "--resume"],
    ),
    (
        "k8s/pytorchjob-h100-2x8-infiniband.yaml",
        "k8s",
        ["--api", "pytorchjob", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband", "--name", "h100-2x8-ib",
         "--image", IMAGE_HOPPER],
        ["--config", "8b", "--out", "/checkpoints/h100-2x8-ib", "--resume"],
    ),
    (
        "k8s/pytorchjob-h100-elastic-1to4-infiniband.yaml",
        "k8s",
        ["--api", "pytorchjob", "--profile", "h100", "--nnodes", "1:4", "--fabric", "infiniband", "--name", "h100-elastic",
         "--image", IMAGE_HOPPER, "--gang"],
        ["--config", "8b", "--out", "/checkpoints/h100-elastic", "--resume"],
    ),
    (
        "k8s/pytorchjob-h200-2x8-infiniband-kueue.yaml",
        "k8s",
        ["--api", "pytorchjob", "--profile", "h200", "--nnodes", "2", "--fabric", "infiniband", "--name", "h200-2x8-ib",
         "--image", IMAGE_HOPPER, "--queue", "gpu-training", "--image-pull-secret", "registry-credentials"],
        ["--config", "8b", "--out", "/checkpoints/h200-2x8-ib", "--resume"],
    ),
    (
        "k8s/pytorchjob-gb200-nvl72-2x4.yaml",
        "k8s",
        ["--api", "pytorchjob", "--profile", "gb200", "--nnodes", "2", "--name", "gb200-2x4", "--image", IMAGE_BLACKWELL],
        ["--config", "8b", "--out", "/checkpoints/gb200-2x4", "--resume"],
    ),
    (
        "docs/examples/slurm-b200-2x8-infiniband.sbatch",
        "slurm",
        ["--profile", "b200", "--nnodes", "2", "--fabric", "infiniband", "--name", "b200-2x8",
         "--image", IMAGE_BLACKWELL, "--pyxis", "--time", "24:00:00", "--checkpoint-dir", "/lustre/checkpoints"],
        ["--config", "8b", "--out", "/lustre/checkpoints/b200-2x8", "--resume"],
    ),
    (
        "docs/examples/torchrun-h100-2x8-roce.sh",
        "torchrun",
        ["--profile", "h100", "--nnodes", "2", "--fabric", "roce", "--name", "h100-2x8-roce",
         "--ib-hca", "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
         "--rdzv-endpoint", "gpu-node-0:29400"],
        ["--config", "8b", "--out", "/shared/runs/h100-2x8-roce", "--resume"],
    ),
    (
        "docs/examples/docker-rtx-pro-6000-4x.sh",
        "docker",
        ["--profile", "rtx-pro-6000", "--nproc-per-node", "4", "--name", "rtx-pro-4x",
         "--image", "hopper-train:blackwell", "--checkpoint-dir", "/srv/checkpoints"],
        ["--config", "350m", "--out", "/srv/checkpoints/rtx-pro-4x", "--resume"],
    ),
    (
        "docs/examples/docker-cpu-laptop.sh",
        "docker",
        ["--cpu", "--nproc-per-node", "2", "--name", "laptop", "--checkpoint-dir", "/tmp/hopper-train"],
        ["--config", "tiny", "--steps", "50"],
    ),
]


def argv_for(path: str, sub: str, options: list[str], train: list[str], write: bool) -> list[str]:
    return [sub, *options, *(["-o", path] if write else []), *(["--", *train] if train else [])]


def render_text(argv: list[str]) -> str:
    """Render in-process and return what `launch` would print (raises on a non-zero exit). The
    environment's REGISTRY is set aside: an example's options are all on its command line."""
    from launch.cli import main

    out, err = io.StringIO(), io.StringIO()
    registry = os.environ.pop("REGISTRY", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    finally:
        if registry is not None:
            os.environ["REGISTRY"] = registry
    if rc != 0:
        raise RuntimeError(f"launch {' '.join(argv)} failed: {err.getvalue().strip()}")
    return out.getvalue()


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/render_examples.py", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--root", default=".", help="repository root (default: current directory)")
    opts = parser.parse_args(args)
    root, stale = Path(opts.root), []
    for path, sub, options, train in EXAMPLES:
        target = root / path
        if opts.check:
            fresh = render_text(argv_for(path, sub, options, train, write=False))
            if not target.is_file() or target.read_text(encoding="utf-8") != fresh:
                stale.append(path)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        render_text(argv_for(str(target), sub, options, train, write=True))
        print(f"rendered {path}")
    listed = {root / path for path, *_ in EXAMPLES}
    for orphan in sorted(set((root / "k8s").glob("*.yaml")) - listed):
        if not orphan.read_text(encoding="utf-8").startswith("# Generated by: launch "):
            continue  # not ours
        if opts.check:
            stale.append(f"{orphan.relative_to(root)} (no example renders it any more)")
        else:
            orphan.unlink()
            print(f"removed {orphan.relative_to(root)} (no example renders it any more)")
    for path in stale:
        print(f"stale: {path} (run: python scripts/render_examples.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
