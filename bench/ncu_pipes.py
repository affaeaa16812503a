#!/usr/bin/env python3
"""Tensor-pipe and issue-slot utilisation of FlashTile's kernels beside torch's (flash, cuDNN) on one shape, from ncu.

Runs bench/gpu_profile.py --peers under `ncu --metrics` (a handful of counters: few replay passes, unlike
--set full) and prints one line per kernel longer than --min-us:

    python3 bench/ncu_pipes.py --lib build/gpu/src/libflashtile_capi.so --hdim 128 --seqlen 8192 [--causal]

Columns: duration (µs), tensor pipe active (% of peak sustained: wgmma on Hopper, mma.sync otherwise, whichever the
chip counts), issue slots busy (% of peak sustained, ncu's "Issue Slots Busy"), SM throughput (% of peak).
Metric names differ between ncu versions and chips: the output names the metric each column used. With --stalls,
each kernel also gets its largest warp-stall reasons (ncu's smsp__average_warps_issue_stalled_*_per_issue_active:
warps waiting on that reason per cycle in which an instruction issued, the Warp State section's figures).

    python3 bench/ncu_pipes.py --from-log pipes.log --png pipes.png   (bars of a saved output, no GPU needed)
"""
import argparse
import csv
import io
import os
import re
import subprocess
import sys

WANTED = {  # column -> candidate base metrics, first one this ncu knows wins
    "tensor %": ["sm__pipe_tensor_op_gmma_cycles_active", "sm__pipe_tensor_op_hmma_cycles_active",
                 "sm__pipe_tensor_cycles_active"],
    "mma.sync %": ["sm__pipe_tensor_op_hmma_cycles_active"],
    "issue %": ["sm__inst_issued"],
    "SM %": ["sm__throughput"],
}
SUFFIX = {"SM %": ".avg.pct_of_peak_sustained_elapsed"}


def known_metrics(chip):
    out = subprocess.run(["ncu", "--query-metrics", "--chip", chip], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip() and not line.startswith(("-", "Device"))}


SHORT = [("sm90::fwd_kernel", "FlashTile sm90 fwd"), ("sm90::bwd_kernel", "FlashTile sm90 bwd"),
         ("sm90::bwd_wide_kernel", "FlashTile sm90 bwd"),
         ("sm80::fwd_kernel", "FlashTile sm80 fwd"),
         ("sm80::bwd_kernel", "FlashTile sm80 bwd"), ("flash_fprop", "cuDNN fwd"), ("flash_bprop", "cuDNN bwd"),
         ("flash_fwd_kernel", "torch flash fwd"), ("flash_bwd_dq_dk_dv", "torch flash bwd")]


def plot(log_path, png_path):
    """Tensor % and issue % of the attention kernels in a saved output, one panel per shape."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels, cols = [], []
    for line in open(log_path):
        if line.startswith("shape:"):
            panels.append((line.strip()[7:], {}))
        elif line.startswith("kernel"):
            cols = re.findall(r"(\S+) %", line)  # "tensor %" -> "tensor"
        elif panels and cols:
            name, vals = line[:70], line[70:].split()
            label = next((lab for key, lab in SHORT if key in name), None)
            if label and len(vals) == len(cols) + 1:
                panels[-1][1][label] = dict(zip(cols, (float(v) for v in vals[1:])))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels):
        names = [lab for _, lab in SHORT if lab in rows]
        for j, col in enumerate(("tensor", "issue")):
            ax.bar([i + 0.4 * j for i in range(len(names))], [rows[n].get(col, 0) for n in names], 0.4,
                   label=f"{col} % of peak")
        ax.set_xticks([i + 0.2 for i in range(len(names))])
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
        ax.set_title(title, fontsize=8)
        ax.set_ylim(0, 100)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("--from-log", help="plot a saved output instead of profiling (with --png)")
    ap.add_argument("--png")
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--chip", default="gh100")
    ap.add_argument("--min-us", type=float, default=50.0)
    ap.add_argument("--stalls", action="store_true", help="also the top warp-stall reasons of each kernel")
    args = ap.parse_args()
    if args.from_log:
        return plot(args.from_log, args.png)
    known = known_metrics(args.chip)
    cols = {}
    for col, cands in WANTED.items():
        hit = next((c for c in cands if c in known), None)
        if hit is None:
            print(f"(no metric for '{col}' in this ncu: tried {cands})")
        else:
            cols[col] = hit + SUFFIX.get(col, ".avg.pct_of_peak_sustained_active")
    stall_prefix, stall_suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active"
    stalls = sorted(m + ".ratio" for m in known if m.startswith(stall_prefix) and m.endswith(stall_suffix)) \
        if args.stalls else []
    metrics = ["gpu__time_duration.sum"] + sorted(set(cols.values())) + stalls
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = ["ncu", "--clock-control", "none", "--csv", "--metrics", ",".join(metrics), sys.executable,
           os.path.join(here, "gpu_profile.py"), "--lib", args.lib, "--peers", "--hdim", str(args.hdim),
           "--seqlen", str(args.seqlen)] + (["--causal"] if args.causal else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in res.stdout.splitlines() if l.startswith('"')]
    if res.returncode != 0 or not lines:
        sys.exit(f"ncu failed ({res.returncode}): {res.stderr[-2000:]}")
    per = {}  # (launch id, kernel) -> {metric: value}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        key = (int(row["ID"]), row["Kernel Name"])
        value = float(row["Metric Value"].replace(",", "") or "nan")
        if row["Metric Name"].startswith("gpu__time_duration"):  # to µs, whatever unit ncu chose
            value *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(row.get("Metric Unit", ""), 1e-3)
        per.setdefault(key, {})[row["Metric Name"]] = value
    print(f"shape: hdim {args.hdim}, seqlen {args.seqlen}, causal {int(args.causal)} (bench cell: 16k tokens, d_model 2048)")
    print("metrics: " + ", ".join(f"{c} = {m}" for c, m in cols.items()))
    print(f"{'kernel':70s} {'µs':>8s} " + " ".join(f"{c:>10s}" for c in cols))
    for (_, name), m in sorted(per.items()):
        us = m.get("gpu__time_duration.sum", 0.0)
        if us < args.min_us:
            continue
        vals = " ".join(f"{m.get(metric, float('nan')):10.1f}" for metric in cols.values())
        print(f"{name[:70]:70s} {us:8.1f} {vals}")
        if stalls:
            top = sorted(((m.get(s, 0.0), s[len(stall_prefix):-len(stall_suffix + ".ratio")]) for s in stalls),
                         reverse=True)[:6]
            print("    stalls: " + ", ".join(f"{r} {v:.2f}" for v, r in top))


if __name__ == "__main__":
    main()
