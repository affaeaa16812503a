#!/usr/bin/env python3
"""Runs the CPU benchmark matrix of issue 5 and writes bench/results/cpu.md and cpu.json.

Every cell is one `flashtile bench` process: FlashTile and standard attention (OpenBLAS sgemm, one BLAS thread
per OpenMP worker, S and P materialised for all heads) on the same inputs, in the same binary, back to back.
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the environment of these processes only, since they
slow OpenBLAS down on this machine (design.md, "Measuring").

usage: python3 bench/cpu_matrix.py [--build build/cpu] [--quick] [--threads 1,2] [--bf16] [--out DIR]

--bf16 adds a section: bf16 inputs, forward, D = 128, the largest thread count, S >= 2048, against the float32
standard attention of the same process (the CLI's baseline always runs in float32).
Run it under `taskset` to pin it to chosen cores on a larger machine (scripts/cpu_remote.sh does).
"""
import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return [x for x in flags if x.startswith(("avx", "fma", "f16c", "amx"))]
    return []


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/cpu")
    ap.add_argument("--quick", action="store_true", help="S up to 2048 only (a smoke run)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--bf16", action="store_true", help="add the bf16-input forward section")
    ap.add_argument("--bf16-isas", default="auto",
                    help="ISA paths the bf16 section runs, comma-separated (auto: the dispatch's choice; others are "
                         "forced with FLASHTILE_CPU_ISA)")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--blas-core", default=None,
                    help="OPENBLAS_CORETYPE for the baseline, for a CPU whose OpenBLAS does not recognise it (the "
                         "core OpenBLAS ran is recorded either way)")
    ap.add_argument("--seqlens", default=None, help="comma-separated (default 512..8192; --quick: ..2048)")
    args = ap.parse_args()
    # A `timeout` (SIGTERM) still writes the cells measured so far.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    thread_counts = [int(t) for t in args.threads.split(",")]
    cli = os.path.join(args.build, "apps/flashtile/flashtile")
    peak = os.path.join(args.build, "bench/flashtile_fma_peak")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if args.blas_core:
        env["OPENBLAS_CORETYPE"] = args.blas_core
    env["OPENBLAS_NUM_THREADS"] = "1"

    measured = run([peak], env)
    peaks = {p["threads"]: p for p in measured if p.get("kind", "fma") == "fma"}
    dot_peaks = {(p["threads"], p["kind"]): p for p in measured if p.get("kind") in ("bf16dot", "amx")}
    print("FMA peak:", json.dumps(peaks), "bf16 peaks:", json.dumps(list(dot_peaks.values())), file=sys.stderr, flush=True)
    seqlens = [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
    if args.seqlens:
        seqlens = [int(x) for x in args.seqlens.split(",")]
    cells, bf16 = [], []
    try:
        measure(args, cli, env, thread_counts, seqlens, cells, bf16)
    finally:
        write(args, peaks, dot_peaks, thread_counts, cells, bf16)


def measure(args, cli, env, thread_counts, seqlens, cells, bf16):
    for threads in thread_counts:
        for d in (int(x) for x in args.hdims.split(",")):
            for causal in (False, True):
                for s in seqlens:
                    iters = 5 if s <= 2048 else 3
                    cmd = [cli, "bench", "--heads", "8", "--hdim", str(d), "--seqlen", str(s), "--threads", str(threads),
                           "--iters", str(iters), "--backward", "--json"] + (["--causal"] if causal else [])
                    print(" ".join(cmd), file=sys.stderr, flush=True)
                    r = run(cmd, dict(env, OMP_NUM_THREADS=str(threads)))[-1]
                    r.update(threads=threads, hdim=d, causal=causal, seqlen=s)
                    cells.append(r)
                    print(f"  fwd {r['fwd_flops'] / r['flash_fwd_s'] * 1e-9:7.1f} GFLOP/s "
                          f"({r['standard_fwd_s'] / r['flash_fwd_s']:.2f}x standard), bwd "
                          f"{2.5 * r['fwd_flops'] / r['flash_bwd_s'] * 1e-9:7.1f} GFLOP/s "
                          f"({r['standard_bwd_s'] / r['flash_bwd_s']:.2f}x)", file=sys.stderr, flush=True)

    if args.bf16:
        threads = max(thread_counts)
        for causal, s, isa in ((c, s, i) for c in (False, True) for s in seqlens if s >= 2048
                               for i in args.bf16_isas.split(",")):
                cmd = [cli, "bench", "--heads", "8", "--hdim", "128", "--seqlen", str(s), "--threads", str(threads),
                       "--iters", "3", "--dtype", "bf16", "--json"] + (["--causal"] if causal else [])
                print(" ".join(cmd), "" if isa == "auto" else f"(FLASHTILE_CPU_ISA={isa})", file=sys.stderr, flush=True)
                forced = {} if isa == "auto" else {"FLASHTILE_CPU_ISA": isa}
                r = run(cmd, dict(env, OMP_NUM_THREADS=str(threads), **forced))[-1]
                r.update(threads=threads, hdim=128, causal=causal, seqlen=s, forced=isa)
                bf16.append(r)
                print(f"  bf16 fwd {r['fwd_flops'] / r['flash_fwd_s'] * 1e-9:7.1f} GFLOP/s "
                      f"({r['standard_fwd_s'] / r['flash_fwd_s']:.2f}x float32 standard) [{r['isa']}]",
                      file=sys.stderr, flush=True)


def write(args, peaks, dot_peaks, thread_counts, cells, bf16):
    os.makedirs(args.out, exist_ok=True)
    affinity = sorted(os.sched_getaffinity(0))
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(), "cores": os.cpu_count(), "flags": cpu_flags(), "fma_peak": peaks,
        "bf16_peak": list(dot_peaks.values()),
        "affinity": affinity, "blas": next((c["blas"] for c in cells + bf16 if "blas" in c), "?"),
        "command": "python3 bench/cpu_matrix.py" + (" --quick" if args.quick else "")
        + (f" --threads {args.threads}" if args.threads != "1,2" else "") + (" --bf16" if args.bf16 else "")
        + (f" --hdims {args.hdims}" if args.hdims != "64,128" else "")
        + (f" --bf16-isas {args.bf16_isas}" if args.bf16_isas != "auto" else "")
        + (f" --blas-core {args.blas_core}" if args.blas_core else "")
        + (f" --seqlens {args.seqlens}" if args.seqlens else ""),
    }
    with open(os.path.join(args.out, "cpu.json"), "w") as f:
        json.dump({"meta": meta, "cells": cells, "bf16": bf16}, f, indent=1)

    gf = lambda flops, sec: flops / sec * 1e-9
    mib = lambda b: f"{b / 2**20:.1f}"
    lines = [
        "# CPU benchmark: FlashTile vs standard attention",
        "",
        f"- date: {meta['date']}",
        f"- machine: {meta['cpu']}, {meta['cores']} cores (this process ran on CPUs {affinity}); SIMD flags: "
        f"{' '.join(meta['flags'])}",
        "- FMA peak measured by bench/fma_peak.cpp in the same run: "
        + ", ".join(f"{t} thread{'s' if t > 1 else ''}: {p['gflops']:.0f} GFLOP/s ({p['isa']})" for t, p in peaks.items())
        + "".join(f"; bf16 peak on {'vdpbf16ps' if p['kind'] == 'bf16dot' else 'AMX tdpbf16ps'}, {t} "
                  f"thread{'s' if t > 1 else ''}: {p['gflops']:.0f} GFLOP/s" for (t, _), p in dot_peaks.items()),
        f"- standard attention's BLAS (as it reports itself): {meta['blas']}",
        f"- command: `{meta['command']}` (each cell: `flashtile bench --heads 8 --hdim D --seqlen S --threads T "
        "--backward [--causal]`, OPENBLAS_L2_SIZE unset, "
        + (f"OPENBLAS_CORETYPE={args.blas_core}" if args.blas_core else "OPENBLAS_CORETYPE unset")
        + ", OPENBLAS_NUM_THREADS=1)",
        "- standard attention: float32, OpenBLAS sgemm, S and P materialised for all 8 heads, one BLAS thread per "
        "OpenMP worker; FlashTile: cpu-flash, float32, ISA path in the table",
        "- GFLOP/s: forward 4·B·H·S²·D (causal: visible scores only), backward 2.5× forward; time is the median of "
        "3–5 runs after a warm-up; ratio = standard time / FlashTile time (> 1: FlashTile faster)",
        "- peak extra: heap bytes above inputs and outputs during the call (standard backward: dP; its P, kept "
        "from forward, is the 'P' column)",
        "",
        "| threads | D | causal | S | FT fwd GFLOP/s | std fwd GFLOP/s | fwd ratio | FT bwd GFLOP/s | std bwd GFLOP/s "
        "| bwd ratio | FT fwd peak MiB | std fwd peak MiB | FT bwd peak MiB | std bwd peak MiB | P MiB | ISA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        fl = c["fwd_flops"]
        lines.append(
            f"| {c['threads']} | {c['hdim']} | {'yes' if c['causal'] else 'no'} | {c['seqlen']} "
            f"| {gf(fl, c['flash_fwd_s']):.1f} | {gf(fl, c['standard_fwd_s']):.1f} "
            f"| {c['standard_fwd_s'] / c['flash_fwd_s']:.2f} "
            f"| {gf(2.5 * fl, c['flash_bwd_s']):.1f} | {gf(2.5 * fl, c['standard_bwd_s']):.1f} "
            f"| {c['standard_bwd_s'] / c['flash_bwd_s']:.2f} "
            f"| {mib(c['flash_fwd_peak_bytes'])} | {mib(c['standard_fwd_peak_bytes'])} "
            f"| {mib(c['flash_bwd_peak_bytes'])} | {mib(c['standard_bwd_peak_bytes'])} | {mib(c['standard_p_bytes'])} "
            f"| {c['isa']} |")
    if bf16:
        lines += [
            "",
            f"## bf16 inputs, forward, D = 128, {bf16[0]['threads']} threads (against float32 standard attention)",
            "",
            "| S | causal | FT bf16 GFLOP/s | std fp32 GFLOP/s | ratio | ISA | FT fp32 GFLOP/s (matrix cell) |",
            "|---:|:---:|---:|---:|---:|---|---:|",
        ]
        for c in bf16:
            fl = c["fwd_flops"]
            fp32 = [gf(m["fwd_flops"], m["flash_fwd_s"]) for m in cells if (m["threads"], m["hdim"], m["causal"],
                    m["seqlen"]) == (c["threads"], c["hdim"], c["causal"], c["seqlen"])]
            lines.append(f"| {c['seqlen']} | {'yes' if c['causal'] else 'no'} | {gf(fl, c['flash_fwd_s']):.1f} "
                         f"| {gf(fl, c['standard_fwd_s']):.1f} | {c['standard_fwd_s'] / c['flash_fwd_s']:.2f} "
                         f"| {c['isa']} | {f'{fp32[0]:.1f}' if fp32 else '-'} |")
    with open(os.path.join(args.out, "cpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
