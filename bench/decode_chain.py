#!/usr/bin/env python3
"""Where a decode call's device time goes: FlashTile's kernel chain (the index check and the decode, which appends and, since 2026-12-07, merges the splits; a combine kernel before)
beside cuDNN's kernels, on the cells of bench/gpu_decode.py, from torch.profiler (CUPTI).

For each cell, 40 calls back to back (FlashTile with async_index_check, the loop a CUDA graph or a serving stack
runs): per kernel of a call, the median start offset from the call's first kernel and the median duration; the
period (median distance between successive calls' first kernels: the device time per step of the loop); for cuDNN
the same over its kernels.

    python3 bench/decode_chain.py --lib build/gpu/src/libflashtile_capi.so --cells 8:32768:0,8:32768:64

A cell is batch:keys:page (Sq = 1; --sq for 16); 8:32768:64h stores the caches heads-major (make_cell). --only ft|cudnn with --calls N runs N calls of one side without the
profiler, inside an NVTX range "timed", for ncu (`ncu --nvtx --nvtx-include timed/ ... --only ft`).

--libs A=a.so,B=b.so is an A/B of builds in one process (A=a.so@cuda-sm80: that build on that backend; default auto): per cell, every build's chain and cuDNN's in --rounds
rounds in an order drawn per round (bench/ab_common.py), the median period and decode-kernel time of each;
--splits-sweep 2,4,8 adds the first build at those num_splits. bench/plot_decode_ab.py draws such runs' printed output.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ab_common import shuffled_rounds  # noqa: E402
from gpu_bench import FlashTile, find_lib  # noqa: E402
from gpu_decode import D, FT_FIRST_OPS, HKV, HQ  # noqa: E402
from gpu_profile import cuda_events  # noqa: E402


def make_cell(ft, batch, keys, page, sq, splits=0, peer=True, backend="auto", layout=""):
    """FlashTile's call on a fresh cell, cuDNN's on its contiguous twin (None without `peer`), and K+V bytes.
    layout "h": every cache (FlashTile's and cuDNN's twin) is stored head by head, (slots, Hkv, rows, D) seen as
    (slots, rows, Hkv, D) through its strides, so that one KV head's keys are contiguous in memory; "o": a paged
    cache's block table holds the pages in order (shuffled otherwise)."""
    g = torch.Generator(device="cuda").manual_seed(keys + 7 * batch + sq)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=g)

    def cache(slots, rows):
        if "h" in layout:
            return torch.randn(slots, HKV, rows, D, **bf).transpose(1, 2)
        return torch.randn(slots, rows, HKV, D, **bf)
    q = torch.randn(batch, sq, HQ, D, **bf)
    out = torch.empty_like(q)
    lens = torch.full((batch,), keys - sq, dtype=torch.int32, device="cuda")
    if page:
        pages = batch * keys // page
        k, v = cache(pages, page), cache(pages, page)
        order = torch.arange(pages, device="cuda") if "o" in layout else torch.randperm(pages, device="cuda", generator=g)
        table = order.to(torch.int32).reshape(batch, keys // page)
    else:
        k, v = cache(batch, keys), cache(batch, keys)
        table = None
    k_new, v_new = torch.randn(batch, sq, HKV, D, **bf), torch.randn(batch, sq, HKV, D, **bf)
    ft_call = ft.kvcache_call(q, k, v, out, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                              num_splits=splits, causal=True, backend=backend, strict=True,
                              async_index_check=True)
    kv_bytes = batch * keys * HKV * 2 * D * 2
    if not peer:
        return ft_call, None, kv_bytes
    kc = cache(batch, keys) if page else k  # cuDNN has no paged form: the contiguous twin
    vc = cache(batch, keys) if page else v
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)

    def cudnn_call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    return ft_call, cudnn_call, kv_bytes


