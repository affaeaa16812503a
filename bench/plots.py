#!/usr/bin/env python3
"""Draws a benchmark's JSON as PNG: throughput against sequence length, one line per library, one panel per
(direction, dtype, head dim, causal, threads) group. Used by bench/cpu_matrix.py and bench/gpu_bench.py when they
write results, and on its own for results already written:

    python3 bench/plots.py bench/results/h200.json bench/results/cpu_xeon.json [--out-dir DIR] [--run NAME]

Reads the formats those scripts write: gpu_bench.py's {"meta", "rows"} (TFLOP/s), cpu_ab.py's rows (a "direction"
per row, GFLOP/s), cpu_matrix.py's {"meta",
"cells"} with per-library timings, the CLI-only CPU cells of earlier runs (FlashTile and OpenBLAS standard
attention), and files that collect several runs ({"runs": [...]} drawn together, {"name": run, ...} one PNG each).
A file with named runs writes STEM_NAME.png per run, any other STEM.png, next to the JSON unless --out-dir.
"""
import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Library key -> (label, colour, line style). FlashTile first and drawn thicker.
STYLE = {
    "flashtile": ("FlashTile", "C0", "-"),
    "sm90": ("FlashTile cuda-sm90", "C4", "-"),
    "sm90capi": ("FlashTile cuda-sm90, C ABI via ctypes", "C4", "--"),
    "flashtile_det": ("FlashTile deterministic", "C0", ":"),
    "sm90_det": ("FlashTile cuda-sm90 deterministic", "C4", ":"),
    "torch_flash": ("torch SDPA, CPU flash kernel", "C1", "-"),
    "flash": ("torch SDPA flash", "C1", "-"),
    "efficient": ("torch SDPA efficient", "C2", "-"),
    "cudnn": ("torch SDPA cuDNN", "C3", "-"),
    "torch_math": ("standard attention (torch math)", "C7", "--"),
    "standard": ("standard attention (OpenBLAS, CLI)", "C5", "--"),
    "standard_fp32": ("standard attention fp32 (OpenBLAS, CLI)", "C5", "--"),
}


def _point(out, group, lib, seqlen, value):
    if value:
        out.append({"group": group, "lib": lib, "seqlen": seqlen, "value": value})


def gpu_points(run):
    """gpu_bench.py rows: bf16, TFLOP/s already in the row."""
    pts = []
    for r in run["rows"]:
        for key, value in r.items():
            for d in ("fwd", "bwd"):
                if key.endswith(f"_{d}_tflops"):
                    group = (d, "bf16", r["hdim"], r["causal"], None)
                    _point(pts, group, key[: -len(f"_{d}_tflops")], r["seqlen"], value)
    return pts


def ab_points(run):
    """cpu_ab.py rows: one cell per row, GFLOP/s per build or peer under NAME_gflops."""
    pts = []
    for r in run["rows"]:
        group = (r["direction"], r["dtype"], r["hdim"], r["causal"], r["threads"])
        for key, value in r.items():
            if key.endswith("_gflops"):
                _point(pts, group, key[: -len("_gflops")], r["seqlen"], value)
    return pts


def cpu_points(run):
    """cpu_matrix.py cells (per-library timings) and the CLI-only cells of earlier runs; GFLOP/s."""
    pts = []
    for c in run.get("cells", []) + run.get("bf16", []):
        fl = c["fwd_flops"]
        dtype = c.get("dtype", "bf16" if "bfloat16" in c.get("shape", "") else "float32")
        for d, mult in (("fwd", 1.0), ("bwd", 2.5)):
            group = (d, dtype, c["hdim"], c["causal"], c["threads"])
            for lib, r in c.get("libs", {}).items():
                if d in r:
                    _point(pts, group, lib, c["seqlen"], mult * fl / r[d]["s"] * 1e-9)
            cli = c.get("cli", c if "flash_fwd_s" in c else {})
            if f"flash_{d}_s" in cli:
                if "libs" not in c:  # a CLI-only cell: its FlashTile is the one there is
                    _point(pts, group, "flashtile", c["seqlen"], mult * fl / cli[f"flash_{d}_s"] * 1e-9)
                std = "standard_fp32" if dtype == "bf16" else "standard"
                _point(pts, group, std, c["seqlen"], mult * fl / cli[f"standard_{d}_s"] * 1e-9)
    return pts


