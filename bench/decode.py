#!/usr/bin/env python3
"""Decode against a KV cache (forward_kvcache, issue 14): GB/s of K+V read, FlashTile against torch SDPA, in one
process, with the machine's read bandwidth measured in the same run.

Shapes (issue 14): GQA 32 query / 8 KV heads, head dim 128, bf16; Sq = 1 (decode) and 16 (speculative decoding);
batch 1 / 8; cache lengths 4k / 32k (and 128k at batch 1); contiguous caches and paged ones (pages of 16 and 64
rows, pages shuffled). FlashTile is called through libflashtile_capi.so (ctypes, ft_forward_kvcache, the C ABI over
the public API) on torch tensors; torch SDPA gets the same values in its own (B, H, L, D) layout with
enable_gqa=True (its CPU dispatch picks the kernel). torch has no paged attention: paged cells have no peer.

GB/s counts the bytes of K and V the call must read: B · L · Hkv · (D + Dv) · 2. The read bandwidth is torch.sum()
over a 1 GiB float32 buffer with the same thread count, in this process: best of five before the cells, and one
sample before every four FlashTile calls of a cell (the % of a cell is the median over those rounds of the calls'
GB/s ÷ the sample). Timing: time.perf_counter around each call, warm-up first, median of the --reps (>= 20) calls.

    python3 bench/decode.py --lib build/cpu/src/libflashtile_capi.so --threads 2 --out bench/results/cpu_decode

writes OUT.json, OUT.md and OUT.png (GB/s per cell, the read bandwidth as a line).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types

if __name__ == "__main__" and os.environ.get("FT_DECODE_CHILD") != "1":
    # torch's wheel brings its own OpenMP runtime next to the one libflashtile_capi.so links: threads of one that
    # spin after their parallel region steal the cores from the other. Both read these before starting threads,
    # so they are set before torch is imported: passive waits, and the thread count of the run.
    threads = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--threads=")), None)
    if threads is None and "--threads" in sys.argv:
        threads = sys.argv[sys.argv.index("--threads") + 1]
    os.environ.update(FT_DECODE_CHILD="1", OMP_WAIT_POLICY="passive", OMP_NUM_THREADS=threads or str(os.cpu_count()))
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpu_bench import FlashTile  # noqa: E402  the ctypes binding of the C ABI

HQ, HKV, D = 32, 8, 128


_BUF = []


def read_bandwidth(reps=5):
    """GB/s of torch.sum over 1 GiB of float32, best of `reps` (one: a sample of this moment)."""
    if not _BUF:
        _BUF.append(torch.ones(1 << 28, dtype=torch.float32))
    buf = _BUF[0]
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best / 1e9


def median_s(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cells(quick):
    out = []
    for sq in (1, 16):
        for batch, lengths in ((1, (4096, 32768, 131072)), (8, (4096, 32768))):
            for length in lengths:
                if quick and (length > 32768 or sq == 16 and length > 4096):
                    continue
                for page in (0, 16, 64):
                    if page and length != 32768:
                        continue
                    out.append({"sq": sq, "batch": batch, "keys": length, "page": page})
    return out


def cell_inputs(b, sq, length, page=0):
    """One cell's tensors (seeded by its shape): q, out, the cache k, v (paged: pages in a shuffled block table),
    cache_seqlens = length - sq, and the sq new rows the call appends, so that it reads `length` keys."""
    g = torch.Generator().manual_seed(length + 7 * b + sq)
    t = types.SimpleNamespace(page=page, kv_bytes=b * length * HKV * 2 * D * 2, table=None)
    t.q = torch.randn(b, sq, HQ, D, generator=g).to(torch.bfloat16)
    t.out = torch.empty_like(t.q)
    t.lens = torch.full((b,), length - sq, dtype=torch.int32)
    if page:
        pages = b * length // page
        t.k = torch.randn(pages, page, HKV, D, generator=g).to(torch.bfloat16)
        t.v = torch.randn(pages, page, HKV, D, generator=g).to(torch.bfloat16)
        t.table = torch.randperm(pages, generator=g).to(torch.int32).reshape(b, length // page)
    else:
        t.k = torch.randn(b, length, HKV, D, generator=g).to(torch.bfloat16)
        t.v = torch.randn(b, length, HKV, D, generator=g).to(torch.bfloat16)
    # The new rows are values, as a model's: new_empty's leftover bytes can hold Inf or NaN bit patterns, which send
    # the block that holds them down the kernels' non-finite path (the AMX decode's float32 fallback).
    t.k_new = torch.randn(b, sq, HKV, D, generator=g).to(torch.bfloat16)
    t.v_new = torch.randn(b, sq, HKV, D, generator=g).to(torch.bfloat16)
    return t


def flashtile_decode(ft, t):
    """The timed call: appends t's new rows at cache_seqlens (in place) and attends, causal over them. The C ABI
    call with its arguments built once per cell and no report text (gpu_bench.py kvcache_call), as a C++ decode loop
    makes it: the per-call ctypes structures and report text cost about 20 us here (2026-12-08: a 64-key call 15 us
    against 37 us with them, 2 threads), 6 % of a 4k-key call."""
    calls = vars(t).setdefault("calls", {})  # per library: decode_ab.py times several on one cell
    if ft not in calls:
        calls[ft] = ft.kvcache_call(t.q, t.k, t.v, t.out, cache_seqlens=t.lens, block_table=t.table,
                                    k_new=t.k_new, v_new=t.v_new, causal=True)
    calls[ft]()


def bench_cell(ft, cell, reps):
    b, sq, length, page = cell["batch"], cell["sq"], cell["keys"], cell["page"]
    t = cell_inputs(b, sq, length, page)
    q, k, v, kv_bytes = t.q, t.k, t.v, t.kv_bytes
    report = ft.forward_kvcache(q, k, v, t.out, cache_seqlens=t.lens, block_table=t.table, causal=True)
    row = {**cell, "kv_bytes": kv_bytes, "report": report.splitlines()[0]}
    # This VM's bandwidth moves with its neighbours within seconds: the read bandwidth is sampled between
    # FlashTile's calls, round by round, and each round's calls are set against that round's sample.
    calls, bws, fractions = [], [], []
    for _ in range(3):
        flashtile_decode(ft, t)
    for _ in range(max(5, reps // 4)):
        bw = read_bandwidth(1)
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            flashtile_decode(ft, t)
            times.append(time.perf_counter() - t0)
        calls += times
        bws.append(bw)
        fractions.append(kv_bytes / statistics.median(times) / 1e9 / bw)
    row["flashtile_s"], row["read_gbs"] = statistics.median(calls), statistics.median(bws)
    row["read_fraction"] = statistics.median(fractions)
    if not page:
        qt, kt, vt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        # Bottom-right causal over the new tokens, as FlashTile's call (torch's is_causal is top-left aligned).
        mask = causal_lower_right(sq, length) if sq > 1 else None
        row["torch_s"] = median_s(lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True),
                                  reps)
    for lib in ("flashtile", "torch"):
        if lib + "_s" in row:
            row[lib + "_gbs"] = kv_bytes / row[lib + "_s"] / 1e9
    return row


def markdown(meta, rows):
    lines = [f"# CPU decode against a KV cache ({meta['date']})", "",
             f"Machine: {meta['cpu']}, {meta['threads']} threads; torch {meta['torch']}. Command: `{meta['command']}` "
             f"(commit {meta['commit']}).", "",
             f"Read bandwidth measured in the same process (torch.sum over 1 GiB float32, best of 5) at the start: "
             f"**{meta['read_gbs']:.1f} GB/s**. This VM's bandwidth moves with its neighbours within seconds, so each "
             "cell samples it between FlashTile's calls: rounds of one torch.sum and four calls; the cell's read "
             "bandwidth is the median sample, its % the median over the rounds of (the round's FlashTile GB/s ÷ the "
             "round's sample).", "",
             "Threads: OMP_NUM_THREADS as --threads, OMP_WAIT_POLICY=passive (torch's OpenMP runtime and the one "
             "FlashTile links share the cores).", "",
             "GQA 32/8, head dim 128, bf16, causal over the Sq new tokens (appended in place by FlashTile's call). "
             "GB/s = bytes of K+V the call reads / median time; % = of the read bandwidth. torch: "
             "scaled_dot_product_attention with enable_gqa=True (and causal_lower_right for Sq > 1) on a contiguous "
             "(B, H, L, D) copy of the same values (no paged form).", "",
             "| Sq | batch | keys | cache | FlashTile GB/s | % of read bw (GB/s, this cell) | torch SDPA GB/s | FlashTile ÷ torch | splits |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        torch_gbs = r.get("torch_gbs")
        ratio = f"{r['flashtile_gbs'] / torch_gbs:.2f}×" if torch_gbs else "—"
        splits = next((w.split("=")[1] for w in r["report"].split() if w.startswith("splits=")), "1")
        cache = f"paged {r['page']}" if r["page"] else "contiguous"
        lines.append(f"| {r['sq']} | {r['batch']} | {r['keys']} | {cache} | {r['flashtile_gbs']:.1f} | "
                     f"{100 * r['read_fraction']:.0f} % of {r['read_gbs']:.1f} | "
                     f"{'%.1f' % torch_gbs if torch_gbs else '—'} | {ratio} | {splits} |")
    return "\n".join(lines) + "\n"


def plot(meta, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"Sq{r['sq']} B{r['batch']}\n{r['keys'] // 1024}k" + (f" p{r['page']}" if r["page"] else "")
              for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.8 * len(rows)), 4.5))
    ax.bar([i - 0.2 for i in x], [r["flashtile_gbs"] for r in rows], 0.4, label="FlashTile (cpu-flash)", color="C0")
    ax.bar([i + 0.2 for i in x], [r.get("torch_gbs", 0) for r in rows], 0.4, label="torch SDPA", color="C1")
    ax.axhline(meta["read_gbs"], color="k", ls="--", lw=1, label=f"read bandwidth {meta['read_gbs']:.1f} GB/s")
    ax.axhline(0.8 * meta["read_gbs"], color="k", ls=":", lw=1, label="80 % of it (target)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("GB/s of K+V read")
    ax.set_title(f"KV-cache decode, GQA 32/8, hd128 bf16 — {meta['cpu']}, {meta['threads']} threads, {meta['date']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(HERE), "build", "cpu", "src", "libflashtile_capi.so"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="path stem for .json, .md and .png")
    args = ap.parse_args()
    if args.reps < 20:
        sys.exit("--reps: at least 20 (medians of fewer calls move too much here)")
    torch.set_num_threads(args.threads)
    ft = FlashTile(args.lib)
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                        platform.processor()),
            "threads": args.threads, "torch": torch.__version__, "commit": commit,
            "command": "python3 bench/decode.py " + " ".join(sys.argv[1:]), "read_gbs": read_bandwidth()}
    rows = []
    for cell in cells(args.quick):
        row = bench_cell(ft, cell, args.reps)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "report"}), flush=True)
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
