#!/usr/bin/env python3
"""FlashTile's forward and backward next to torch SDPA's flash backend on the same tensors (bf16), for profiling.

Modes:
  (default)     one call of each, to run under ncu (scripts/gpu_check.sh's `profile` step):
                  ncu --set full -k 'regex:fwd_kernel|bwd_kernel|flash_fwd|flash_bwd' python3 bench/gpu_profile.py ...
  --time        also times each call (CUDA events, median of 20), so the profiled shape's speed is on record.
  --breakdown   for each cell of --cells, splits each call's event-timed interval into the GPU time of its kernels
                (torch.profiler / CUPTI, which sees FlashTile's kernels too) and the rest: host work before the
                first launch and gaps between launches. The benchmark (bench/gpu_bench.py) times each call between
                two events, so that rest counts against a library exactly as its kernels do.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402


def make_calls(ft, hdim, seqlen, causal, peers=False):
    """The four calls on one bench cell's shape: {name: (fn, flops)}. Call them inside
    sdpa_kernel(SDPBackend.FLASH_ATTENTION), as bench/gpu_bench.py does, so torch's forward runs its flash backend."""
    s, d = seqlen, hdim
    b, h = max(1, 16384 // s), 2048 // d
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, dout = mk(), mk(), mk(), mk()
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (qt, kt, vt))
    fwd_flops = 4.0 * b * h * s * s * d / (2 if causal else 1)

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    calls = {
        "flashtile_fwd": (lambda: ft.forward(q, k, v, out, lse, causal=causal), fwd_flops),
        "flashtile_bwd": (lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal), 2.5 * fwd_flops),
        "flash_fwd": (lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), fwd_flops),
        "flash_bwd": (lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True), 2.5 * fwd_flops),
    }
    if not peers:
        return calls, f"b={b} h={h} s={s} d={d} causal={int(causal)}"
    # --peers: cuda-sm90 by name and torch's cuDNN backend too (the Hopper kernels side by side under ncu).
    calls["sm90_fwd"] = (lambda: ft.forward(q, k, v, out, lse, causal=causal, backend="cuda-sm90"), fwd_flops)
    calls["sm90_bwd"] = (lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal, backend="cuda-sm90"),
                         2.5 * fwd_flops)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

    def cudnn_fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def cudnn_bwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(oc, (qg, kg, vg), dot, retain_graph=True)

    calls["cudnn_fwd"] = (cudnn_fwd, fwd_flops)
    calls["cudnn_bwd"] = (cudnn_bwd, 2.5 * fwd_flops)
    return calls, f"b={b} h={h} s={s} d={d} causal={int(causal)}"


def cuda_events(fn, calls, warmup=1):
    """The CUDA kernels and memsets of `calls` calls of fn after `warmup` unprofiled ones (torch.profiler, CUPTI),
    in start order."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)


def kernel_times(fn, calls=10):
    """Per call: GPU time of all kernels and memsets it launched (µs) and their names with mean µs."""
    per_name = {}
    for e in cuda_events(fn, calls):
        per_name[e.name] = per_name.get(e.name, 0.0) + e.time_range.elapsed_us()
    total = sum(per_name.values()) / calls
    return total, {n[:60]: t / calls for n, t in sorted(per_name.items(), key=lambda kv: -kv[1])}


def host_us(fn, reps=20):
    """Median host time to issue one call (no synchronisation inside the interval)."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


def breakdown(ft, cells, json_path):
    rows = []
    print(f"{'cell':34s} {'call':14s} {'event µs':>9s} {'kernels µs':>10s} {'rest µs':>8s} {'host µs':>8s}  kernels")
    for cell in cells:
        hdim, seqlen, causal = (int(x) for x in cell.split(":"))
        calls, shape = make_calls(ft, hdim, seqlen, bool(causal))
        for name, (fn, flops) in calls.items():
            ev = gpu_bench.time_ms(fn, 20) * 1e3
            kt, names = kernel_times(fn)
            hu = host_us(fn)
            rows.append(dict(cell=cell, shape=shape, call=name, event_us=ev, kernel_us=kt, host_us=hu,
                             kernels=names, tflops=flops / ev / 1e6))
            ks = ", ".join(f"{n.split('<')[0].split('(')[0]} {t:.0f}" for n, t in names.items())
            print(f"{shape:34s} {name:14s} {ev:9.1f} {kt:10.1f} {ev - kt:8.1f} {hu:8.1f}  {ks}", flush=True)
        del calls
        torch.cuda.empty_cache()
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--time", action="store_true", help="also time each call (not under ncu)")
    ap.add_argument("--peers", action="store_true", help="also cuda-sm90 by name and torch's cuDNN backend")
    ap.add_argument("--breakdown", action="store_true", help="kernel time vs the rest, for each of --cells")
    ap.add_argument("--cells", default="128:512:0,128:512:1,64:512:0,256:512:0,128:4096:0",
                    help="hdim:seqlen:causal, comma-separated (with --breakdown)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ft = gpu_bench.FlashTile(gpu_bench.find_lib(args.lib))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        if args.breakdown:
            breakdown(ft, args.cells.split(","), args.json)
            return
        calls, shape = make_calls(ft, args.hdim, args.seqlen, args.causal, args.peers)
        for name, (fn, flops) in calls.items():
            try:
                fn()
            except RuntimeError as e:  # a kernel this build left out (FLASHTILE_CUDA_KERNELS): profile the rest
                print(f"{name}: skipped ({str(e).splitlines()[0]})")
                continue
            torch.cuda.synchronize()
            if args.time:
                ms = gpu_bench.time_ms(fn, 20)
                print(f"{name:14s} {shape}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
