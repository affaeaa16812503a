#!/usr/bin/env python3
"""A/B of FlashTile builds in one process: the same cells, the same tensors, each build's cuda-sm90 call and
cuDNN's timed in turn, rounds interleaved (an order drawn per round) so that clock and thermal drift fall on every
column alike.

    python3 bench/gpu_ab.py --libs A=build-a/libflashtile_capi.so,B=build-b/libflashtile_capi.so \
        --hdims 128 --seqlens 4096,8192 --json out.json

Each build is its own ctypes.CDLL (RTLD_LOCAL: a build's calls bind to its own symbols). Shapes and TFLOP/s as
bench/gpu_bench.py: bf16, 16k tokens, d_model 2048, CUDA events, 5 warm-up calls, the median of --reps per round;
the reported figure is the median over --rounds rounds.
"""
import argparse
import json
import statistics

import torch
from torch.nn.attention import SDPBackend

from ab_common import shuffled_rounds, sdpa_peer
from gpu_bench import FlashTile, time_ms


def cell(libs, hdim, seqlen, causal, reps, rounds, direction, hooks=("none",), tokens=16384, d_model=2048):
    b, h = max(1, tokens // seqlen), d_model // hdim
    g = torch.Generator(device="cuda").manual_seed(seqlen * 1000 + hdim + causal)
    mk = lambda: torch.randn(b, seqlen, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, dout = mk(), mk(), mk(), mk()
    out, lse = torch.empty_like(q), torch.empty(b, h, seqlen, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    flops = 4.0 * b * h * seqlen * seqlen * hdim / (2 if causal else 1) * (2.5 if direction == "bwd" else 1)
    calls, kernels, results = {}, {}, {}
    # --hooks: FlashTile's forward with a score hook (softcap 30, or ALiBi slopes 2^(-8 (h+1) / H)); cuDNN's call
    # stays plain (SDPA has neither), the yardstick of the plain kernel. alibi0: ALiBi slopes of 0, which add 0 to
    # every score, so the output is the plain call's while the hook kernel (tile_table.h fwd_block_m: 128 query
    # rows where the masked kernel has 192) runs: the A/B of the row count without a second masked kernel.
    extras = {"softcap": {"softcap": 30.0},
              "alibi": {"alibi_slopes": torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda")},
              "alibi0": {"alibi_slopes": torch.zeros(h, device="cuda")},
              "none": {}}
    # marginN: the plain call with sm_margin = N (cuda-sm90's persistent forward on N fewer SMs): what leaving SMs to
    # a concurrent transfer costs the attention alone.
    extras.update({hk: {"sm_margin": int(hk[len("margin"):])} for hk in hooks if hk.startswith("margin")})
    for lib, ft in libs.items():
        for hook in hooks:
            name = lib if len(hooks) == 1 else f"{lib}+{hook}"
            extra = extras[hook]
            if direction == "fwd":
                fn = (lambda ft=ft, extra=extra: ft.forward(q, k, v, out, lse, causal=causal, backend="cuda-sm90",
                                                            **extra))
            else:
                ft.forward(q, k, v, out, lse, causal=causal, backend="cuda-sm90")
                fn = (lambda ft=ft: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal,
                                                backend="cuda-sm90"))
            kernels[name] = fn().split("\n")[0]
            calls[name] = fn
            results[name] = [x.clone() for x in ((out, lse) if direction == "fwd" else (dq, dk, dv))]
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))
    calls["cudnn"] = sdpa_peer(SDPBackend.CUDNN_ATTENTION, qt, kt, vt, dot, causal, direction)
    times = shuffled_rounds(calls, rounds, lambda fn: time_ms(fn, reps))
    # Each build's outputs against the first build's on the same inputs: builds that change only the schedule agree
    # bit for bit; a difference is printed beside the cell.
    first = next(iter(results))
    diff = {n: max((a.float() - b.float()).abs().max().item() for a, b in zip(r, results[first]))
            for n, r in results.items() if n != first}
    res = {"hdim": hdim, "seqlen": seqlen, "causal": causal, "direction": direction, "kernels": kernels,
           "max_abs_diff_vs_first": diff}
    for n, ts in times.items():  # keys as gpu_bench.py's, so that bench/plots.py draws the file
        res[f"{n}_{direction}_ms"] = statistics.median(ts)
        res[f"{n}_{direction}_tflops"] = flops / (res[f"{n}_{direction}_ms"] * 1e-3) / 1e12
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", required=True, help="name=path,name=path")
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--seqlens", default="2048,4096,8192,16384,32768")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--directions", default="fwd")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hooks", default="none", help="forward only: each build run with each of none, softcap, alibi, "
                    "alibi0, marginN (sm_margin = N) (comma-separated)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    libs = {n: FlashTile(p) for n, p in (x.split("=", 1) for x in args.libs.split(","))}
    hooks = tuple(args.hooks.split(","))
    names = [n if len(hooks) == 1 else f"{n}+{hk}" for n in libs for hk in hooks]
    rows = []
    head = "".join(f" {n:>9}" for n in names) + "     cudnn" + "".join(f" {n + '/cudnn':>12}" for n in libs)
    print(f"dir hdim seqlen causal{head}")
    for direction in args.directions.split(","):
        for hdim in map(int, args.hdims.split(",")):
            for s in map(int, args.seqlens.split(",")):
                for c in map(int, args.causal.split(",")):
                    r = cell(libs, hdim, s, bool(c), args.reps, args.rounds, direction, hooks)
                    rows.append(r)
                    tf = lambda n: r[f"{n}_{direction}_tflops"]
                    cols = "".join(f" {tf(n):9.0f}" for n in names)
                    ratio = "".join(f" {tf(n) / tf('cudnn'):12.3f}" for n in names)
                    diffs = "".join(f"  {n}: max |diff| {x:.3g}" for n, x in r["max_abs_diff_vs_first"].items() if x)
                    print(f"{direction} {hdim:4d} {s:6d} {c:6d}{cols} {tf('cudnn'):9.0f}{ratio}{diffs}", flush=True)
                    torch.cuda.empty_cache()
    for r in rows[:1] + rows[-1:]:
        for n, kname in r["kernels"].items():
            print(f"  {n}: {kname[:160]}")
    if args.json:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "cudnn": torch.backends.cudnn.version(), "libs": args.libs, "hooks": args.hooks}
        json.dump({"meta": meta, "rows": rows}, open(args.json, "w"), indent=1)
        try:
            import plots
            plots.plot_file(args.json)
        except ImportError as e:  # matplotlib absent: the JSON is still written
            print(f"no plot: {e}")


if __name__ == "__main__":
    main()
