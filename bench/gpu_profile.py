#!/usr/bin/env python3
"""One call of each kernel to profile under ncu: FlashTile's forward and backward and torch SDPA's flash
backend on the same tensors (bf16, one shape). Run it under ncu (scripts/gpu_check.sh's `profile` step):

    ncu --set full -k 'regex:fwd_kernel|bwd_kernel|flash_fwd|flash_bwd' python3 bench/gpu_profile.py --lib ...

Without ncu it times the same calls (median of 20) so the profiled shape's speed is on record too.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--time", action="store_true", help="also time each call (not under ncu)")
    args = ap.parse_args()
    ft = gpu_bench.FlashTile(gpu_bench.find_lib(args.lib))
    s, d = args.seqlen, args.hdim
    b, h = max(1, 16384 // s), 2048 // d
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, dout = mk(), mk(), mk(), mk()
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (qt, kt, vt))
    calls = {
        "flashtile_fwd": lambda: ft.forward(q, k, v, out, lse, causal=args.causal),
        "flashtile_bwd": lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=args.causal),
    }
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal)
        calls["flash_fwd"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        calls["flash_bwd"] = lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True)
        for name, fn in calls.items():
            fn()
            torch.cuda.synchronize()
            if args.time:
                ms = gpu_bench.time_ms(fn, 20)
                flops = 4.0 * b * h * s * s * d / (2 if args.causal else 1) * (2.5 if name.endswith("bwd") else 1)
                print(f"{name:14s} b={b} h={h} s={s} d={d} causal={int(args.causal)}: {ms:.3f} ms "
                      f"{flops / ms / 1e9:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
