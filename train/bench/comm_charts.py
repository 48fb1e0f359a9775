"""Charts of ``train bench comm``: bus bandwidth per message size, and the P2P matrix."""

from __future__ import annotations


def chart_sweep(ax, rows):
    series: dict[str, list] = {}
    for r in rows:
        if r.get("busbw_GBps") is not None and not r["op"].endswith("(raw loop)"):
            series.setdefault(f"{r['op']} {r['dtype']}", []).append((r["bytes"], r["busbw_GBps"]))
    for label, pts in series.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker=".", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("collectives: bus bandwidth vs message size")
    if series:
        ax.legend(fontsize=8)


def chart_p2p(ax, rows):
    import numpy as np

    n = max([max(r["src"], r["dst"]) for r in rows], default=0) + 1
    m = np.zeros((n, n))
    for r in rows:
        m[r["src"], r["dst"]] = r["bw_GBps"]
    im = ax.imshow(m, cmap="viridis")
    for r in rows:
        ax.text(r["dst"], r["src"], f"{r['bw_GBps']:.1f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_xlabel("dst rank")
    ax.set_ylabel("src rank")
    ax.set_title("P2P send/recv bandwidth (GB/s)")
    ax.figure.colorbar(im, ax=ax)