def chain(fn, calls, first):
    """Per-kernel median (offset, duration) in µs and the median period between calls, over `calls` calls."""
    evs = cuda_events(fn, calls, warmup=5)
    if first is None:  # a peer: each call starts with the kernel its first call started with
        lead = evs[0].name
        first = lambda n: n == lead
    groups = []
    for e in evs:
        if first(e.name) or not groups:
            groups.append([])
        groups[-1].append(e)
    groups = [gr for gr in groups if len(gr) == len(groups[len(groups) // 2])]
    rows = []
    for i, e in enumerate(groups[0]):
        off = statistics.median((gr[i].time_range.start - gr[0].time_range.start) for gr in groups)
        dur = statistics.median(gr[i].time_range.elapsed_us() for gr in groups)
        rows.append((e.name[:60], off, dur))
    starts = [gr[0].time_range.start for gr in groups]
    period = statistics.median(b - a for a, b in zip(starts, starts[1:]))
    span = statistics.median(max(e.time_range.end for e in gr) - gr[0].time_range.start for gr in groups)
    return rows, period, span


def parse_cell(spec):
    """batch:keys:page[flags], page 0 = contiguous; flags (make_cell's layout): h stores the caches heads-major
    (8:32768:64h), o keeps a paged cache's pages in order (8:32768:64o)."""
    batch, keys, page = spec.split(":")
    return int(batch), int(keys), int(page.rstrip("ho")), page[len(page.rstrip("ho")):]


def cell_name(batch, keys, page, layout):
    return (f"batch={batch} keys={keys} page={page or 'contiguous'}{'/heads-major' if 'h' in layout else ''}"
            f"{'/ordered' if 'o' in layout else ''}")


def ab(args):
    """The --libs A/B: per cell, the median over rounds of each call's period and of its longest kernel."""
    libs = dict(kv.split("=", 1) for kv in args.libs.split(","))
    # name=path@backend: the build's call on that backend (default auto); one library loaded once.
    backends = {name: (spec.split("@", 1) + ["auto"])[1] for name, spec in libs.items()}
    loaded = {}
    fts = {name: loaded.setdefault(spec.split("@")[0], FlashTile(spec.split("@")[0])) for name, spec in libs.items()}
    sweep = [int(x) for x in args.splits_sweep.split(",")] if args.splits_sweep else []
    ft_first = lambda n: any(f in n for f in FT_FIRST_OPS)
    for spec in args.cells.split(","):
        batch, keys, page, layout = parse_cell(spec)
        first = next(iter(fts))
        ft_call, cudnn_call, kv_bytes = make_cell(fts[first], batch, keys, page, args.sq, args.splits,
                                                  backend=backends[first], layout=layout)
        calls = {first: (ft_call, ft_first)}
        for name, ft in list(fts.items())[1:]:  # one cuDNN twin per cell, not one per build
            calls[name] = (make_cell(ft, batch, keys, page, args.sq, args.splits, peer=False,
                                     backend=backends[name], layout=layout)[0], ft_first)
        for n in sweep:
            calls[f"{first}/splits={n}"] = (make_cell(fts[first], batch, keys, page, args.sq, n, peer=False,
                                                      backend=backends[first], layout=layout)[0], ft_first)
        calls["cuDNN"] = (cudnn_call, None)

        def timer(entry):
            rows, period, _ = chain(entry[0], args.calls, entry[1])
            return period, max(d for _, _, d in rows)
        times = shuffled_rounds(calls, args.rounds, timer)
        print(f"cell: Sq={args.sq} {cell_name(batch, keys, page, layout)} (K+V {kv_bytes / 1e6:.0f} MB), {args.rounds} rounds")
        for name, ts in times.items():
            period = statistics.median(t[0] for t in ts)
            kernel = statistics.median(t[1] for t in ts)
            print(f"  {name:>20}: period {period:8.1f} µs ({kv_bytes / period / 1e3:5.0f} GB/s)  longest kernel "
                  f"{kernel:8.1f} µs ({kv_bytes / kernel / 1e3:5.0f} GB/s)  periods {' '.join(f'{t[0]:.1f}' for t in ts)}")
        del calls
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None)
    ap.add_argument("--cells", default="1:32768:0,8:32768:0,8:32768:64,8:131072:0,64:32768:0,64:32768:64")
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--only", choices=["ft", "cudnn"], default=None)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--splits", type=int, default=0, help="FlashTile's num_splits (0: its own choice)")
    ap.add_argument("--libs", default=None, help="A/B: name=libflashtile_capi.so,... (see the module doc)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--splits-sweep", default="", help="with --libs: the first build also at these num_splits")
    ap.add_argument("--backend", default="auto", help="without --libs: FlashTile's backend (strict), e.g. cuda-sm80")
    args = ap.parse_args()
    print(f"gpu: {torch.cuda.get_device_name()}")  # plot_decode_ab.py's peak line
    if args.libs:
        return ab(args)
    ft = FlashTile(find_lib(args.lib))
    for spec in args.cells.split(","):
        batch, keys, page, layout = parse_cell(spec)
        ft_call, cudnn_call, kv_bytes = make_cell(ft, batch, keys, page, args.sq, args.splits, backend=args.backend,
                                                  layout=layout)
        if args.only:
            fn = ft_call if args.only == "ft" else cudnn_call
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("timed")  # ncu --nvtx --nvtx-include timed/ : these calls' kernels only
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            continue
        print(f"cell: Sq={args.sq} {cell_name(batch, keys, page, layout)} (K+V {kv_bytes / 1e6:.0f} MB)")
        for name, fn, first in (("FlashTile", ft_call, lambda n: any(f in n for f in FT_FIRST_OPS)),
                                ("cuDNN", cudnn_call, None)):
            rows, period, span = chain(fn, args.calls, first)
            print(f"  {name}: period {period:.1f} µs ({kv_bytes / period / 1e3:.0f} GB/s), span {span:.1f} µs "
                  f"({kv_bytes / span / 1e3:.0f} GB/s)")
            for n, off, dur in rows:
                print(f"    +{off:7.1f} µs  {dur:7.1f} µs  {n}")


if __name__ == "__main__":
    main()
