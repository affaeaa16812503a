#!/usr/bin/env python3
"""Context parallelism on GPUs (issue 15): flashtile.distributed's ring and all-to-all, forward and backward, on
CUDA tensors over NCCL, each rank's shard against the float64 reference on the whole sequence. Run by
scripts/gpu_check.sh (step cp) on a machine with two or more GPUs:

    torchrun --nproc-per-node 2 tests/gpu/cp_check.py

Tolerance (the rule of tests/python/_dist_worker.py in 16 bits): each of out, lse, dq, dk, dv may differ from the
float64 reference by at most 4 times the single-GPU flashtile call's error on the whole tensor (same dtype, same
inputs) plus 2 units of the dtype's last place at the tensor's largest value (the ring rounds each step's partial
result to the dtype before the float32 merge). Exit status: the number of failed cases (the same on every rank).
"""
import datetime
import os
import sys
import zlib

import torch
import torch.distributed as dist

import flashtile
import flashtile.distributed as ftd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from test_variants import reference  # noqa: E402  the float64 definition (one sequence, differentiable)

EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
S, D = 2048, 128
# name: (strategy, layout, Hq, Hkv, mask kwargs)
CASES = {
    "ring-zigzag-causal": ("ring", "zigzag", 8, 8, dict(causal=True)),
    "ring-contiguous-full": ("ring", "contiguous", 8, 8, dict()),
    "ring-zigzag-causal-gqa8x2": ("ring", "zigzag", 8, 2, dict(causal=True)),
    # The steps with a transfer in flight on the device's SMs less 16 (cuda-sm90's persistent forward): the same
    # results. sm_margin goes to the ring only, not to the single-GPU and float64 references.
    "ring-zigzag-causal-sm-margin16": ("ring", "zigzag", 8, 8, dict(causal=True, sm_margin=16)),
    "ring-zigzag-window-softcap": ("ring", "zigzag", 8, 8, dict(causal=True, window_size=(700, 0), softcap=20.0)),
    "a2a-zigzag-causal": ("all_to_all", "zigzag", 8, 8, dict(causal=True)),
    "a2a-contiguous-full-gqa8x2": ("all_to_all", "contiguous", 8, 2, dict()),
}


def whole_inputs(seed, hq, hkv, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda h: torch.randn(1, S, h, D, generator=g).to(device=device, dtype=dtype)
    return mk(hq), mk(hkv), mk(hkv), mk(hq)


def single_gpu(q, k, v, do, kw):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True, **kw)
    out.backward(do)
    return out, lse, q.grad, k.grad, v.grad


def reference64(q, k, v, do, kw):
    q, k, v, do = (x[0].detach().cpu().double().requires_grad_(True) for x in (q, k, v, do))
    kw = {("window" if key == "window_size" else key): val for key, val in kw.items()}
    out, lse = reference(q, k, v, **kw)
    out.backward(do.detach())
    return out[None], lse[None], q.grad[None], k.grad[None], v.grad[None]


def run_case(name, dtype, group, rank, world):
    strategy, layout, hq, hkv, kw = CASES[name]
    margin = kw.get("sm_margin", 0) if strategy == "ring" else 0
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    q, k, v, do = whole_inputs(zlib.crc32(name.encode()) + (dtype == torch.float16), hq, hkv, dtype, device)
    shard = lambda x: ftd.shard(x, group=group, layout=layout).contiguous()
    ql, kl, vl = (shard(x).requires_grad_(True) for x in (q, k, v))
    out, lse = ftd.ring_flash_attn_func(ql, kl, vl, group=group, return_lse=True, layout=layout, strategy=strategy,
                                        **kw)
    kw = {key: val for key, val in kw.items() if key != "sm_margin"}
    out.backward(shard(do))
    report = ftd.last_report()
    got = [ftd.unshard(x.detach(), group=group, layout=layout, dim=d)
           for x, d in ((out, 1), (lse, 2), (ql.grad, 1), (kl.grad, 1), (vl.grad, 1))]
    single = single_gpu(q, k, v, do, kw)
    ref = reference64(q, k, v, do, kw)
    worst = []
    for what, g_, s_, r_ in zip(("out", "lse", "dq", "dk", "dv"), got, single, ref):
        g_, s_ = g_.detach().cpu().double(), s_.detach().cpu().double()
        r_ = r_.detach()
        ok = torch.isfinite(r_)
        scale = r_[ok].abs().max().item()
        base = (s_ - r_)[ok].abs().max().item()
        err = (g_ - r_)[ok].abs().max().item()
        bound = 4 * base + 2 * EPS[dtype] * scale * (1 if what != "lse" else 0) + (1e-5 if what == "lse" else 0)
        worst.append((what, err, base, bound, err <= bound and torch.equal(torch.isfinite(g_), ok)))
    passed = all(w[-1] for w in worst) and report.strategy == strategy and report.sm_margin == margin
    line = " ".join(f"{w}={e:.2e}/{b:.2e}(single {s:.2e})" for w, e, s, b, _ in worst)
    return passed, (f"{'PASS' if passed else 'FAIL'} {name} {str(dtype)[6:]} rank {rank}: {line} "
                    f"[{report.strategy}, {report.calls} calls, {report.steps_skipped} steps skipped]")


def main():
    cuda = torch.cuda.is_available()  # without GPUs (a check of this script): CPU tensors over gloo
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=180))
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    failed = 0
    for dtype in (torch.bfloat16, torch.float16):
        for name in CASES:
            try:
                ok, line = run_case(name, dtype, None, rank, world)
            except Exception as e:  # reported, and counted on every rank below
                ok, line = False, f"FAIL {name} {str(dtype)[6:]} rank {rank}: {type(e).__name__}: {e}"
            failed += 0 if ok else 1
            print(line, flush=True)
    total = torch.tensor([failed], device="cuda" if cuda else "cpu")
    dist.all_reduce(total)
    if rank == 0:
        print(f"CP CHECK: world {world}, {2 * len(CASES)} cases per rank, {int(total.item())} failures (all ranks)")
    dist.destroy_process_group()
    sys.exit(min(int(total.item()), 100))


if __name__ == "__main__":
    main()
