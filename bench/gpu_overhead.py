#!/usr/bin/env python3
"""Per-call host overhead of FlashTile's torch entry point next to torch SDPA, on a tiny CUDA shape, in one process.

Rows: flashtile (eager calls through flashtile._torch_ext when it loaded: C++ autograd node), flashtile_python_door
(the same calls through the Python autograd.Function that serves where the extension is absent), torch SDPA.

A tiny call (B=1, S=128, 8 heads, D=64, bf16) runs in a few microseconds on the GPU, so a loop of such calls is
bound by the host: the time per call is what a training loop of many small layers, or an uncaptured decode step,
pays each time. Measured: wall time per call over a loop of --loop calls (synchronised before and after), median of
--repeats rounds in which every library runs one loop (an order drawn per round), after a warm-up; forward alone and forward + backward (out.backward(dout), the same for every
library). Peers: torch SDPA with its default choice and with each backend forced (flash, efficient, cuDNN).

  --components   also times the pieces of FlashTile's call (allocation, the C++ call with outputs given, the
                 custom op) so the remaining host time can be attributed
  --profile      cProfile of FlashTile's forward + backward loop (top functions by own time)
  --json PATH    writes the figures (and the machine, torch version, date) for bench/results/
"""
import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtile
from flashtile import _torch_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import shuffled_rounds  # noqa: E402


def per_call_us(fn, loop, repeats, warmup=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loop):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / loop * 1e6)
    return statistics.median(times)


LIBS = ("flashtile", "flashtile_python_door", "torch_sdpa", "torch_flash", "torch_efficient", "torch_cudnn")


def interleaved(fns, loop, repeats, warmup=50):
    """Median us per call of each fn, measured in rounds that visit every fn once (ab_common.shuffled_rounds), so that
    drift of the host's speed during the run (seen at +-50 % between runs on the H200 host) hits every library alike.
    A library whose call fails gets None and is reported."""
    ok = {}
    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            ok[name] = fn
        except Exception as e:  # e.g. a torch backend that cannot run this shape
            print(f"  {name}: {type(e).__name__}: {e}")
    torch.cuda.synchronize()

    def per_call_us(fn):
        t0 = time.perf_counter()
        for _ in range(loop):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / loop * 1e6

    times = shuffled_rounds(ok, repeats, per_call_us)
    return {name: statistics.median(times[name]) if name in times else None for name in fns}


def make_inputs(b, s, h, d, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda: torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    q, k, v, dout = mk(), mk(), mk(), mk()
    return q, k, v, dout


def calls(q, k, v, dout, causal):
    """{name: (forward fn, forward+backward fn)}; FlashTile in (B, S, H, D), torch SDPA in (B, H, S, D)."""
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))
    qtg, ktg, vtg = (x.detach().clone().requires_grad_(True) for x in (qt, kt, vt))

    def ft_fwd():
        flashtile.flash_attn_func(q, k, v, causal=causal)

    def ft_fwd_bwd():
        flashtile.flash_attn_func(qg, kg, vg, causal=causal).backward(dout)

    def sdpa(backend):
        def fwd():
            with sdpa_kernel(backend) if backend else _null():
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def fwd_bwd():
            with sdpa_kernel(backend) if backend else _null():
                F.scaled_dot_product_attention(qtg, ktg, vtg, is_causal=causal).backward(dot)
        return fwd, fwd_bwd

    def python_door(fn):
        """The same call through the Python autograd.Function door (as where flashtile._torch_ext is absent)."""
        def run():
            saved, _torch_ops._ext = _torch_ops._ext, None
            try:
                fn()
            finally:
                _torch_ops._ext = saved
        return run

    out = {"flashtile": (ft_fwd, ft_fwd_bwd), "flashtile_python_door": (python_door(ft_fwd), python_door(ft_fwd_bwd)),
           "torch_sdpa": sdpa(None)}
    for name, be in (("torch_flash", SDPBackend.FLASH_ATTENTION), ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)):
        out[name] = sdpa(be)
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def components(q, k, v, loop, repeats):
    """The pieces of FlashTile's forward, each timed alone."""
    from flashtile import _core
    b, s, h, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    r = {
        "torch.empty x2 (out, lse)": lambda: (torch.empty_like(q), torch.empty(b, h, s, device="cuda",
                                                                              dtype=torch.float32)),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "DLPack import only (_core explain, 5 tensors)": lambda: _core.forward(q, k, v, out, lse, explain=True),
        "_core.forward, outputs given": lambda: _core.forward(q, k, v, out, lse),
    }
    if hasattr(_core, "forward_torch"):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout = torch.randn_like(q)
        ws = lambda n: torch.empty(n, dtype=torch.uint8, device=q.device)  # noqa: E731
        r["_core.forward_torch, outputs given"] = lambda: _core.forward_torch(q, k, v, out, lse, None, False, "auto",
                                                                              False, stream)
        r["_core.backward_torch, outputs given"] = lambda: _core.backward_torch(
            q, k, v, out, dout, lse, dq, dk, dv, None, False, "auto", False, False, stream, ws)
        r["torch.empty x3 (dq, dk, dv)"] = lambda: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    res = {}
    for name, fn in r.items():
        try:
            res[name] = per_call_us(fn, loop, repeats)
        except Exception as e:  # a piece the current package lacks
            res[name] = f"failed: {type(e).__name__}: {e}"
    return res


