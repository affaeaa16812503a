#!/usr/bin/env python3
"""A/B of FlashTile builds on the CPU in one process: the same cells and tensors, each build's cpu-flash call and
torch's CPU SDPA (its flash kernel) timed in turn, rounds interleaved in an order drawn per round, so that
this VM's drift (±20 % between runs) falls on every column alike.

    OMP_NUM_THREADS=2 python3 bench/cpu_ab.py --libs A=build-a/src/libflashtile_capi.so,B=build-b/src/... \
        --hdims 128 --seqlens 2048 --dirs fwd,bwd

Each build is its own ctypes.CDLL (linked -Bsymbolic: a build's calls bind to its own symbols). --isa name=ISA sets
FLASHTILE_CPU_ISA around that name's calls, so one library listed under two names compares two of its kernel sets
(e.g. --libs f32=L,pairs=L --isa f32=avx512,pairs=avx512-bf16: the library reads the variable on every call). Shapes as
bench/cpu_matrix.py: B = 1, 8 heads, float32 (or --dtype bf16); GFLOP/s: forward 4·B·H·S²·D (halved causal),
backward 2.5× forward. Each figure: the median over --rounds rounds of the median of --iters calls.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import sdpa_peer, shuffled_rounds, with_isa  # noqa: E402
from decode import median_s  # noqa: E402
from gpu_bench import FlashTile  # noqa: E402  (the ctypes binding; CPU tensors give device -1)


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), for the plot's title."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def cell(libs, d, s, causal, direction, dtype, iters, rounds, isas=None):
    g = torch.Generator().manual_seed(s * 10 + d + causal)
    mk = lambda: torch.randn(1, s, 8, d, generator=g).to(dtype)
    q, k, v, do = mk(), mk(), mk(), mk()
    out, lse = torch.empty_like(q), torch.empty(1, 8, s, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    calls = {}
    for name, ft in libs.items():
        isa = (isas or {}).get(name)
        with_isa(lambda ft=ft: ft.forward(q, k, v, out, lse, causal=causal, backend="cpu-flash"), isa)()
        if direction == "fwd":
            fn = lambda ft=ft: ft.forward(q, k, v, out, lse, causal=causal, backend="cpu-flash")
        else:
            fn = lambda ft=ft: ft.backward(q, k, v, out, do, lse, dq, dk, dv, causal=causal, backend="cpu-flash")
        calls[name] = with_isa(fn, isa)
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
    calls["torch_flash"] = sdpa_peer(SDPBackend.FLASH_ATTENTION, qt, kt, vt, dot, causal, direction)
    times = shuffled_rounds(calls, rounds, lambda fn: median_s(fn, iters, warmup=1))
    flops = 4.0 * 8 * s * s * d / (2 if causal else 1) * (2.5 if direction == "bwd" else 1)
    res = {"hdim": d, "seqlen": s, "causal": causal, "direction": direction, "dtype": str(dtype).split(".")[-1],
           "threads": int(os.environ.get("OMP_NUM_THREADS", "0"))}
    for n, ts in times.items():
        res[f"{n}_s"] = statistics.median(ts)
        res[f"{n}_gflops"] = flops / res[f"{n}_s"] / 1e9
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", required=True, help="name=path,name=path")
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--seqlens", default="2048")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--dirs", default="fwd,bwd")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bf16"))
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--isa", default="", help="name=ISA,...: FLASHTILE_CPU_ISA around that build's calls")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    isas = dict(x.split("=", 1) for x in args.isa.split(",") if x)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    libs = {n: FlashTile(p) for n, p in (x.split("=", 1) for x in args.libs.split(","))}
    first = next(iter(libs))
    print(f"threads {torch.get_num_threads()}, {args.dtype}; GFLOP/s, ratios against {first} and torch's flash kernel")
    rows = []
    for direction in args.dirs.split(","):
        for d in map(int, args.hdims.split(",")):
            for s in map(int, args.seqlens.split(",")):
                for c in map(int, args.causal.split(",")):
                    r = cell(libs, d, s, bool(c), direction, dtype, args.iters, args.rounds, isas)
                    rows.append(r)
                    gf = lambda n: r[f"{n}_gflops"]
                    cols = " ".join(f"{n}={gf(n):6.1f} ({gf(n) / gf(first):.3f}, {gf(n) / gf('torch_flash'):.2f}t)"
                                    for n in libs)
                    print(f"{direction} D={d} S={s} causal={c}: {cols} torch={gf('torch_flash'):6.1f}", flush=True)
    if args.json:
        meta = {"cpu": cpu_model(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "libs": args.libs, "isa": args.isa, "torch": torch.__version__, "load": os.getloadavg()}
        json.dump({"meta": meta, "rows": rows},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
