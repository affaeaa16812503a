#!/usr/bin/env python3
"""Paged KV-cache decode on the CPU with the pages shuffled (as bench/decode.py lays them out, and as a serving
stack's allocator leaves them) against the same pages in order and a contiguous cache, in one process, rounds
interleaved: whether a paged cell's distance from the contiguous one is the page order (memory locality) or the
per-key page-table walk. Sq = 1, batch 1, 32k keys, GQA 32/8, hd128, bf16 (bench/decode.py's cell).

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive python3 bench/decode_page_order.py \
        --lib build/cpu/src/libflashtile_capi.so
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode  # noqa: E402  cell_inputs, flashtile_decode
from gpu_bench import FlashTile  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/cpu/src/libflashtile_capi.so")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    ft = FlashTile(args.lib)
    cells = {}
    for page in (0, 16, 64):
        for order in (("shuffled", "in order") if page else ("",)):
            t = decode.cell_inputs(1, 1, 32768, page)
            if order == "in order":
                t.table = torch.arange(t.table.numel(), dtype=torch.int32).reshape(t.table.shape)
            cells[f"paged {page}, {order}" if page else "contiguous"] = t
    gbs = {name: [] for name in cells}
    for _ in range(args.rounds):
        for name, t in cells.items():
            for _ in range(2):
                decode.flashtile_decode(ft, t)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                decode.flashtile_decode(ft, t)
                times.append(time.perf_counter() - t0)
            gbs[name].append(t.kv_bytes / statistics.median(times) / 1e9)
    base = statistics.median(gbs["contiguous"])
    print("| cache | GB/s (median of rounds) | rounds | ÷ contiguous |\n|---|---:|---|---:|")
    for name, v in gbs.items():
        med = statistics.median(v)
        print(f"| {name} | {med:.1f} | {min(v):.1f}-{max(v):.1f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
