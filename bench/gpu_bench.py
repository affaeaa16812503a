#!/usr/bin/env python3
"""FlashTile's CUDA backend against PyTorch SDPA's flash, efficient and cuDNN backends, in one process.

Shapes (issue 4): bf16, 16k tokens in total (batch = 16384 // seqlen), d_model 2048 (heads = 2048 // hdim),
hdim 64/128/256, seqlen 512..32k, causal and not, forward and backward. Timing: CUDA events around each
call, warm-up first, median of --reps (>= 20) calls. TFLOP/s: forward 4*B*H*S^2*D (halved when causal),
backward 2.5x forward. FlashTile is called through libflashtile_capi.so (ctypes, C ABI over the public
API; see src/capi/capi.cpp) on the same torch tensors the peers read.

    python3 bench/gpu_bench.py --lib build/gpu/src/libflashtile_capi.so --json out.json --md out.md

With --json, bench/plots.py draws the table as out.png beside it (TFLOP/s against seqlen, one line per library).
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class FtTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4),
                ("rank", ctypes.c_int)]


def ft_tensor(t):
    s = FtTensor()
    s.data = t.data_ptr()
    for i in range(t.dim()):
        s.shape[i] = t.shape[i]
        s.stride[i] = t.stride(i)
    s.rank = t.dim()
    return s


class FtVariants(ctypes.Structure):  # include/flashtile/capi.h ft_variants
    _fields_ = [("struct_size", ctypes.c_uint64), ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
                ("softcap", ctypes.c_double)] + [(n, ctypes.POINTER(FtTensor)) for n in (
                    "alibi_slopes", "sinks", "dsinks", "cu_seqlens_q", "cu_seqlens_k", "seqused_k")] + [
                ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_k", ctypes.c_int64)]


_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class FlashTile:
    """ctypes binding of src/capi/capi.cpp. Tensors are torch tensors in FlashTile's (B, S, H, D) layout."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        p = ctypes.POINTER(FtTensor)
        self.lib.ft_forward.argtypes = [p] * 5 + [ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_int,
                                                  ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.ft_forward_ex.argtypes = [p] * 5 + [ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_int,
                                                     ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(FtVariants),
                                                     ctypes.c_char_p, ctypes.c_int]
        self.lib.ft_backward.argtypes = [p] * 9 + [ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_int,
                                                   ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                                   ctypes.c_int]
        self.lib.ft_forward_kvcache.argtypes = [p] * 10 + [ctypes.c_int] * 4 + [ctypes.c_double, ctypes.c_int,
                                                                          ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                                                                          ctypes.c_char_p, ctypes.c_int]
        self.msg = ctypes.create_string_buffer(4096)

    def _dev(self, t):
        return t.device.index if t.is_cuda else -1

    def forward(self, q, k, v, out, lse, causal=False, scale=None, backend="cuda-sm80", strict=True, softcap=0.0,
                alibi_slopes=None):
        ts = [ft_tensor(x) for x in (q, k, v, out, lse)]
        args = [*[ctypes.byref(x) for x in ts], _DTYPES[q.dtype], self._dev(q), math.nan if scale is None else scale,
                int(causal), backend.encode(), int(strict)]
        if softcap or alibi_slopes is not None:  # the score hooks: ft_forward_ex
            var = FtVariants(ctypes.sizeof(FtVariants), -1, -1, softcap)
            if alibi_slopes is not None:
                self._slopes = ft_tensor(alibi_slopes)  # kept alive for the call
                var.alibi_slopes = ctypes.pointer(self._slopes)
            rc = self.lib.ft_forward_ex(*args, ctypes.byref(var), self.msg, len(self.msg))
        else:
            rc = self.lib.ft_forward(*args, self.msg, len(self.msg))
        if rc != 0:
            raise RuntimeError(f"ft_forward failed ({rc}): {self.msg.value.decode()}")
        return self.msg.value.decode()

    def backward(self, q, k, v, out, dout, lse, dq, dk, dv, causal=False, scale=None, deterministic=False,
                 backend="cuda-sm80", strict=True):
        ts = [ft_tensor(x) for x in (q, k, v, out, dout, lse, dq, dk, dv)]
        rc = self.lib.ft_backward(*[ctypes.byref(x) for x in ts], _DTYPES[q.dtype], self._dev(q),
                                  math.nan if scale is None else scale, int(causal), int(deterministic),
                                  backend.encode(), int(strict), self.msg, len(self.msg))
        if rc != 0:
            raise RuntimeError(f"ft_backward failed ({rc}): {self.msg.value.decode()}")
        return self.msg.value.decode()


    def forward_kvcache(self, q, k_cache, v_cache, out, cache_seqlens=None, block_table=None, k_new=None, v_new=None,
                        lse=None, num_splits=0, causal=False, scale=None, backend="auto", strict=False,
                        async_index_check=False):
        """flashtile::forward_kvcache through ft_forward_kvcache; None = absent."""
        opt = lambda x: None if x is None else ctypes.byref(ft_tensor(x))
        rc = self.lib.ft_forward_kvcache(ctypes.byref(ft_tensor(q)), ctypes.byref(ft_tensor(k_cache)),
                                         ctypes.byref(ft_tensor(v_cache)), opt(k_new), opt(v_new), opt(cache_seqlens),
                                         opt(block_table), None, ctypes.byref(ft_tensor(out)), opt(lse), num_splits,
                                         int(async_index_check), _DTYPES[q.dtype], self._dev(q), math.nan if scale is None else scale,
                                         int(causal), backend.encode(), int(strict), None, self.msg, len(self.msg))
        if rc != 0:
            raise RuntimeError(f"ft_forward_kvcache failed ({rc}): {self.msg.value.decode()}")
        return self.msg.value.decode()

    def kvcache_call(self, q, k_cache, v_cache, out, cache_seqlens=None, block_table=None, k_new=None, v_new=None,
                     lse=None, num_splits=0, causal=False, scale=None, backend="auto", strict=False,
                     async_index_check=False):
        """forward_kvcache's call with its C arguments built once: a zero-argument callable that makes only the C ABI
        call (no report text), what a C++ caller's loop pays per step; it raises on an error code."""
        keep = [ft_tensor(x) if x is not None else None for x in (q, k_cache, v_cache, k_new, v_new, cache_seqlens,
                                                                  block_table, out, lse)]
        ref = [ctypes.byref(x) if x is not None else None for x in keep]
        args = ref[:7] + [None] + ref[7:] + [num_splits, int(async_index_check), _DTYPES[q.dtype], self._dev(q),
                                            math.nan if scale is None else scale, int(causal), backend.encode(),
                                            int(strict), None, None, 0]
        fn = self.lib.ft_forward_kvcache

        def call():
            rc = fn(*args)
            if rc != 0:
                raise RuntimeError(f"ft_forward_kvcache failed ({rc})")
        # The structures the pointers point into, and the tensors they point at, live as long as the callable: a
        # caller that keeps only the callable would otherwise leave it reading memory torch's allocator hands out
        # again (decode_chain.py's A/B did: the next cell's tensors and cuDNN's workspace overwrote cache_seqlens).
        call.keep = keep, (q, k_cache, v_cache, out, cache_seqlens, block_table, k_new, v_new, lse)
        return call


def find_lib(arg):
    cands = [arg] if arg else []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for b in ("build/gpu", "build/release", "build"):
        cands.append(os.path.join(root, b, "src", "libflashtile_capi.so"))
    for c in cands:
        if c and os.path.exists(c):
            return c
    sys.exit(f"libflashtile_capi.so not found (tried {cands}); build target flashtile_capi or pass --lib")


def time_ms(fn, reps, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
         "cudnn": SDPBackend.CUDNN_ATTENTION}


def bench_cell(ft, hdim, seqlen, causal, reps, deterministic=False, tokens=16384, d_model=2048):
    b, h = max(1, tokens // seqlen), d_model // hdim
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seqlen * 1000 + hdim + causal)
    mk = lambda: torch.randn(b, seqlen, h, hdim, device=dev, dtype=torch.bfloat16, generator=g)
    q, k, v, dout = mk(), mk(), mk(), mk()
    out, lse = torch.empty_like(q), torch.empty(b, h, seqlen, device=dev, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fwd_flops = 4.0 * b * h * seqlen * seqlen * hdim / (2 if causal else 1)
    res = {"hdim": hdim, "seqlen": seqlen, "batch": b, "heads": h, "causal": causal}
    # FlashTile
    ft.forward(q, k, v, out, lse, causal=causal)
    res["kernel_fwd"] = ft.forward(q, k, v, out, lse, causal=causal).split("\n")[0]
    t = time_ms(lambda: ft.forward(q, k, v, out, lse, causal=causal), reps)
    res["flashtile_fwd_ms"] = t
    res["kernel_bwd"] = ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal).split("\n")[0]
    t = time_ms(lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal), reps)
    res["flashtile_bwd_ms"] = t
    # cuda-sm90 (Hopper): the same call by name, when it can run here.
    try:
        res["kernel_sm90_fwd"] = ft.forward(q, k, v, out, lse, causal=causal, backend="cuda-sm90").split("\n")[0]
        res["sm90_fwd_ms"] = time_ms(lambda: ft.forward(q, k, v, out, lse, causal=causal, backend="cuda-sm90"), reps)
    except RuntimeError as e:
        res["sm90_error"] = str(e).split("\n")[0][:200]
    try:
        bwd90 = lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal, backend="cuda-sm90")
        res["kernel_sm90_bwd"] = bwd90().split("\n")[0]
        res["sm90_bwd_ms"] = time_ms(bwd90, reps)
    except RuntimeError as e:
        res["sm90_bwd_error"] = str(e).split("\n")[0][:200]
    if deterministic:  # the cost of Options::deterministic (dQ added in key-block order), on both backends
        res["flashtile_det_bwd_ms"] = time_ms(
            lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal, deterministic=True), reps)
        if "sm90_bwd_ms" in res:
            res["sm90_det_bwd_ms"] = time_ms(lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal,
                                                                 deterministic=True, backend="cuda-sm90"), reps)
    # Peers on the same data, torch layout (B, H, S, D) as views.
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))
    for name, backend in PEERS.items():
        try:
            with sdpa_kernel(backend):
                qg, kg, vg = (x.detach().requires_grad_(True) for x in (qt, kt, vt))
                t = time_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), reps)
                res[f"{name}_fwd_ms"] = t
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                t = time_ms(lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True), reps)
                res[f"{name}_bwd_ms"] = t
                del o, qg, kg, vg
        except Exception as e:  # a peer that cannot run this shape is reported, not fatal
            res[f"{name}_error"] = str(e).split("\n")[0][:200]
    for key in list(res):
        if key.endswith("_fwd_ms"):
            res[key.replace("_ms", "_tflops")] = fwd_flops / (res[key] * 1e-3) / 1e12
        elif key.endswith("_bwd_ms"):
            res[key.replace("_ms", "_tflops")] = 2.5 * fwd_flops / (res[key] * 1e-3) / 1e12
    del q, k, v, dout, out, lse, dq, dk, dv
    torch.cuda.empty_cache()
    return res


