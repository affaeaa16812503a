#!/usr/bin/env python3
"""Interleaved A/B of the CPU decode (forward_kvcache) between libflashtile_capi.so builds, in one process: per
cell, 7 rounds in which each library's call is timed 9 times (the order alternating by round), the median per
round, the median of the rounds. GQA 32/8, head dim 128, bf16, contiguous cache, Sq new rows appended in place,
causal. GB/s = bytes of K+V the call reads / time.

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive python3 bench/decode_ab.py --libs base=a.so,new=b.so \
        --cells 16:1:4096,16:8:4096,1:1:32768
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import FlashTile  # noqa: E402  the ctypes binding of the C ABI

HQ, HKV, D = 32, 8, 128


def cell(fts, sq, b, length, rounds=7, calls=9):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, sq, HQ, D, generator=g).to(torch.bfloat16)
    out = torch.empty_like(q)
    lens = torch.full((b,), length - sq, dtype=torch.int32)
    k = torch.randn(b, length, HKV, D, generator=g).to(torch.bfloat16)
    v = torch.randn(b, length, HKV, D, generator=g).to(torch.bfloat16)
    kn = torch.randn(b, sq, HKV, D, generator=g).to(torch.bfloat16)
    vn = torch.randn(b, sq, HKV, D, generator=g).to(torch.bfloat16)
    res = {n: [] for n in fts}
    for rnd in range(rounds):
        for n in (list(fts) if rnd % 2 == 0 else list(fts)[::-1]):
            call = lambda: fts[n].forward_kvcache(q, k, v, out, cache_seqlens=lens, k_new=kn, v_new=vn, causal=True)
            call()
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t0)
            res[n].append(statistics.median(ts))
    gb = b * length * HKV * 2 * D * 2 / 1e9
    return {n: gb / statistics.median(r) for n, r in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", required=True, help="name=path,name=path")
    ap.add_argument("--cells", default="16:1:4096,16:8:4096,16:1:32768,1:1:32768,1:8:4096", help="sq:batch:keys,...")
    args = ap.parse_args()
    fts = {n: FlashTile(p) for n, p in (a.split("=", 1) for a in args.libs.split(","))}
    names = list(fts)
    print("| Sq | batch | keys | " + " | ".join(f"{n} GB/s" for n in names) + f" | {names[-1]} ÷ {names[0]} |")
    print("|---:|---:|---:|" + "---:|" * (len(names) + 1))
    for c in args.cells.split(","):
        sq, b, length = (int(x) for x in c.split(":"))
        r = cell(fts, sq, b, length)
        print(f"| {sq} | {b} | {length} | " + " | ".join(f"{r[n]:.1f}" for n in names)
              + f" | {r[names[-1]] / r[names[0]]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
