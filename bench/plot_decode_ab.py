#!/usr/bin/env python3
"""Draws bench/decode_chain.py --libs runs (its printed output, saved to a log) as grouped bars: GB/s of K+V (bytes /
median period per call) per cell and build, one panel per log. No GPU or torch needed.

    python3 bench/plot_decode_ab.py run1.log run2.log --png bench/results/h200-decode-ab.png
"""
import argparse
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hbm_peaks import hbm_peak_gbs  # noqa: E402


def log_peak(log, lines):
    """The HBM peak of the log's GPU: its "gpu:" line (decode_chain.py since 2026-12-08), else the file name's
    machine (h100 in the name: the H100 80GB HBM3 of those runs; otherwise the H200)."""
    gpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("gpu:")), None)
    if gpu is None:
        gpu = "H100 80GB HBM3" if "h100" in os.path.basename(log).lower() else "H200"
    return hbm_peak_gbs(gpu) or 4800.0, gpu


def plot_ab(logs, png):
    """Grouped bars of GB/s (K+V bytes / median period) per cell and build, from --libs runs' printed output."""
    fig, axes = plt.subplots(len(logs), 1, figsize=(12, 3.2 * len(logs)), squeeze=False)
    for ax, log in zip(axes[:, 0], logs):
        cells, names = [], []
        lines = open(log).read().splitlines()
        peak, gpu = log_peak(log, lines)
        for line in lines:
            m = re.match(r"cell: Sq=(\d+) batch=(\d+) keys=(\d+) page=(\S+)", line)
            if m:
                sq, b, k, pg = m.groups()
                cells.append((f"Sq{sq} B{b}\n{int(k) // 1024}k {'p' + pg if pg != 'contiguous' else 'contig'}", {}))
            m = re.match(r"\s+(\S+): period\s+[\d.]+ µs \(\s*(\d+) GB/s\)", line)
            if m and cells:
                cells[-1][1][m.group(1)] = int(m.group(2))
                if m.group(1) not in names:
                    names.append(m.group(1))
        width = 0.8 / max(1, len(names))
        for i, n in enumerate(names):
            xs = [c + i * width for c in range(len(cells))]
            ax.bar(xs, [cell[1].get(n, 0) for cell in cells], width, label=n)
        ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cells))], [c[0] for c in cells], fontsize=7)
        ax.set_ylabel("GB/s of K+V (period)")
        ax.set_ylim(0, peak)
        ax.axhline(peak * 0.9, ls=":", c="k", lw=0.8)  # 90 % of the HBM peak: issue 14's batch >= 8 target
        ax.set_title(f"{os.path.basename(log)} ({gpu}, HBM peak {peak:.0f} GB/s)", fontsize=9)
        ax.legend(fontsize=7, ncol=len(names), loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    plot_ab(args.logs, args.png)
