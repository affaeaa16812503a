#!/usr/bin/env python3
"""FlashTile's CUDA backend against PyTorch's math SDPA in float64 (the same inputs upcast), forward and
backward, with fresh random inputs and NaN-poisoned outputs. Tolerance as in the C++ tests: the error of
FlashTile must stay within 2x the error of torch's math SDPA run in the inputs' precision, plus 8 eps of the
largest reference value. Causal masks are bottom-right aligned (FlashTile's convention), passed to torch as
an explicit boolean mask; cases where a row sees no key are left to the C++ tests (torch gives NaN there).

    python3 tests/gpu/test_torch_parity.py --lib build/gpu/src/libflashtile_capi.so
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from gpu_bench import FlashTile, find_lib  # noqa: E402

EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}

CASES = [  # b, sq, sk, hq, hkv, d, dv, causal, dtype
    (2, 128, 128, 4, 4, 64, 64, False, torch.bfloat16),
    (1, 1000, 1000, 8, 2, 128, 128, True, torch.float16),
    (2, 65, 300, 4, 1, 96, 96, True, torch.bfloat16),
    (1, 300, 300, 2, 2, 256, 256, True, torch.float16),
    (3, 17, 17, 6, 3, 32, 32, False, torch.float16),
    (1, 513, 777, 4, 2, 160, 160, False, torch.bfloat16),
    (1, 200, 1000, 8, 1, 192, 192, True, torch.bfloat16),
    (2, 127, 129, 2, 1, 224, 224, False, torch.float16),
    (1, 64, 2048, 16, 16, 128, 128, False, torch.bfloat16),
    (1, 333, 333, 4, 4, 72, 72, True, torch.bfloat16),
    (1, 100, 150, 4, 2, 64, 128, True, torch.float16),  # Dv != D
    (1, 4096, 4096, 2, 1, 128, 128, True, torch.bfloat16),
]


def sdpa_math(q, k, v, causal, scale):
    """q [B,Sq,Hq,D] etc.; returns out [B,Sq,Hq,Dv] from torch's math SDPA."""
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + (sk - sq)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                           scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def grads(q, k, v, dout, causal, scale):
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    o = sdpa_math(q, k, v, causal, scale)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), dout)
    return o.detach(), dq, dk, dv


def check(name, got, low, ref, dtype, mag=None):
    got, low, ref = got.double(), low.double(), ref.double()
    if torch.isnan(got).any():
        return f"{name}: NaN in FlashTile's output"
    err, err_low = (got - ref).abs().max().item(), (low - ref).abs().max().item()
    m = max(ref.abs().max().item(), mag or 0.0)
    bound = 2 * err_low + 8 * EPS[dtype] * m
    return None if err <= bound else f"{name}: err {err:.3g} > bound {bound:.3g} (torch {dtype} err {err_low:.3g})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FLASHTILE_CAPI"))
    args = ap.parse_args()
    ft = FlashTile(find_lib(args.lib))
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    passed = 0
    for b, sq, sk, hq, hkv, d, dv, causal, dtype in CASES:
        name = f"b{b}_q{sq}_k{sk}_h{hq}x{hkv}_d{d}_dv{dv}_{'causal' if causal else 'full'}_{str(dtype)[6:]}"
        dev = "cuda"
        q = torch.randn(b, sq, hq, d, device=dev, dtype=dtype)
        k = torch.randn(b, sk, hkv, d, device=dev, dtype=dtype)
        v = torch.randn(b, sk, hkv, dv, device=dev, dtype=dtype)
        do = torch.randn(b, sq, hq, dv, device=dev, dtype=dtype)
        out = torch.full((b, sq, hq, dv), float("nan"), device=dev, dtype=dtype)
        lse = torch.full((b, hq, sq), float("nan"), device=dev, dtype=torch.float32)
        dq, dk, dvv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        scale = d ** -0.5
        ft.forward(q, k, v, out, lse, causal=causal)
        ft.backward(q, k, v, out, do, lse, dq, dk, dvv, causal=causal)
        torch.cuda.synchronize()
        ref = grads(*(x.double() for x in (q, k, v, do)), causal, scale)
        low = grads(q, k, v, do, causal, scale)
        mag = max(x.abs().max().item() for x in ref[1:])
        errs = [check("out", out, low[0], ref[0], dtype), check("dq", dq, low[1], ref[1], dtype, mag),
                check("dk", dk, low[2], ref[2], dtype, mag), check("dv", dvv, low[3], ref[3], dtype, mag)]
        errs = [e for e in errs if e]
        print(f"{'ok  ' if not errs else 'FAIL'} {name} {'; '.join(errs)}", flush=True)
        passed += not errs
    print(f"parity: {passed}/{len(CASES)} cases passed")
    return 0 if passed == len(CASES) else 1


if __name__ == "__main__":
    sys.exit(main())
