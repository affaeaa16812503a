#!/usr/bin/env python3
"""FlashTile's CUDA backend against PyTorch SDPA's flash, efficient and cuDNN backends, in one process.

Shapes (issue 4): bf16, 16k tokens in total (batch = 16384 // seqlen), d_model 2048 (heads = 2048 // hdim),
hdim 64/128/256, seqlen 512..32k, causal and not, forward and backward. Timing: CUDA events around each
call, synchronised after it (the call's host work counts), warm-up first, median of --reps (>= 20) calls, the
libraries interleaved: one call of each per round, in a random order drawn per round. TFLOP/s: forward
4*B*H*S^2*D (halved when causal), backward 2.5x forward. FlashTile is called as its users call it from Python,
through the package's torch op (flashtile.flash_attn_func, backward by torch.autograd.grad as for SDPA), on the same
torch tensors the peers read; `--door capi` (or a machine without the package) calls the C ABI through ctypes
instead (libflashtile_capi.so, src/capi/capi.cpp: tensor structures built per call in Python, the dispatch report
formatted per call). The C ABI also gives each cell's dispatch report (the kernel names in the JSON).

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import sdpa_peer, shuffled_rounds  # noqa: E402

WARMUP = 3  # calls of each library before its timed ones


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
                ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_k", ctypes.c_int64), ("sm_margin", ctypes.c_int64)]


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
                alibi_slopes=None, sm_margin=0):
        ts = [ft_tensor(x) for x in (q, k, v, out, lse)]
        args = [*[ctypes.byref(x) for x in ts], _DTYPES[q.dtype], self._dev(q), math.nan if scale is None else scale,
                int(causal), backend.encode(), int(strict)]
        if softcap or alibi_slopes is not None or sm_margin:  # the score hooks or an SM margin: ft_forward_ex
            # sm_margin is the struct's second version: a library older than it refuses a nonzero one by name.
            var = FtVariants(ctypes.sizeof(FtVariants), -1, -1, softcap)
            var.sm_margin = sm_margin
            if alibi_slopes is not None:
                self._slopes = ft_tensor(alibi_slopes)  # kept alive for the call
                var.alibi_slopes = ctypes.pointer(self._slopes)
            rc = self.lib.ft_forward_ex(*args, ctypes.byref(var), self.msg, len(self.msg))
        else:
            rc = self.lib.ft_forward(*args, self.msg, len(self.msg))
        if rc != 0:
            raise RuntimeError(f"ft_forward failed ({rc}): {self.msg.value.decode()}")
        return self.msg.value.decode()

    def forward_call(self, q, k, v, out, lse, causal=False, scale=None, backend="auto", strict=False):
        """forward's call with its C arguments built once and no report text: a zero-argument callable that makes
        only the C ABI call, what a C++ caller pays per call (kvcache_call's counterpart); it raises on an error."""
        keep = [ft_tensor(x) for x in (q, k, v, out, lse)]
        args = [*[ctypes.byref(x) for x in keep], _DTYPES[q.dtype], self._dev(q), math.nan if scale is None else scale,
                int(causal), backend.encode(), int(strict), None, 0]
        fn = self.lib.ft_forward

        def call():
            rc = fn(*args)
            if rc != 0:
                raise RuntimeError(f"ft_forward failed ({rc})")
        call.keep = keep, (q, k, v, out, lse)  # as kvcache_call: the structures and tensors live with the callable
        return call

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
    return statistics.median(call_times_ms(fn, reps, warmup))


def call_times_ms(fn, reps, warmup=5):
    """reps per-call times (ms): CUDA events around each call, synchronised after it, so that the host work of the
    call (argument checks, dispatch, launches) counts as it does for a caller that waits for its result."""
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
    return times


def interleaved_median_ms(calls, reps, seed, warmup=WARMUP):
    """{name: median ms of reps calls}: every library warmed up, then reps rounds of one timed call each, the
    libraries in an order drawn at random per round (ab_common.shuffled_rounds): in a fixed or rotated order one
    library always follows the same one (cuDNN after the slow efficient kernel), and the GPU's clock and power state,
    which the preceding work sets, would favour some libraries over others."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = shuffled_rounds(calls, reps, lambda fn: call_times_ms(fn, 1, warmup=0)[0], seed)
    return {n: statistics.median(t) for n, t in times.items()}


PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
         "cudnn": SDPBackend.CUDNN_ATTENTION}


def flashtile_package():
    """The flashtile Python package (its torch op), or None where it is not importable."""
    try:
        import flashtile
        return flashtile
    except ImportError:
        return None


def ft_calls(ft, pkg, q, k, v, out, lse, dout, dq, dk, dv, causal, backend, deterministic=False):
    """(forward, backward) zero-argument calls of FlashTile on `backend`. With the package (door "torch"): its torch
    op flash_attn_func and torch.autograd.grad, as the SDPA peers are called; without (door "capi"): the C ABI
    through ctypes, arguments converted per call."""
    if pkg is None:
        return (lambda: ft.forward(q, k, v, out, lse, causal=causal, backend=backend),
                lambda: ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal, backend=backend,
                                    deterministic=deterministic))
    kw = dict(causal=causal, backend=backend, strict=True, deterministic=deterministic)
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
    o = pkg.flash_attn_func(qg, kg, vg, **kw)
    return (lambda: pkg.flash_attn_func(q, k, v, **kw),
            lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True))


def bench_cell(ft, hdim, seqlen, causal, reps, deterministic=False, tokens=16384, d_model=2048, pkg=None):
    b, h = max(1, tokens // seqlen), d_model // hdim
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seqlen * 1000 + hdim + causal)
    mk = lambda: torch.randn(b, seqlen, h, hdim, device=dev, dtype=torch.bfloat16, generator=g)
    q, k, v, dout = mk(), mk(), mk(), mk()
    out, lse = torch.empty_like(q), torch.empty(b, h, seqlen, device=dev, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fwd_flops = 4.0 * b * h * seqlen * seqlen * hdim / (2 if causal else 1)
    res = {"hdim": hdim, "seqlen": seqlen, "batch": b, "heads": h, "causal": causal}
    fwd, bwd = {}, {}
    # FlashTile on each CUDA backend by name (strict: a refusal is reported, not timed on another backend); the
    # dispatch report's first line names the kernel.
    for key, backend in (("flashtile", "cuda-sm80"), ("sm90", "cuda-sm90")):
        err = "sm90_error" if key == "sm90" else "flashtile_error"
        try:
            res[f"kernel_{key}_fwd"] = ft.forward(q, k, v, out, lse, causal=causal, backend=backend).split("\n")[0]
            res[f"kernel_{key}_bwd"] = ft.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=causal,
                                                   backend=backend).split("\n")[0]
            fwd[key], bwd[key] = ft_calls(ft, pkg, q, k, v, out, lse, dout, dq, dk, dv, causal, backend)
            if pkg is not None and key == "sm90":  # the same kernels through ctypes, for the door's share (JSON only)
                fwd["sm90capi"], bwd["sm90capi"] = ft_calls(ft, None, q, k, v, out, lse, dout, dq, dk, dv, causal,
                                                            backend)
            if deterministic:  # the cost of Options::deterministic (dQ added in key-block order)
                bwd[f"{key}_det"] = ft_calls(
                    ft, pkg, q, k, v, out, lse, dout, dq, dk, dv, causal, backend, deterministic=True)[1]
        except RuntimeError as e:
            res[err] = str(e).split("\n")[0][:200]
    # Peers on the same data, torch layout (B, H, S, D) as views.
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))
    for name, backend in PEERS.items():
        try:
            f = sdpa_peer(backend, qt, kt, vt, dot, causal, "fwd")
            bk = sdpa_peer(backend, qt, kt, vt, dot, causal, "bwd")
            f(), bk()  # a peer that cannot run this shape raises here
            fwd[name], bwd[name] = f, bk
        except Exception as e:  # a peer that cannot run this shape is reported, not fatal
            res[f"{name}_error"] = str(e).split("\n")[0][:200]
    for direction, calls in (("fwd", fwd), ("bwd", bwd)):
        for name, ms in interleaved_median_ms(calls, reps, seed=seqlen * 1000 + hdim + causal).items():
            res[f"{name}_{direction}_ms"] = ms
    for key in list(res):
        if key.endswith("_fwd_ms"):
            res[key.replace("_ms", "_tflops")] = fwd_flops / (res[key] * 1e-3) / 1e12
        elif key.endswith("_bwd_ms"):
            res[key.replace("_ms", "_tflops")] = 2.5 * fwd_flops / (res[key] * 1e-3) / 1e12
    del fwd, bwd, q, k, v, dout, out, lse, dq, dk, dv
    torch.cuda.empty_cache()
    return res


def markdown(meta, rows):
    lines = [f"# FlashTile (cuda-sm80, cuda-sm90) vs PyTorch SDPA on {meta['gpu']}", "",
             f"- date: {meta['date']}", f"- GPU: {meta['gpu']} (torch built for CUDA {meta['cuda']})",
             f"- torch {meta['torch']}, cuDNN {meta['cudnn']}", f"- command: `{meta['command']}`",
             f"- FlashTile called through: {meta.get('door', 'C ABI through ctypes')}",
             f"- bf16, 16k tokens (batch = 16384 / seqlen), d_model 2048 (heads = 2048 / hdim); CUDA events around "
             f"each call, synchronised after it, {meta['warmup']} warm-up calls, median of {meta['reps']}"
             + (", interleaved: one call of each library per round, in an order drawn at random per round"
                if meta.get("order") == "interleaved" else "")
             + "; TFLOP/s: fwd 4·B·H·S²·D (halved causal), "
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
    ap.add_argument("--causal", choices=("both", "0", "1"), default="both", help="the cells without (0) or with (1) "
                    "the causal mask, or both")
    ap.add_argument("--door", choices=("torch", "capi"), default="torch",
                    help="how FlashTile is called: its torch op (falls back to capi without the package) or ctypes")
    ap.add_argument("--deterministic", action="store_true", help="also time the deterministic backward")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    assert args.reps >= 20, "median of at least 20 calls"
    ft = FlashTile(find_lib(args.lib))
    pkg = flashtile_package() if args.door == "torch" else None
    door = (f"torch op flashtile.flash_attn_func ({pkg.torch_extension()})" if pkg is not None
            else "C ABI through ctypes (arguments converted per call)")
    meta = {"door": door, "order": "interleaved", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda, "torch": torch.__version__,
            "cudnn": str(torch.backends.cudnn.version()), "reps": args.reps, "warmup": WARMUP,
            "command": "python3 bench/gpu_bench.py " + " ".join(sys.argv[1:])}
    rows = []
    for hdim in (int(x) for x in args.hdims.split(",")):
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            for causal in {"both": (False, True), "0": (False,), "1": (True,)}[args.causal]:
                r = bench_cell(ft, hdim, seqlen, causal, args.reps, args.deterministic, pkg=pkg)
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
