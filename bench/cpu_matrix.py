#!/usr/bin/env python3
"""Runs the CPU benchmark matrix and writes bench/results/cpu.md, cpu.json and cpu.png.

Every cell times three libraries in ONE process, on the same values, back to back:
  - FlashTile (cpu-flash), called through libflashtile_capi.so (ctypes, the C ABI of src/capi/capi.cpp, which
    uses only the public API; bench/gpu_bench.py loads the same ABI next to torch on the GPU);
  - torch SDPA's CPU flash kernel (torch.nn.functional.scaled_dot_product_attention under
    sdpa_kernel(FLASH_ATTENTION): aten::_scaled_dot_product_flash_attention_for_cpu, what CPU users get);
  - standard attention as torch's math backend computes it (SDPBackend.MATH: S and P materialised, matmuls on
    torch's BLAS).
torch cannot run inside the CLI binary, so the CLI's own standard attention (OpenBLAS sgemm) is a separate process:
`--cli` adds it per cell (`flashtile bench`, which times FlashTile again in that process).

One worker process per thread count (OMP_NUM_THREADS=T and torch.set_num_threads(T): FlashTile and torch share the
OpenMP runtime that torch loads). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the environment of the
measuring processes only (design.md, "Measuring").

usage: python3 bench/cpu_matrix.py [--build build/cpu] [--quick] [--threads 1,2] [--bf16] [--cli] [--out DIR]
Needs torch and the cpu build (the C ABI library is linked from build/cpu/src/libflashtile.a when missing).
--bf16 adds a section: bf16 inputs, D = 128, the largest thread count, S >= 2048, forward and backward.
Run it under `taskset` to pin it to chosen cores on a larger machine (scripts/cpu_remote.sh does).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LIBS = ("flashtile", "torch_flash", "torch_math")


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


def run_json(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def forward_flops(seqlen, hdim, causal, heads=8):
    """4·H·(visible scores)·D, as `flashtile bench` counts them: causal row i sees i + 1 keys."""
    visible = seqlen * (seqlen + 1) / 2 if causal else seqlen * seqlen
    return 4.0 * heads * visible * hdim


def find_capi(build):
    """The C ABI library: a CMake-built one if the build has it, else linked here from the static library."""
    for cand in (os.path.join(build, "src", "libflashtile_capi.so"),
                 os.path.join(build, "src", "cuda", "libflashtile_capi.so")):
        if os.path.exists(cand):
            return cand
    out, lib = os.path.join(build, "libflashtile_capi_cpu.so"), os.path.join(build, "src", "libflashtile.a")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(lib):
        return out
    # --whole-archive keeps every ISA variant's objects; the static library is position-independent.
    cmd = ["g++", "-std=c++20", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-I", os.path.join(ROOT, "include"),
           next(p for p in (os.path.join(ROOT, "src", "capi", "capi.cpp"), os.path.join(ROOT, "src", "capi.cpp"))
                if os.path.exists(p)), "-Wl,--whole-archive",
           lib, "-Wl,--no-whole-archive", "-fopenmp",
           "-Wl,--exclude-libs,ALL", "-Wl,-Bsymbolic", "-o", out]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Worker: one process, one thread count; prints one JSON line per cell.

def worker(args):
    import statistics
    import time

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, HERE)
    from gpu_bench import FlashTile  # the ctypes binding of the C ABI, shared with the GPU benchmark

    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    ft = FlashTile(args.capi)
    dtypes = {"float32": torch.float32, "bf16": torch.bfloat16}

    def timed(fn, iters, ops=None):
        """Median of `iters` calls after one warm-up; one call when the warm-up took over --slow seconds. With
        `ops` (a list), the warm-up runs under torch's profiler and the aten attention ops it ran are appended:
        which SDPA kernel it was."""
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if ops is not None else None
        t0 = time.perf_counter()
        if prof:
            with prof:
                first = fn()
        else:
            first = fn()
        warm = time.perf_counter() - t0
        if prof:
            events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
            names = [e.key for e in events if e.key.startswith("aten::")]
            ops += [n for n in names if "attention" in n or "flash" in n] or names[:4]
        n = 1 if warm > args.slow else iters
        runs = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return {"s": statistics.median(runs), "runs": runs, "warmup_s": warm}, first

    for spec in json.loads(args.cells):
        d, s, causal, dtype = spec["hdim"], spec["seqlen"], spec["causal"], dtypes[spec["dtype"]]
        iters = args.iters or (5 if s <= 2048 else 3)
        g = torch.Generator().manual_seed(spec["seed"])
        # torch's layout (B, H, S, D); FlashTile gets the same values in its own layout (B, S, H, D), contiguous.
        q, k, v, dout = (torch.randn(1, 8, s, d, generator=g).to(dtype) for _ in range(4))
        fq, fk, fv, fdo = (x.transpose(1, 2).contiguous() for x in (q, k, v, dout))
        out, lse = torch.empty_like(fq), torch.empty(1, 8, s, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(fv)
        cell = dict(spec, threads=threads, fwd_flops=forward_flops(s, d, causal), load=os.getloadavg(), libs={})
        res = cell["libs"]["flashtile"] = {}
        res["fwd"], report = timed(lambda: ft.forward(fq, fk, fv, out, lse, causal=causal, backend="cpu-flash"), iters)
        res["kernel_fwd"] = report.split("\n")[0]  # the dispatch report: which kernel and ISA path ran
        if spec["backward"]:
            res["bwd"], report = timed(lambda: ft.backward(fq, fk, fv, out, fdo, lse, dq, dk, dv, causal=causal,
                                                           backend="cpu-flash"), iters)
            res["kernel_bwd"] = report.split("\n")[0]
        for name, backend in (("torch_flash", SDPBackend.FLASH_ATTENTION), ("torch_math", SDPBackend.MATH)):
            res = cell["libs"][name] = {}
            try:
                with sdpa_kernel(backend):
                    res["ops_fwd"], res["ops_bwd"] = [], []
                    with torch.no_grad():
                        res["fwd"], o = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), iters,
                                              res["ops_fwd"])
                    # Agreement with FlashTile's output and gradients on these inputs: a check that both computed
                    # the same thing (not an accuracy figure; the tests measure accuracy against float64).
                    res["max_abs_diff_out"] = (o.float() - out.transpose(1, 2).float()).abs().max().item()
                    if spec["backward"]:
                        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
                        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        res["bwd"], grads = timed(lambda: torch.autograd.grad(o, (qg, kg, vg), dout,
                                                                              retain_graph=True), iters, res["ops_bwd"])
                        res["max_abs_diff_dqkv"] = max((a.float() - b.transpose(1, 2).float()).abs().max().item()
                                                       for a, b in zip(grads, (dq, dk, dv)))
                        del o, qg, kg, vg, grads
            except RuntimeError as e:  # a peer that cannot run a cell is reported, not fatal
                res["error"] = str(e).split("\n")[0][:200]
        print(json.dumps(cell), flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Driver.

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/cpu")
    ap.add_argument("--capi", default=None, help="libflashtile_capi.so (default: found or linked in --build)")
    ap.add_argument("--quick", action="store_true", help="S up to 2048 only (a smoke run)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="cpu_latest", help="output files NAME.md, NAME.json, NAME.png (cpu.md holds "
                                                           "the curated runs and their notes)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--bf16", action="store_true", help="add the bf16 section (forward and backward)")
    ap.add_argument("--cli", action="store_true", help="also run `flashtile bench` per float32 cell (OpenBLAS "
                                                       "standard attention, another process)")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--blas-core", default=None,
                    help="OPENBLAS_CORETYPE for the CLI's baseline (--cli), for a CPU whose OpenBLAS does not "
                         "recognise it")
    ap.add_argument("--seqlens", default=None, help="comma-separated (default 512..8192; --quick: ..2048)")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per cell (default: 5 up to S=2048, else 3)")
    ap.add_argument("--slow", type=float, default=10.0, help="a call whose warm-up took longer (s) is timed once")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cells", default="[]", help=argparse.SUPPRESS)
    ap.add_argument("--rewrite", default=None, metavar="JSON", help="write the table and plot of a run's JSON again")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.rewrite:
        with open(args.rewrite) as f:
            run = json.load(f)
        args.out, args.name = os.path.dirname(args.rewrite), os.path.splitext(os.path.basename(args.rewrite))[0]
        return write(args, run["meta"], run["cells"], measured=False)
    # A `timeout` (SIGTERM) still writes the cells measured so far.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    thread_counts = [int(t) for t in args.threads.split(",")]
    args.capi = args.capi or find_capi(args.build)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if args.blas_core:
        env["OPENBLAS_CORETYPE"] = args.blas_core
    env["OPENBLAS_NUM_THREADS"] = "1"

    peak = os.path.join(args.build, "bench/flashtile_fma_peak")
    measured = run_json([peak], env) if os.path.exists(peak) else []
    peaks = {p["threads"]: p for p in measured if p.get("kind", "fma") == "fma"}
    dot_peaks = [p for p in measured if p.get("kind") in ("bf16dot", "amx")]
    print("FMA peak:", json.dumps(peaks), "bf16 peaks:", json.dumps(dot_peaks), file=sys.stderr, flush=True)
    seqlens = [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
    if args.seqlens:
        seqlens = [int(x) for x in args.seqlens.split(",")]
    cells = []
    os.makedirs(args.out, exist_ok=True)
    if os.path.exists(os.path.join(args.out, args.name + ".worker.log")):
        os.remove(os.path.join(args.out, args.name + ".worker.log"))
    meta = metadata(args, peaks, dot_peaks)
    try:
        for threads in thread_counts:
            specs = [dict(hdim=d, causal=c, seqlen=s, dtype="float32", backward=True)
                     for d in (int(x) for x in args.hdims.split(",")) for c in (False, True) for s in seqlens]
            if args.bf16 and threads == max(thread_counts):
                specs += [dict(hdim=128, causal=c, seqlen=s, dtype="bf16", backward=True)
                          for c in (False, True) for s in seqlens if s >= 2048]
            for i, sp in enumerate(specs):
                sp["seed"] = 1000 * threads + i
            run_worker(args, env, threads, specs, cells, meta)
    finally:
        write(args, meta, cells)


def run_worker(args, env, threads, specs, cells, meta):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--capi", args.capi, "--slow", str(args.slow),
           "--iters", str(args.iters),
           "--cells", json.dumps(specs)]
    wenv = dict(env, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    print(f"worker: {threads} thread(s), {len(specs)} cells", file=sys.stderr, flush=True)
    log = open(os.path.join(args.out, args.name + ".worker.log"), "a")  # torch's profiler chatter goes here
    p = subprocess.Popen(cmd, env=wenv, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        for line in p.stdout:
            if not line.startswith("{"):
                continue
            c = json.loads(line)
            if args.cli and c["dtype"] == "float32":
                c["cli"] = run_cli(args, wenv, c)
            cells.append(c)
            print(summary(c), file=sys.stderr, flush=True)
    finally:  # a timeout or ^C here must not leave the worker running
        if p.poll() is None:
            p.kill()
        log.close()
    if p.wait() != 0:
        raise SystemExit(f"worker for {threads} thread(s) failed with {p.returncode}; see {log.name}")


def run_cli(args, env, c):
    cli = os.path.join(args.build, "apps/flashtile/flashtile")
    cmd = [cli, "bench", "--heads", "8", "--hdim", str(c["hdim"]), "--seqlen", str(c["seqlen"]), "--threads",
           str(c["threads"]), "--iters", str(5 if c["seqlen"] <= 2048 else 3), "--backward", "--json"]
    return run_json(cmd + (["--causal"] if c["causal"] else []), env)[-1]


def gflops(c, lib, direction):
    r = c["libs"].get(lib, {}).get(direction)
    return (c["fwd_flops"] * (2.5 if direction == "bwd" else 1.0)) / r["s"] * 1e-9 if r else None


def summary(c):
    parts = [f"{c['threads']}T D={c['hdim']} {'causal' if c['causal'] else 'full'} S={c['seqlen']} {c['dtype']}:"]
    for direction in ("fwd", "bwd"):
        vals = [f"{lib} {gflops(c, lib, direction):.1f}" for lib in LIBS if gflops(c, lib, direction)]
        parts.append(f"{direction} GFLOP/s " + ", ".join(vals))
    return " ".join(parts)


def metadata(args, peaks, dot_peaks):
    info = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps({'torch': torch.__version__, "
                           "'cpu_capability': torch.backends.cpu.get_cpu_capability(), 'blas': next((x.split('=')[1] "
                           "for x in torch.__config__.show().replace(',', '\\n').split() if x.startswith('BLAS_INFO')),"
                           " '?')}))"], capture_output=True, text=True, check=True).stdout
    # The command as given (every argument, --name and --out included), as the results tables quote it.
    cmd = shlex.join(["python3", "bench/cpu_matrix.py", *sys.argv[1:]])
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu_model(), "cores": os.cpu_count(), "flags": cpu_flags(), "fma_peak": peaks,
            "bf16_peak": dot_peaks, "affinity": sorted(os.sched_getaffinity(0)), "load_at_start": os.getloadavg(),
            "command": cmd, "capi": args.capi, "iters": args.iters, **json.loads(info)}


def markdown(meta, cells):
    peaks = ", ".join(f"{t} thread{'s' if int(t) > 1 else ''}: {p['gflops']:.0f} GFLOP/s ({p['isa']})"
                      for t, p in meta["fma_peak"].items())
    peaks += "".join(f"; bf16 peak on {'vdpbf16ps' if p['kind'] == 'bf16dot' else 'AMX tdpbf16ps'}, {p['threads']} "
                     f"thread{'s' if p['threads'] > 1 else ''}: {p['gflops']:.0f} GFLOP/s" for p in meta["bf16_peak"])
    once = [c for c in cells for lib in c["libs"].values() for d in ("fwd", "bwd") if len(lib.get(d, {}).get("runs",
                                                                                                       [0, 0])) == 1]
    lines = [
        "# CPU benchmark: FlashTile, torch SDPA (CPU flash kernel), standard attention (torch math)", "",
        f"- date: {meta['date']} to {meta.get('end', '?')}; load average (1, 5, 15 min) at start "
        f"{', '.join(f'{x:.2f}' for x in meta['load_at_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in meta.get('load_at_end', []))}",
        f"- machine: {meta['cpu']}, {meta['cores']} cores (this process ran on CPUs {meta['affinity']}); SIMD flags: "
        f"{' '.join(meta['flags'])}",
        f"- FMA peak measured by bench/fma_peak.cpp in the same run: {peaks or 'not measured'}",
        f"- torch {meta['torch']} (CPU capability {meta['cpu_capability']}, BLAS {meta['blas']}); aten ops its "
        "profiler saw in the warm-up calls: " + "; ".join(
            f"{lib} {d}: " + ", ".join(sorted({op for c in cells for op in c["libs"][lib].get("ops_" + d, [])
                                               if any(w in op for w in ("attention", "flash", "bmm", "softmax"))}))
            for lib in LIBS[1:] for d in ("fwd", "bwd")),
        f"- command: `{meta['command']}` (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for it)",
        "- FlashTile against torch's flash kernel on the same inputs, largest |difference| over the cells (a check "
        "that both computed the same thing): " + "; ".join(
            f"{dt}: output {max(c['libs']['torch_flash'].get('max_abs_diff_out', 0) for c in cs):.1e}, dQ/dK/dV "
            f"{max(c['libs']['torch_flash'].get('max_abs_diff_dqkv', 0) for c in cs):.1e}"
            for dt, cs in ((dt, [c for c in cells if c["dtype"] == dt]) for dt in ("float32", "bf16")) if cs),
        "- one process per thread count times all three on the same values, back to back, per cell: FlashTile "
        "(cpu-flash through libflashtile_capi.so, (B, S, H, D) contiguous), torch SDPA forced to its flash kernel "
        "and to its math backend (standard attention: S and P materialised), (B, H, S, D) contiguous; B=1, H=8; "
        "backward = torch.autograd.grad of the SDPA output (torch) or flashtile backward (FlashTile)",
        "- GFLOP/s: forward 4·B·H·S²·D (causal: visible scores only), backward 2.5× forward; time is the median of "
        f"{meta['iters'] or '3–5'} runs after a warm-up" + (f" (a call whose warm-up took over the --slow limit is timed once: "
                                      f"{len(once)} timings marked ¹)" if once else "")
        + "; ratio = peer time / FlashTile time (> 1: FlashTile faster)", "",
        "| threads | dtype | D | causal | S | FT fwd | torch flash fwd | std fwd | ÷flash | ÷std | FT bwd "
        "| torch flash bwd | std bwd | ÷flash | ÷std | ISA |" + (" CLI FT fwd | OpenBLAS std fwd | CLI FT bwd "
                                                                   "| OpenBLAS std bwd |" if any("cli" in c for c in cells) else ""),
        "|---:|---|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        + ("---:|---:|---:|---:|" if any("cli" in c for c in cells) else ""),
    ]
    for c in cells:
        row = [str(c["threads"]), c["dtype"], str(c["hdim"]), "yes" if c["causal"] else "no", str(c["seqlen"])]
        for d in ("fwd", "bwd"):
            g = {lib: gflops(c, lib, d) for lib in LIBS}
            mark = {lib: "¹" if len(c["libs"][lib].get(d, {}).get("runs", [0, 0])) == 1 else "" for lib in LIBS}
            row += [f"{g[lib]:.1f}{mark[lib]}" if g[lib] else "err" for lib in LIBS]
            row += [f"{g['flashtile'] / g[p]:.2f}" if g["flashtile"] and g[p] else "-" for p in LIBS[1:]]
        row.append(c["libs"]["flashtile"]["kernel_fwd"].split("[")[1].split("]")[0])
        if "cli" in c:
            r, fl = c["cli"], c["fwd_flops"]
            row += [f"{fl / r['flash_fwd_s'] * 1e-9:.1f}", f"{fl / r['standard_fwd_s'] * 1e-9:.1f}",
                    f"{2.5 * fl / r['flash_bwd_s'] * 1e-9:.1f}", f"{2.5 * fl / r['standard_bwd_s'] * 1e-9:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    errors = sorted({f"{lib}: {c['libs'][lib]['error']}" for c in cells for lib in LIBS if "error" in c["libs"][lib]})
    return "\n".join(lines + ([""] + [f"- error {e}" for e in errors] if errors else []))


def write(args, meta, cells, measured=True):
    os.makedirs(args.out, exist_ok=True)
    if measured:
        meta["load_at_end"] = os.getloadavg()
        meta["end"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path = os.path.join(args.out, args.name + ".json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "cells": cells}, f, indent=1)
    md = markdown(meta, cells)
    with open(os.path.join(args.out, args.name + ".md"), "w") as f:
        f.write(md + "\n")
    print(md)
    try:
        sys.path.insert(0, HERE)
        import plots
        print("plot:", plots.plot_file(path), file=sys.stderr)
    except ImportError as e:  # matplotlib missing: the table stands; `python3 bench/plots.py` draws it later
        print(f"no plot ({e})", file=sys.stderr)


if __name__ == "__main__":
    main()
