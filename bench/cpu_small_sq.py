#!/usr/bin/env python3
"""Forwards with few query rows per KV head (Sq · G <= 128: decoding without a KV-cache API, chunked prefill,
cross-attention to a long context) on the CPU, in one process: FlashTile as dispatched (forwards whose G·Sq rows fit
one decode tile run on the decode kernel: src/cpu/decode_plan.h forward_on_decode), FlashTile with every forward on
the tiled forward kernel (FLASHTILE_CPU_FORWARD=tiles, what every forward ran before), torch's CPU SDPA (its own
dispatch, enable_gqa) and standard attention (torch's math backend), on the same values.

    OMP_NUM_THREADS=2 python3 bench/cpu_small_sq.py --lib build/cpu/src/libflashtile_capi.so \
        --out bench/results/cpu_forward_small_sq

B = 1, causal bottom-right (query i sees keys j <= i + Sk - Sq; torch gets causal_lower_right, or no mask at
Sq = 1, where it is the same), (B, S, H, D) tensors for FlashTile (timed on its C ABI call, arguments built once, no
report text: gpu_bench.py forward_call) and (B, H, S, D) copies for torch. --base times a second build of the library
on the same calls (an A/B in one process). Each figure is
the median over --rounds rounds (each round times every call, in an order drawn per round) of the median of 3
calls; ratios are the peer's time over FlashTile's as dispatched (> 1: FlashTile faster).
"""
import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import shuffled_rounds, warm_median_s, with_env  # noqa: E402
from cpu_ab import cpu_model  # noqa: E402
from gpu_bench import FlashTile  # noqa: E402  the ctypes binding of the C ABI

# (Sq, Hq, Hkv): G·Sq rows per KV head from 1 to 128.
SHAPES = [(1, 8, 8), (1, 32, 8), (4, 32, 8), (16, 8, 8), (4, 32, 4), (32, 8, 8), (64, 8, 8), (16, 32, 8), (128, 8, 8)]


def cell(ft, dtype, d, sq, hq, hkv, sk, rounds, base=None):
    g = torch.Generator().manual_seed(sk + 7 * sq + hq + d)
    q, k, v = (torch.randn(1, s, h, d, generator=g).to(dtype) for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
    out, lse = torch.empty_like(q), torch.empty(1, hq, sq)
    ft.forward(q, k, v, out, lse, causal=True, backend="cpu-flash")
    kernel = ft.msg.value.decode().split()[3]  # "ran cpu-flash / <kernel> ..."
    # Timed: the C call alone, its arguments built once and no report text asked for (what a C++ caller pays).
    call = ft.forward_call(q, k, v, out, lse, causal=True, backend="cpu-flash")
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    mask = causal_lower_right(sq, sk) if sq > 1 else None

    def sdpa(backend):
        def run():
            if backend is None:
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=hq != hkv)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=hq != hkv)
        return run

    calls = {"flashtile": call, "flashtile_tiles": with_env(call, "FLASHTILE_CPU_FORWARD", "tiles"),
             "torch": sdpa(None), "torch_math": sdpa(SDPBackend.MATH)}
    if base is not None:  # another build of the library on the same call (--base): an A/B in this process
        out_base = torch.empty_like(q)
        calls["flashtile_base"] = base.forward_call(q, k, v, out_base, lse, causal=True, backend="cpu-flash")
    ref = sdpa(SDPBackend.MATH)().transpose(1, 2).float()
    err = (out.float() - ref).abs().max().item()
    times = shuffled_rounds(calls, rounds, warm_median_s)
    ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
    return {"dtype": str(dtype).split(".")[-1], "hdim": d, "sq": sq, "hq": hq, "hkv": hkv, "rows": sq * hq // hkv,
            "sk": sk, "kernel": kernel, "ms": ms, "max_diff_vs_math": err}