def runs_of(data):
    """[(name or None, run)] for one JSON file."""
    if "rows" in data or "cells" in data:
        return [(None, data)]
    if "runs" in data:  # several runs of one kind, drawn together
        merged = {"meta": [r["meta"] for r in data["runs"]], "cells": [], "bf16": []}
        for r in data["runs"]:
            merged["cells"] += r.get("cells", [])
            merged["bf16"] += r.get("bf16", [])
        return [(None, merged)]
    return [(k, v) for k, v in data.items() if isinstance(v, dict) and ("rows" in v or "cells" in v)]


def group_title(g):
    d, dtype, hdim, causal, threads = g
    t = f"{'forward' if d == 'fwd' else 'backward'} · {dtype} · D={hdim} · {'causal' if causal else 'full'}"
    return t + (f" · {threads} thread{'s' if threads > 1 else ''}" if threads else "")


def draw(pts, title, unit, path):
    order = lambda g: (g[4] or 0, g[1] != "float32", g[0] != "fwd", g[2], g[3])
    groups = sorted({p["group"] for p in pts}, key=order)
    libs = [k for k in STYLE if any(p["lib"] == k for p in pts)]
    libs += sorted({p["lib"] for p in pts} - set(libs))
    ncols = min(4, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.9), squeeze=False)
    for ax, g in zip(axes.flat, groups):
        for lib in libs:
            xs = sorted((p["seqlen"], p["value"]) for p in pts if p["group"] == g and p["lib"] == lib)
            if not xs:
                continue
            # Libraries outside STYLE (gpu_ab.py's build names) take colours STYLE leaves free, so none repeats.
            free = [f"C{i}" for i in (5, 6, 8, 9, 7, 4, 0)]
            extra = [x for x in libs if x not in STYLE]
            label, colour, ls = STYLE.get(lib, (lib, free[extra.index(lib) % len(free)] if lib in extra else None, "-"))
            if lib == "flashtile" and "sm90" in libs:  # GPU runs with both CUDA backends: name the first
                label = "FlashTile cuda-sm80"
            ax.plot([x for x, _ in xs], [y for _, y in xs], ls, color=colour, marker="o", markersize=3.5,
                    linewidth=2.4 if lib == "flashtile" else 1.4, label=label)
        seqlens = sorted({p["seqlen"] for p in pts if p["group"] == g})
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens)
        ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens], fontsize=8)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(alpha=0.3)
        ax.set_title(group_title(g), fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    handles = {h.get_label(): h for ax in axes.flat for h in ax.get_lines()}
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper center", ncol=min(5, len(handles)),
               fontsize=9, frameon=False, bbox_to_anchor=(0.5, 1.0 - 0.22 / fig.get_figheight()))
    fig.suptitle(title, fontsize=11, y=1.0 - 0.02 / fig.get_figheight())
    fig.tight_layout(rect=(0, 0, 1, 1.0 - 0.5 / fig.get_figheight()))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def title_of(meta, name, unit):
    metas = meta if isinstance(meta, list) else [meta]
    meta = metas[0]
    where = meta.get("gpu") or meta.get("cpu") or meta.get("machine", "?")
    torch = f", torch {meta['torch']}" if meta.get("torch") else ""
    return f"{where}{torch}, {' and '.join(m.get('date', '?') for m in metas)}" + (f" [{name}]" if name else "") + f" ({unit}, higher is better)"


def plot_file(path, out_dir=None, only=None):
    """Draws every run in a JSON file (or the named ones); returns the PNG paths."""
    import json

    with open(path) as f:
        data = json.load(f)
    stem = os.path.splitext(os.path.basename(path))[0]
    out_dir = out_dir or os.path.dirname(path) or "."
    written = []
    for name, run in runs_of(data):
        if only and name not in only:
            continue
        # cpu_ab.py rows hold NAME_gflops; gpu_ab.py rows (TFLOP/s, as gpu_bench.py) are drawn as GPU rows.
        ab = "rows" in run and any(k.endswith("_gflops") for r in run["rows"] for k in r)
        gpu = "rows" in run and not ab
        pts = ab_points(run) if ab else gpu_points(run) if gpu else cpu_points(run)
        if not pts:
            continue
        unit = "TFLOP/s" if gpu else "GFLOP/s"
        png = os.path.join(out_dir, f"{stem}_{name}.png" if name else f"{stem}.png")
        written.append(draw(pts, title_of(run["meta"], name, unit), unit, png))
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--run", action="append", help="in a file of named runs, draw this one (repeatable)")
    args = ap.parse_args()
    for path in args.json:
        for png in plot_file(path, args.out_dir, args.run):
            print(png)


if __name__ == "__main__":
    sys.exit(main())
