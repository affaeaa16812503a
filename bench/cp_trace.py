#!/usr/bin/env python3
"""Where the ring's exposed time goes (issue 15): the GPU kernels of one ring call and of the same call without
transfers (cp_bench.py's "compute"), from torch.profiler's CUDA activity (CUPTI), on every rank.

    torchrun --nproc-per-node 2 bench/cp_trace.py --tokens 65536 --out OUT/cp_trace.md
    python3 bench/cp_trace.py --plot OUT/cp_trace.md        (draws the table: OUT/cp_trace.png)

Per cell and rank: the attention kernels' summed time (FlashTile's fwd/bwd kernels and their helpers), the NCCL
kernels' time, the part of the NCCL time during which an attention kernel ran, and the call's span (first kernel
start to last kernel end). If the ring's attention kernels take longer than the same kernels without transfers, the
exposed time is interference (the transfer's kernels hold SMs or memory bandwidth the attention kernels wait for),
not a transfer left un-overlapped.
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import flashtile.distributed as ftd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cp_bench import no_transfers, step  # noqa: E402  the same call and the same transfer-free variant


def kernels_of(prof):
    """[(name, start_us, end_us)] of the GPU kernels in the trace."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            out.append((e.name, e.time_range.start, e.time_range.end))
    return out


def overlap_us(a, b):
    """Total length of the intersection of two lists of intervals (each list's own intervals may overlap)."""
    def merged(xs):
        xs = sorted(xs)
        out = []
        for s, e in xs:
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    total, ma, mb = 0, merged(a), merged(b)
    i = j = 0
    while i < len(ma) and j < len(mb):
        lo, hi = max(ma[i][0], mb[j][0]), min(ma[i][1], mb[j][1])
        total += max(0, hi - lo)
        if ma[i][1] < mb[j][1]:
            i += 1
        else:
            j += 1
    return total


def summary(ks):
    nccl = [(s, e) for n, s, e in ks if "nccl" in n.lower()]
    attn = [(s, e) for n, s, e in ks if "nccl" not in n.lower() and ("fwd_kernel" in n or "bwd_kernel" in n)]
    other = [(s, e) for n, s, e in ks if "nccl" not in n.lower() and not ("fwd_kernel" in n or "bwd_kernel" in n)]
    span = (max(e for _, _, e in ks) - min(s for _, s, _ in ks)) if ks else 0
    return dict(attn_ms=sum(e - s for s, e in attn) / 1e3, attn_n=len(attn),
                nccl_ms=sum(e - s for s, e in nccl) / 1e3, nccl_n=len(nccl),
                nccl_under_attn_ms=overlap_us(nccl, attn) / 1e3,
                other_ms=sum(e - s for s, e in other) / 1e3, span_ms=span / 1e3)


def trace(fn, reps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    dist.barrier(device_ids=[torch.cuda.current_device()])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            dist.barrier(device_ids=[torch.cuda.current_device()])
            fn()
        torch.cuda.synchronize()
    s = summary(kernels_of(prof))
    return {k: (v / reps if k.endswith("_ms") or k.endswith("_n") else v) for k, v in s.items()}


def plot(md):
    """Per cell and rank: how much longer the ring's attention kernels ran than without transfers, beside the NCCL
    kernels' time and the ring's span minus the compute span."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in open(md)
            if line.startswith("| ") and not line.startswith("| tokens")]
    labels = [f"{int(r[0]) // 1024}k {'causal' if r[1] == 'True' else 'full'} {r[2]} r{r[3]}" for r in rows]
    slower = [float(r[8]) for r in rows]
    nccl = [float(r[9]) for r in rows]
    exposed = [float(r[4]) - float(r[5]) for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    w = 0.27
    ax.bar([i - w for i in x], exposed, w, label="ring span - compute span")
    ax.bar(list(x), slower, w, label="attention kernels slower by")
    ax.bar([i + w for i in x], nccl, w, label="NCCL kernels (transfer time)")
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("ms per call")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend()
    ax.set_title("Ring on 2 GPUs: exposed time against the attention kernels' slowdown (torch.profiler)")
    fig.tight_layout()
    out = md[:-3] + ".png" if md.endswith(".md") else md + ".png"
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", help="draw a table this script wrote and exit")
    ap.add_argument("--tokens", default="65536")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="cp_trace.md")
    a = ap.parse_args()
    if a.plot:
        return plot(a.plot)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    lines = []
    for tokens in [int(t) for t in a.tokens.split(",")]:
        for causal in (True, False):
            for mode in ("fwd", "fwd_bwd"):
                g = torch.Generator(device=dev).manual_seed(1000 * rank + tokens)
                q, k, v, dout = (torch.randn((1, tokens, a.heads, a.hdim), generator=g, device=dev,
                                             dtype=torch.bfloat16) for _ in range(4))
                q, k, v = (x.requires_grad_(mode == "fwd_bwd") for x in (q, k, v))
                kw = dict(causal=causal, layout="zigzag" if causal else "contiguous", strategy="ring")
                fn = lambda q, k, v: ftd.ring_flash_attn_func(q, k, v, **kw)  # noqa: E731
                ring = trace(step(fn, q, k, v, dout, mode), a.reps)
                with no_transfers():
                    comp = trace(step(fn, q, k, v, dout, mode), a.reps)
                got = [None] * world
                dist.all_gather_object(got, (rank, ring, comp))
                for r, ri, co in got:
                    lines.append(f"| {tokens} | {causal} | {mode} | {r} | {ri['span_ms']:.2f} | {co['span_ms']:.2f} | "
                                 f"{ri['attn_ms']:.2f} | {co['attn_ms']:.2f} | {ri['attn_ms'] - co['attn_ms']:+.2f} | "
                                 f"{ri['nccl_ms']:.2f} | {ri['nccl_under_attn_ms']:.2f} | {ri['other_ms']:.2f} | "
                                 f"{co['other_ms']:.2f} |")
    if rank == 0:
        head = ["# Ring kernels with and without transfers (torch.profiler, CUDA activity)", "",
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                f"{torch.cuda.get_device_name()} x {world}, torch {torch.__version__}, bf16, {a.heads} heads, hdim "
                f"{a.hdim}, mean of {a.reps} calls per figure; command: `torchrun --nproc-per-node {world} "
                f"bench/cp_trace.py --tokens {a.tokens}`. ms per call.", "",
                "| tokens/GPU | causal | mode | rank | ring span | compute span | ring attn kernels | compute attn "
                "kernels | attn slower by | NCCL kernels | NCCL under attn | ring other kernels | compute other |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        text = "\n".join(head + lines) + "\n"
        print(text)
        with open(a.out, "w") as f:
            f.write(text)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
