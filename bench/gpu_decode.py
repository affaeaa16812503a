#!/usr/bin/env python3
"""Decode against a KV cache on the GPU (forward_kvcache, issue 14): GB/s of K+V read, FlashTile's cuda-sm80 decode
path against torch SDPA's flash, efficient and cuDNN backends, in one process. The GPU twin of bench/decode.py.

Cells (issue 14): GQA 32 query / 8 KV heads, head dim 128, bf16, causal (bottom-right over the new tokens); Sq = 1
(decode) and 16 (speculative decoding); batch 1 / 8 / 64; 4k / 32k / 128k keys; contiguous caches and paged ones
(pages of 64 and of 16 rows, shuffled; --pages). FlashTile is called through libflashtile_capi.so (gpu_bench.py's
ctypes class, ft_forward_kvcache) on torch tensors: cache_seqlens = keys - Sq and Sq new keys appended in place, so
the call reads `keys` keys per sequence. The peers get the same values as (B, H, L, D) views of the contiguous cache
with enable_gqa=True (and causal_lower_right for Sq > 1); SDPA has no paged form, so a paged cell's peers are those
of the contiguous cell with the same shape (the same values and the same work).

GB/s counts the bytes of K and V the call must read: B · L · Hkv · (D + Dv) · 2; % is of the H200's 4.8 TB/s.
Timing: CUDA events around each call, 5 warm-up calls, median of --reps (>= 20). FlashTile is timed on its C ABI
call with the arguments built once (gpu_bench.py kvcache_call). Its eager call reads the device-side index check's
verdict back (written by the check kernel, or the decode kernel's first CTA after a grid-wide check, to pinned
memory; the host waits for it while the decode runs; a CUDA graph replay skips it), which the events include; 'async'
is the call with async_index_check; the "device" column is the median over calls of the device time of the call's own
kernels (prepare, or memset + check; decode, which appends and merges the splits; a combine kernel in builds before
2026-12-07: the first one's start to the last one's end)
from torch.profiler (CUPTI), the figure a graph replay approaches; 'host µs' is the host time per call of 50 calls
issued without waiting.

    python3 bench/gpu_decode.py --lib build/gpu/src/libflashtile_capi.so --out bench/results/h200-decode

--in-order adds each paged cell again with its pages in order (against the shuffled one: the cost of the pages'
scatter, e.g. TLB reach, apart from the gather itself).

writes OUT.json, OUT.md and OUT.png (GB/s per cell, the HBM peak as a line).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpu_bench import FlashTile, find_lib, time_ms  # noqa: E402  the ctypes binding of the C ABI, CUDA-event timing
from gpu_profile import cuda_events, kernel_times  # noqa: E402
from hbm_peaks import hbm_peak_gbs  # noqa: E402  the table's % and the plot's lines: the GPU the run was on

HQ, HKV, D = 32, 8, 128


PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
         "cudnn": SDPBackend.CUDNN_ATTENTION}
# Device-side work of one FlashTile call (the read-back's D2H copy is not the call's work).
FT_OPS = ("prepare_kernel", "check_kernel", "decode_kernel", "decode_wg_kernel", "combine_kernel", "Memset")
FT_FIRST_OPS = ("prepare_kernel", "Memset")  # a small call's one-CTA check, or a large call's reset


def cells(quick, in_order=False, pages=(64, 16)):
    """The issue's cells (a paged cache with each page size of `pages`); in_order adds, after each paged cell, the same
    cell with its pages in order (block_table row b = b·L/page ...): against the shuffled cell, what the page
    gather costs apart from the pages' scatter (TLB reach, DRAM locality)."""
    out = []
    for sq in (1, 16):
        for batch in (1, 8, 64):
            for keys in (4096, 32768, 131072):
                if quick and (keys > 32768 or batch > 8):
                    continue
                for page in (0, *pages):
                    out.append({"sq": sq, "batch": batch, "keys": keys, "page": page})
                    if page and in_order:
                        out.append({"sq": sq, "batch": batch, "keys": keys, "page": page, "in_order": True})
    return out


def cache_name(r):
    if not r["page"]:
        return "contiguous"
    return f"paged {r['page']}" + (" in order" if r.get("in_order") else "")


