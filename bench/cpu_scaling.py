#!/usr/bin/env python3
"""Where the per-core speed goes when more cores run: FlashTile and torch's CPU SDPA timed on one core alone, on one
core while the other T-1 cores carry a load, and on T cores together (issue 16: on the 16-core Xeon host the float32
forward ran at 80 % of the FMA peak on 2 cores and 66-69 % on 8, torch losing about as much).

  one core alone          the kernel's own speed
  one core, FMA load      the other cores run torch.mm on 512 x 512 float32 tiles (MKL; FMAs from L1/L2, little
                          memory traffic): a drop here is the clock or power the cores share
  one core, FlashTile     the other cores run FlashTile's forward on the same cell: a further drop is the L3 and
                          memory traffic the cores share
  T cores together        per core; below the loaded single core is the work split itself (tasks, K/V copies,
                          threads waiting)

Each measurement is its own process, pinned (os.sched_setaffinity) to CPUs on distinct physical cores before torch
loads; the load processes are pinned to the others. GFLOP/s as bench/cpu_matrix.py counts them (B=1, H=8).

  python3 bench/cpu_scaling.py --capi LIB --cores 8 [--cells f32:128:2048,bf16:128:4096] [--backward]
      [--also NAME=LIB2] [--together-only] [--json OUT.json]

On a shared host one run is one sample of its neighbours: on 2026-12-06 one core alone read slower than the same core
with the other seven loaded, and two starts minutes apart differed by 1.5-1.9x on 8 cores (cpu.md, 2026-12-06);
an A/B repeats its builds in the --also list (A, B, A, B) so that the spread shows.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def distinct_cores():
    """CPU ids, the first CPU of each physical core, in CPU order (lscpu -p)."""
    out = subprocess.run(["lscpu", "-p=CPU,CORE"], capture_output=True, text=True, check=True).stdout
    seen, cpus = set(), []
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        cpu, core = line.split(",")[:2]
        if core not in seen:
            seen.add(core)
            cpus.append(int(cpu))
    return cpus


def parse_cell(text):
    dtype, d, s = text.split(":")
    return {"dtype": dtype, "hdim": int(d), "seqlen": int(s)}


def child(args):
    """A measuring or loading process: pinned first, then torch."""
    os.sched_setaffinity(0, [int(c) for c in args.pin.split(",")])
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sys.path.insert(0, HERE)
    from ab_common import warm_median_s
    from cpu_matrix import forward_flops
    from gpu_bench import FlashTile

    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    if args.load == "fma":
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        while True:
            torch.mm(a, b)
    cell = parse_cell(args.cell)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[cell["dtype"]]
    s, d = cell["seqlen"], cell["hdim"]
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 8, s, d, generator=g).to(dtype) for _ in range(4))
    fq, fk, fv, fdo = (x.transpose(1, 2).contiguous() for x in (q, k, v, dout))
    out, lse = torch.empty_like(fq), torch.empty(1, 8, s, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(fv)
    ft = FlashTile(args.capi)
    ft_fwd = lambda: ft.forward(fq, fk, fv, out, lse, backend="cpu-flash")
    if args.load == "ft":
        while True:
            ft_fwd()
    flops = forward_flops(s, d, causal=False)
    ft_fwd()
    res = {"ft_fwd": ft_fwd}
    if args.backward:
        res["ft_bwd"] = lambda: ft.backward(fq, fk, fv, out, fdo, lse, dq, dk, dv, backend="cpu-flash")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        def torch_fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v)
        res["torch_fwd"] = torch_fwd
        if args.backward:
            qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qg, kg, vg)
            res["torch_bwd"] = lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
        gf = {}
        for name, fn in res.items():
            sec = warm_median_s(fn, reps=args.reps, warm_s=0.5)
            gf[name] = flops * (2.5 if name.endswith("bwd") else 1.0) / sec * 1e-9
    print(json.dumps(gf), flush=True)


def spawn(args, pin, threads, extra, capture, capi=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--capi", capi or args.capi,
           "--pin", ",".join(map(str, pin)), "--reps", str(args.reps)] + extra
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, text=True)


def measure(args, cell, pin, load=None, load_pin=(), capi=None):
    loader = None
    if load and load_pin:
        loader = spawn(args, load_pin, len(load_pin), ["--load", load, "--cell", cell], False)
        time.sleep(3.0)  # the load's start (torch import, first calls) before the timed process starts
    try:
        p = spawn(args, pin, len(pin), ["--cell", cell] + (["--backward"] if args.backward else []), True, capi)
        line = p.communicate()[0].strip().splitlines()[-1]
    finally:
        if loader:
            loader.kill()
            loader.wait()
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capi", required=True, help="libflashtile_capi.so (the C ABI library)")
    ap.add_argument("--cores", type=int, default=8, help="T: the cores of the loaded and together runs")
    ap.add_argument("--cells", default="f32:128:2048,bf16:128:4096", help="dtype:hdim:seqlen, comma-separated")
    ap.add_argument("--also", default="", help="NAME=LIB,...: other builds timed on the T cores together too (an A/B)")
    ap.add_argument("--together-only", action="store_true", help="only the T cores together (an A/B with --also)")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pin", default="", help=argparse.SUPPRESS)
    ap.add_argument("--load", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    cpus = distinct_cores()
    t = min(args.cores, len(cpus))
    first, others = cpus[:1], cpus[1:t]
    rows = []
    for cell in args.cells.split(","):
        runs = [("1 core alone", first, None), ("1 core, FMA load on the others", first, "fma"),
                ("1 core, FlashTile load on the others", first, "ft"), (f"{t} cores together", cpus[:t], None)]
        if args.together_only:
            runs = runs[-1:]
        runs += [(f"{t} cores together, {name}", cpus[:t], None, lib)
                 for name, lib in (x.split("=", 1) for x in args.also.split(",") if x)]
        for label, pin, load, *lib in runs:
            gf = measure(args, cell, pin, load, others, lib[0] if lib else args.capi)
            per_core = {k: v / len(pin) for k, v in gf.items()}
            rows.append({"cell": cell, "run": label, "cores": len(pin), "gflops_per_core": per_core})
            print(json.dumps(rows[-1]), flush=True)
    names = list(rows[0]["gflops_per_core"])
    print(f"\nGFLOP/s per core (÷ the same cell's first run), {t} cores, CPUs {cpus[:t]}")
    print("| cell | run | " + " | ".join(names) + " |")
    print("|---|---|" + "---:|" * len(names))
    for r in rows:
        base = next(x for x in rows if x["cell"] == r["cell"])["gflops_per_core"]  # the cell's first run
        print(f"| {r['cell']} | {r['run']} | " + " | ".join(
            f"{r['gflops_per_core'][n]:.1f} ({r['gflops_per_core'][n] / base[n]:.2f})" for n in names) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": cpus[:t], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