def markdown(meta, rows):
    has_base = any("flashtile_base" in r["ms"] for r in rows)
    out = [f"# CPU forwards with few query rows per KV head ({meta['date']})", "",
           f"- machine: {meta['cpu']}, {meta['threads']} threads; torch {meta['torch']}; commit {meta['commit']}",
           f"- command: `{meta['command']}`",
           "- FlashTile: as dispatched (kernel column), and with every forward on the tiled forward kernel "
           "(FLASHTILE_CPU_FORWARD=tiles), timed on the C ABI call with its arguments built once (gpu_bench.py "
           "forward_call); torch: SDPA with its own dispatch (enable_gqa, causal_lower_right) and "
           "its math backend (standard attention); B = 1, causal bottom-right; ms = median over rounds of the "
           "median of 3 calls; ratio = the other's time ÷ FlashTile's as dispatched",
           "- max diff: |FlashTile − torch math| over the output (a check that both computed the same thing)"]
    if has_base:
        out.append(f"- base: the same call on the build {meta['base']} (--base), in the same process")
    out += ["", "| dtype | D | Sq | Hq/Hkv | G·Sq | keys | kernel | FlashTile ms | tiled forward ms | torch SDPA ms | "
            "standard ms | ÷ tiled | ÷ torch | ÷ standard | max diff |" + (" base ms | ÷ base |" if has_base else ""),
            "|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if has_base else "")]
    for r in rows:
        m = r["ms"]
        out.append(f"| {r['dtype']} | {r['hdim']} | {r['sq']} | {r['hq']}/{r['hkv']} | {r['rows']} | {r['sk']} | "
                   f"{r['kernel']} | {m['flashtile']:.3f} | {m['flashtile_tiles']:.3f} | {m['torch']:.3f} | "
                   f"{m['torch_math']:.3f} | {m['flashtile_tiles'] / m['flashtile']:.2f} | "
                   f"{m['torch'] / m['flashtile']:.2f} | {m['torch_math'] / m['flashtile']:.2f} | "
                   f"{r['max_diff_vs_math']:.1e} |" +
                   (f" {m['flashtile_base']:.3f} | {m['flashtile_base'] / m['flashtile']:.2f} |" if has_base else ""))
    return "\n".join(out) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["dtype"], r["hdim"], r["sk"]) for r in rows})
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 2.6 * len(groups)), squeeze=False)
    for ax, (dt, d, sk) in zip(axes[:, 0], groups):
        sel = [r for r in rows if (r["dtype"], r["hdim"], r["sk"]) == (dt, d, sk)]
        x = range(len(sel))
        series = [("flashtile_tiles", "tiled forward kernel"), ("torch", "torch SDPA"),
                  ("torch_math", "standard attention")]
        if all("flashtile_base" in r["ms"] for r in sel):
            series.append(("flashtile_base", "base build (--base)"))
        wd = 0.8 / len(series)
        for i, (key, label) in enumerate(series):
            ax.bar([xi + wd * (i - (len(series) - 1) / 2) for xi in x], [r["ms"][key] / r["ms"]["flashtile"] for r in sel],
                   wd, label=label)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"Sq {r['sq']}\n{r['hq']}/{r['hkv']}\nG·Sq {r['rows']}" for r in sel], fontsize=7)
        ax.set_ylabel("time ÷ FlashTile's")
        ax.set_title(f"{dt}, D = {d}, {sk} keys (> 1: FlashTile as dispatched is faster)", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/cpu/src/libflashtile_capi.so")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--keys", default="2048,16384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--base", default=None, help="another build of libflashtile_capi.so, timed on the same calls")
    ap.add_argument("--out", default=None, help="write OUT.md, OUT.json and OUT.png")
    args = ap.parse_args()
    ft = FlashTile(args.lib)
    base = FlashTile(args.base) if args.base else None
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": f"{cpu_model()} ({platform.machine()}), {os.cpu_count()} CPUs",
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "commit": os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip() or "?",
            "command": "python3 " + " ".join(sys.argv), "base": args.base}
    rows = []
    for dt, d, (sq, hq, hkv), sk in itertools.product(args.dtypes.split(","), map(int, args.hdims.split(",")),
                                                      SHAPES, map(int, args.keys.split(","))):
        r = cell(ft, getattr(torch, dt), d, sq, hq, hkv, sk, args.rounds, base)
        rows.append(r)
        m = r["ms"]
        print(f"{dt:8} D{d:3} Sq{sq:3} {hq}/{hkv} G·Sq {r['rows']:3} keys {sk:5}: {r['kernel']:16} "
              f"{m['flashtile']:8.3f} ms, tiled {m['flashtile_tiles'] / m['flashtile']:5.2f}x, "
              f"torch {m['torch'] / m['flashtile']:5.2f}x, standard {m['torch_math'] / m['flashtile']:5.2f}x" +
              (f", base {m['flashtile_base'] / m['flashtile']:5.2f}x" if base else ""), flush=True)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(markdown(meta, rows))
        plot(rows, args.out + ".png")


if __name__ == "__main__":
    main()