def host_us(fn, calls=50):
    """Host microseconds per call: `calls` calls issued back to back without waiting (the launch queue absorbs
    them), timed on the host clock; an eager loop is host-bound when this exceeds the call's device time."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def peer_device_ms(fn, reps):
    """A peer's device time per call (ms): its kernels' and memsets' durations over `reps` back-to-back calls
    (gpu_profile.py kernel_times; torch's kernels of one call run one after the other); None without a profiler."""
    try:
        total_us = kernel_times(fn, reps)[0]
        return total_us / 1e3 if total_us > 0 else None
    except Exception as e:
        print(f"profiler unavailable: {e}", file=sys.stderr)
        return None


def device_ms(fn, reps):
    """Median over `reps` calls of the device time of FlashTile's call: from the start of its first kernel to the end
    of its last (torch.profiler, CUPTI), gaps included; kernels overlap under programmatic dependent launch, so their
    durations are not summed. None without a profiler."""
    try:
        evs = cuda_events(fn, reps, warmup=0)
        calls = []
        for e in evs:
            if any(first in e.name for first in FT_FIRST_OPS):  # every call starts with one of them
                calls.append([e.time_range.start, e.time_range.end])
            elif calls and any(op in e.name for op in FT_OPS):
                calls[-1][1] = max(calls[-1][1], e.time_range.end)
        per_call = [(end - start) / 1e3 for start, end in calls]
        return statistics.median(per_call) if len(per_call) >= reps // 2 else None
    except Exception as e:  # no CUPTI: the events' figure stands alone
        print(f"profiler unavailable: {e}", file=sys.stderr)
        return None


def bench_cell(ft, cell, reps, peer_cache, backend="auto"):
    b, sq, keys, page = cell["batch"], cell["sq"], cell["keys"], cell["page"]
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(keys + 7 * b + sq)
    q = torch.randn(b, sq, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
    out = torch.empty_like(q)
    lens = torch.full((b,), keys - sq, dtype=torch.int32, device=dev)  # sq new keys appended: `keys` keys read
    if page:
        pages = b * keys // page
        k = torch.randn(pages, page, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(pages, page, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        order = torch.arange(pages, device=dev) if cell.get("in_order") else torch.randperm(pages, device=dev, generator=g)
        table = order.to(torch.int32).reshape(b, keys // page)
    else:
        k = torch.randn(b, keys, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(b, keys, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        table = None
    k_new = torch.randn(b, sq, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
    v_new = torch.randn(b, sq, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
    kv_bytes = b * keys * HKV * 2 * D * 2

    def flashtile_call(async_check=False):
        return ft.forward_kvcache(q, k, v, out, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                                  causal=True, backend=backend, strict=True, async_index_check=async_check)

    report = flashtile_call()
    row = {**cell, "kv_bytes": kv_bytes, "report": report}
    # The timed calls: the C ABI call with its arguments built once (bench/gpu_bench.py kvcache_call), as a C++
    # caller's decode loop makes it; the ctypes structures a Python wrapper would build per call are not FlashTile's.
    eager = ft.kvcache_call(q, k, v, out, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                            causal=True, backend=backend, strict=True)
    lazy = ft.kvcache_call(q, k, v, out, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                           causal=True, backend=backend, strict=True, async_index_check=True)
    row["flashtile_ms"] = time_ms(eager, reps)
    row["flashtile_device_ms"] = device_ms(eager, reps)
    row["flashtile_async_ms"] = time_ms(lazy, reps)  # no read-back, no wait
    row["flashtile_host_us"] = host_us(lazy)
    # Ten calls back to back inside one pair of events, per call: the steady state of a decode loop, without the
    # start from an idle GPU that each single-call pair pays.
    row["flashtile_async10_ms"] = time_ms(lambda: [lazy() for _ in range(10)], reps) / 10
    shape = (sq, b, keys)
    if not page:
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        mask = causal_lower_right(sq, keys) if sq > 1 else None
        peers = {}
        for name, backend in PEERS.items():
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
                    fn()
                    peers[f"{name}_ms"] = time_ms(fn, reps)
                    peers[f"{name}_device_ms"] = peer_device_ms(fn, reps)
                    peers[f"{name}10_ms"] = time_ms(lambda: [fn() for _ in range(10)], reps) / 10
                    peers[f"{name}_host_us"] = host_us(fn)
            except Exception as e:  # a peer that cannot run this shape is reported, not fatal
                peers[f"{name}_error"] = str(e).split("\n")[0][:160]
        peer_cache[shape] = peers
    row.update(peer_cache.get(shape, {}))
    for key in list(row):
        if key.endswith("_ms") and row[key]:
            row[key[:-3] + "_gbs"] = kv_bytes / (row[key] * 1e-3) / 1e9
    del q, k, v, out, k_new, v_new, table
    torch.cuda.empty_cache()
    return row


def kernel_of(report):
    """The kernel that ran, from the report's first line: "ran <backend> / <kernel> [...]"."""
    words = report.split()
    return words[3] if len(words) > 3 and words[0] == "ran" else "?"


def splits_of(report):
    return next((w.split("=")[1] for w in report.split() if w.startswith("splits=")), "?")


def fmt(x):
    return f"{x:.0f}" if x else "—"


def markdown(meta, rows):
    peak = hbm_peak_gbs(meta["gpu"])
    peak_text = f"{peak:.0f} GB/s HBM peak" if peak else "HBM peak (not known for this GPU: no %)"
    lines = [f"# GPU decode against a KV cache on {meta['gpu']} ({meta['date']})", "",
             f"torch {meta['torch']} (CUDA {meta['cuda']}, cuDNN {meta['cudnn']}). Command: `{meta['command']}` "
             f"(commit {meta['commit']}).", "",
             "GQA 32/8, head dim 128, bf16, causal over the Sq new tokens (appended in place by FlashTile's call). "
             "GB/s = bytes of K+V the call reads / median time over "
             f"{meta['reps']} calls after 5 warm-up calls, CUDA events; % = of the {peak_text}. "
             "FlashTile is timed on its C ABI call with the arguments built once (what a C++ decode loop pays). "
             "Its events include the index check's read-back (the verdict, which the check kernel, or the decode "
             "kernel's first CTA after a grid-wide check, writes to mapped pinned memory; the host waits for it while the decode runs); 'async' times the same call with "
             "async_index_check (no read-back); 'device' is the median device time of its kernels, the first one's start to "
             "the last one's end (torch.profiler), "
             "what a CUDA-graph replay approaches; cuDNN's 'device' is its kernels' durations per call over back-to-back "
             "calls (torch.profiler), the same measure for the peer. 'host µs' is the host time per call of 50 calls issued without "
             "waiting (FlashTile async, and torch flash): above the device time, an eager loop is host-bound. "
             "torch: scaled_dot_product_attention with enable_gqa=True on (B, H, L, D) "
             "views of the contiguous cache (paged cells: the contiguous cell's peers, same values and work).", "",
             "| Sq | batch | keys | cache | FlashTile GB/s (events) | FlashTile GB/s (async) | FlashTile GB/s (device) "
             "| % peak (device) | flash GB/s | efficient GB/s | cuDNN GB/s | cuDNN GB/s (device) | events ÷ cuDNN "
             "| device ÷ cuDNN device | events ÷ flash | host µs FlashTile | host µs flash | splits | kernel |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        dev, ev = r.get("flashtile_device_gbs"), r.get("flashtile_gbs")
        ratio = lambda x, peer: f"{x / r[peer]:.2f}×" if x and r.get(peer) else "—"
        host = lambda key: f"{r[key]:.0f}" if r.get(key) else "—"
        lines.append(
            f"| {r['sq']} | {r['batch']} | {r['keys']} | {cache_name(r)} "
            f"| {fmt(ev)} | {fmt(r.get('flashtile_async_gbs'))} | {fmt(dev)} "
            f"| {f'{100 * dev / peak:.0f} %' if dev and peak else '—'} "
            f"| {fmt(r.get('flash_gbs'))} | {fmt(r.get('efficient_gbs'))} | {fmt(r.get('cudnn_gbs'))} "
            f"| {fmt(r.get('cudnn_device_gbs'))} | {ratio(ev, 'cudnn_gbs')} | {ratio(dev, 'cudnn_device_gbs')} "
            f"| {ratio(ev, 'flash_gbs')} "
            f"| {host('flashtile_host_us')} | {host('flash_host_us')} | {splits_of(r['report'])} | {kernel_of(r['report'])} |")
    errors = sorted({f"{k[:-6]}: {v}" for r in rows for k, v in r.items() if k.endswith("_error")})
    if errors:
        lines += ["", "Peers that refused a cell:", ""] + [f"- {e}" for e in errors]
    lines += ["", "FlashTile's dispatch report of the last cell:", "", "```", rows[-1]["report"].strip(), "```"]
    return "\n".join(lines) + "\n"


def plot(meta, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"Sq{r['sq']} B{r['batch']}\n{r['keys'] // 1024}k" + (f" p{r['page']}" if r["page"] else "")
              + (" ord" if r.get("in_order") else "")
              for r in rows]
    x = list(range(len(rows)))
    series = [("flashtile_device_gbs", "FlashTile (device)", "C0"),
              ("flashtile_async_gbs", "FlashTile (events, async_index_check)", "C4"),
              ("flashtile_gbs", "FlashTile (events, with read-back)", "C9"),
              ("flash_gbs", "torch SDPA flash", "C1"), ("cudnn_gbs", "torch SDPA cuDNN", "C3"),
              ("efficient_gbs", "torch SDPA efficient", "C2")]
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(10, 0.6 * len(rows)), 5))
    for i, (key, label, colour) in enumerate(series):
        ax.bar([xi - 0.4 + (i + 0.5) * w for xi in x], [r.get(key) or 0 for r in rows], w, label=label, color=colour)
    peak = hbm_peak_gbs(meta["gpu"])
    if peak:
        ax.axhline(peak, color="k", ls="--", lw=1, label=f"HBM peak {peak:.0f} GB/s")
        ax.axhline(0.9 * peak, color="k", ls=":", lw=1, label="90 % of it (target, batch ≥ 8, ≥ 32k keys)")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("GB/s of K+V read")
    ax.set_title(f"KV-cache decode, GQA 32/8, hd128 bf16 — {meta['gpu']}, {meta['date']}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None, help="libflashtile_capi.so (default: build/gpu, build/release, build)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="batch <= 8 and <= 32k keys only")
    ap.add_argument("--in-order", action="store_true", help="also each paged cell with its pages in order")
    ap.add_argument("--pages", default="64,16", help="page sizes of the paged cells, comma-separated")
    ap.add_argument("--out", default=None, help="path stem for .json, .md and .png")
    ap.add_argument("--backend", default="auto", help="FlashTile's backend (auto: cuda-sm90's wgmma kernel for the "
                    "64-row tiles on Hopper, cuda-sm80's mma.sync kernel otherwise)")
    ap.add_argument("--sq", default="1,16", help="query tokens per call, comma-separated")
    ap.add_argument("--rewrite", default=None, metavar="JSON", help="write a run's table and plot again from its JSON")
    args = ap.parse_args()
    if args.rewrite:
        with open(args.rewrite) as f:
            run = json.load(f)
        stem = os.path.splitext(args.rewrite)[0]
        with open(stem + ".md", "w") as f:
            f.write(markdown(run["meta"], run["rows"]))
        plot(run["meta"], run["rows"], stem + ".png")
        return
    if args.reps < 20:
        sys.exit("--reps: at least 20")
    ft = FlashTile(find_lib(args.lib))
    commit = os.environ.get("FT_COMMIT") or subprocess.run(  # FT_COMMIT: a copy without git history (the GPU host)
        ["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "commit": commit, "reps": args.reps,
            "command": "python3 bench/gpu_decode.py " + " ".join(sys.argv[1:])}
    start = time.time()
    rows, peer_cache = [], {}
    for cell in cells(args.quick, args.in_order, tuple(int(x) for x in args.pages.split(","))):
        if str(cell["sq"]) not in args.sq.split(","):
            continue
        row = bench_cell(ft, cell, args.reps, peer_cache, args.backend)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "report"}), flush=True)
    meta["seconds"] = round(time.time() - start, 1)
    md = markdown(meta, rows)
    print(md)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(md)
        plot(meta, rows, args.out + ".png")


if __name__ == "__main__":
    main()