def capture(q, k, v, dout, causal):
    """Captures forward and forward + backward in CUDA graphs, replays them on new inputs, compares with eager."""
    res = {}
    sq, sk, sv = (x.clone() for x in (q, k, v))
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                flashtile.flash_attn_func(sq, sk, sv, causal=causal)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o = flashtile.flash_attn_func(sq, sk, sv, causal=causal)
        for x, y in zip((sq, sk, sv), (k, v, q)):
            x.copy_(y)
        g.replay()
        torch.cuda.synchronize()
        ref = flashtile.flash_attn_func(k, v, q, causal=causal)
        res["forward"] = "ok, replay == eager" if torch.equal(o, ref) else \
            f"MISMATCH max {(o.float() - ref.float()).abs().max().item():.3g}"
        res["forward replay us/call"] = per_call_us(g.replay, 200, 20)
    except Exception as e:
        res["forward"] = f"failed: {type(e).__name__}: {e}"
    try:
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        sd = dout.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                flashtile.flash_attn_func(qg, kg, vg, causal=causal, deterministic=True).backward(sd)
        torch.cuda.current_stream().wait_stream(s)
        for x in (qg, kg, vg):
            x.grad = None
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o = flashtile.flash_attn_func(qg, kg, vg, causal=causal, deterministic=True)
            o.backward(sd)
        with torch.no_grad():
            for x, y in zip((qg, kg, vg, sd), (v, q, k, dout.flip(1))):
                x.copy_(y)
        g.replay()
        torch.cuda.synchronize()
        ref = [x.detach().clone().requires_grad_(True) for x in (v, q, k)]
        ro = flashtile.flash_attn_func(*ref, causal=causal, deterministic=True)
        ro.backward(dout.flip(1))
        same = torch.equal(o, ro) and all(torch.equal(x.grad, y.grad) for x, y in zip((qg, kg, vg), ref))
        res["forward+backward"] = "ok, replay == eager" if same else "MISMATCH"
        res["forward+backward replay us/call"] = per_call_us(g.replay, 200, 20)
    except Exception as e:
        res["forward+backward"] = f"failed: {type(e).__name__}: {e}"
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--hdim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--loop", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--components", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v, dout = make_inputs(a.batch, a.seqlen, a.heads, a.hdim, torch.bfloat16)
    shape = f"B={a.batch} S={a.seqlen} H={a.heads} D={a.hdim} bf16 causal={int(a.causal)}"
    print(f"flashtile eager door: {flashtile.torch_extension()}")
    print(f"per-call wall time, {shape}, median of {a.repeats} interleaved rounds of {a.loop} calls each "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__})")
    rows = {name: {} for name in LIBS}
    fns = calls(q, k, v, dout, a.causal)
    for what, idx in (("fwd_us", 0), ("fwd_bwd_us", 1)):
        got = interleaved({name: fns[name][idx] for name in LIBS}, a.loop, a.repeats)
        for name in LIBS:
            rows[name][what] = got[name]
    ref = rows["torch_sdpa"]
    print(f"{'library':<16} {'fwd us':>8} {'/sdpa':>6} {'fwd+bwd us':>11} {'/sdpa':>6}")
    for name, row in rows.items():
        f, fb = row.get("fwd_us"), row.get("fwd_bwd_us")
        rf = f"{f / ref['fwd_us']:6.2f}" if f and ref.get("fwd_us") else "   n/a"
        rfb = f"{fb / ref['fwd_bwd_us']:6.2f}" if fb and ref.get("fwd_bwd_us") else "   n/a"
        print(f"{name:<16} {f or 0:8.1f} {rf} {fb or 0:11.1f} {rfb}")
    result = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": shape,
                       "loop": a.loop, "repeats": a.repeats, "command": " ".join(sys.argv)},
              "rows": rows}
    if a.components:
        comp = components(q, k, v, a.loop, a.repeats)
        print("components of FlashTile's forward (us per call):")
        for name, t in comp.items():
            print(f"  {name:<58} {t if isinstance(t, str) else f'{t:8.2f}'}")
        result["components"] = comp
    cap = capture(q, k, v, dout, a.causal)
    print("CUDA graph capture:", cap)
    result["capture"] = cap
    if a.profile:
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            flashtile.flash_attn_func(qg, kg, vg, causal=a.causal).backward(dout)
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
