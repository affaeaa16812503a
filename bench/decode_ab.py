#!/usr/bin/env python3
"""Interleaved A/B of the CPU decode (forward_kvcache) between libflashtile_capi.so builds, in one process: per
cell, 7 rounds in which each library's call is timed 9 times (the order alternating by round), the median per
round, the median of the rounds. GQA 32/8, head dim 128, bf16, contiguous cache, Sq new rows appended in place,
causal, on bench/decode.py's tensors. GB/s = bytes of K+V the call reads / time.

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive python3 bench/decode_ab.py --libs base=a.so,new=b.so \
        --cells 16:1:4096,16:8:4096,1:1:32768
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode import cell_inputs, flashtile_decode, median_s  # noqa: E402  bench/decode.py's cells, call, timing
from gpu_bench import FlashTile  # noqa: E402  the ctypes binding of the C ABI
from ab_common import with_isa  # noqa: E402


def cell(fts, sq, b, length, rounds=7, calls=9, isas=None):
    t = cell_inputs(b, sq, length)
    res = {n: [] for n in fts}
    for rnd in range(rounds):
        for n in (list(fts) if rnd % 2 == 0 else list(fts)[::-1]):
            fn = with_isa(lambda: flashtile_decode(fts[n], t), (isas or {}).get(n))
            res[n].append(median_s(fn, calls, warmup=1))
    return {n: t.kv_bytes / 1e9 / statistics.median(r) for n, r in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", required=True, help="name=path,name=path")
    ap.add_argument("--cells", default="16:1:4096,16:8:4096,16:1:32768,1:1:32768,1:8:4096", help="sq:batch:keys,...")
    ap.add_argument("--png", default=None, help="also draw the table as grouped bars (matplotlib)")
    ap.add_argument("--isa", default="", help="name=ISA,...: FLASHTILE_CPU_ISA around that build's calls (one library "
                    "under two names compares two of its kernel sets)")
    args = ap.parse_args()
    isas = dict(x.split("=", 1) for x in args.isa.split(",") if x)
    fts = {n: FlashTile(p) for n, p in (a.split("=", 1) for a in args.libs.split(","))}
    names = list(fts)
    rows = []
    print("| Sq | batch | keys | " + " | ".join(f"{n} GB/s" for n in names) + f" | {names[-1]} ÷ {names[0]} |")
    print("|---:|---:|---:|" + "---:|" * (len(names) + 1))
    for c in args.cells.split(","):
        sq, b, length = (int(x) for x in c.split(":"))
        r = cell(fts, sq, b, length, isas=isas)
        rows.append((f"Sq {sq}, B {b}, " + (f"{length // 1024}k" if length >= 1024 else f"{length} keys"), r))
        print(f"| {sq} | {b} | {length} | " + " | ".join(f"{r[n]:.1f}" for n in names)
              + f" | {r[names[-1]] / r[names[0]]:.2f} |", flush=True)

    if args.png:
        plot(rows, names, args.png)


def plot(rows, names, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(rows), 3.6))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([j + i * width for j in range(len(rows))], [r[n] for _, r in rows], width, label=n)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([c for c, _ in rows], fontsize=8)
    ax.set_ylabel("GB/s of K+V read")
    ax.set_title("CPU decode, GQA 32/8, hdim 128, bf16 cache (bench/decode_ab.py)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