def markdown(meta, rows):
    lines = [f"# FlashTile (cuda-sm80, cuda-sm90) vs PyTorch SDPA on {meta['gpu']}", "",
             f"- date: {meta['date']}", f"- GPU: {meta['gpu']} (torch built for CUDA {meta['cuda']})",
             f"- torch {meta['torch']}, cuDNN {meta['cudnn']}", f"- command: `{meta['command']}`",
             f"- bf16, 16k tokens (batch = 16384 / seqlen), d_model 2048 (heads = 2048 / hdim); CUDA events, "
             f"{meta['warmup']} warm-up calls, median of {meta['reps']}; TFLOP/s: fwd 4·B·H·S²·D (halved causal), "
             "bwd 2.5× fwd; ratio = FlashTile TFLOP/s (the faster of its two backends) ÷ peer TFLOP/s", ""]
    for direction in ("fwd", "bwd"):
        lines += [f"## {'Forward' if direction == 'fwd' else 'Backward'}", "",
                  "| hdim | seqlen | causal | cuda-sm80 TF/s | cuda-sm90 TF/s | flash TF/s | efficient TF/s "
                  "| cuDNN TF/s | ÷flash | ÷efficient | ÷cuDNN |",
                  "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            sm80, sm90 = r.get(f"flashtile_{direction}_tflops"), r.get(f"sm90_{direction}_tflops")
            ft = max(x for x in (sm80, sm90, 0.0) if x is not None) or None
            cells = [str(r["hdim"]), str(r["seqlen"]), "yes" if r["causal"] else "no",
                     f"{sm80:.0f}" if sm80 else "-", f"{sm90:.0f}" if sm90 else "n/a"]
            ratios = []
            for peer in ("flash", "efficient", "cudnn"):
                p = r.get(f"{peer}_{direction}_tflops")
                cells.append(f"{p:.0f}" if p else "n/a")
                ratios.append(f"{ft / p:.2f}" if (p and ft) else "n/a")
            lines.append("| " + " | ".join(cells + ratios) + " |")
        lines.append("")
    if any("flashtile_det_bwd_tflops" in r for r in rows):  # --deterministic: the cost of ordered dQ sums
        lines += ["## Deterministic backward (dQ added in key-block order)", "",
                  "| hdim | seqlen | causal | cuda-sm80 TF/s | ÷ its default | cuda-sm90 TF/s | ÷ its default |",
                  "|---:|---:|:---:|---:|---:|---:|---:|"]
        for r in rows:
            cells = [str(r["hdim"]), str(r["seqlen"]), "yes" if r["causal"] else "no"]
            for det, base in (("flashtile_det_bwd_tflops", "flashtile_bwd_tflops"),
                              ("sm90_det_bwd_tflops", "sm90_bwd_tflops")):
                d, b = r.get(det), r.get(base)
                cells += [f"{d:.0f}" if d else "n/a", f"{d / b:.2f}" if (d and b) else "n/a"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None)
    ap.add_argument("--hdims", default="128,64,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384,32768")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--deterministic", action="store_true", help="also time the deterministic backward")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    assert args.reps >= 20, "median of at least 20 calls"
    ft = FlashTile(find_lib(args.lib))
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda, "torch": torch.__version__,
            "cudnn": str(torch.backends.cudnn.version()), "reps": args.reps, "warmup": 5,
            "command": "python3 bench/gpu_bench.py " + " ".join(sys.argv[1:])}
    rows = []
    for hdim in (int(x) for x in args.hdims.split(",")):
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                r = bench_cell(ft, hdim, seqlen, causal, args.reps, args.deterministic)
                rows.append(r)
                print(f"hdim {hdim:3d} seqlen {seqlen:5d} causal {int(causal)}: "
                      + " ".join(f"{k[:-7]}={r[k]:.0f}" for k in r if k.endswith("_tflops")), flush=True)
                if args.json:  # rewritten after every cell, so a run cut short keeps what it measured
                    with open(args.json, "w") as f:
                        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    rows.sort(key=lambda r: (r["hdim"], r["seqlen"], r["causal"]))
    md = markdown(meta, rows)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    print(md)
    if args.json:  # the same figures as a PNG beside the JSON (bench/plots.py)
        try:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import plots
            print("plot:", ", ".join(plots.plot_file(args.json)))
        except ImportError as e:  # no matplotlib on this machine: `python3 bench/plots.py JSON` draws it later
            print(f"no plot ({e})")


if __name__ == "__main__":
    main()
