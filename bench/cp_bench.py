#!/usr/bin/env python3
"""Context parallelism (issue 15): flashtile.distributed on several GPUs of one host, against one GPU and against
the same ring built from torch SDPA's cuDNN kernels.

    torchrun --nproc-per-node 2 bench/cp_bench.py --out bench/results/h200x2-cp
    torchrun --nproc-per-node 2 bench/cp_bench.py --smoke --out /tmp/cp-smoke     (CPU, gloo, tiny shapes)

Cells: bf16, hdim 128, --heads heads (= KV heads), batch 1, --tokens tokens per GPU (32k-256k), causal with the
zigzag layout and full attention, forward and forward+backward. Per cell (CUDA events, warm-up, median of --reps,
each rep started together on every rank after a barrier, the slowest rank's median taken):
  * ring      flashtile.distributed.ring_flash_attn_func(strategy="ring") on world x tokens;
  * compute   the same ring with the transfers replaced by re-using the local K/V (same shapes, same kernels);
  * comm      the ring's transfers alone (forward: world-1 K/V hops; backward: world-2 K/V hops and world-1
              dK/dV hops in float32, toward the previous rank: ring.backward's order);
  * a2a       strategy="all_to_all" (Ulysses), when the heads divide by the world size;
  * peer      the same ring code with each block's attention and backward done by torch's cuDNN attention ops
              (aten._scaled_dot_product_cudnn_attention and its backward, which return and take the log-sum-exp),
              --peer flash for SDPA's flash kernels instead;
  * single    rank 0 alone: flashtile.flash_attn_func on `tokens` (and the peer kernel), for weak scaling.
  * margins   with --sm-margins M1,M2,...: the ring again with sm_margin=M (the steps with a transfer in flight
              leave M SMs to NCCL); the best margin's time, weak-scaling efficiency and hidden share get columns.
              --nccl-max-ctas N caps the SMs the transfers take (NCCL_MAX_CTAS), to pair with a margin of N.
Figures: per-GPU TFLOP/s (forward 4*B*H*S^2*D, halved when causal; backward 2.5x; S the whole sequence, divided by
the world size), weak-scaling efficiency = per-GPU TFLOP/s of the ring over that of one GPU on `tokens`
(= world * t_single / t_ring), and the hidden share of communication = 1 - max(0, t_ring - t_compute) / t_comm.
Before timing, each cell checks the peer ring's and the all-to-all's outputs against flashtile's ring (max |diff|).
Writes OUT.json, OUT.md and OUT.png (matplotlib; skipped with a note if it is missing).

Run time: each cell times about five ring-sized calls x (--reps + --warmup + a few checks); the work grows as
tokens^2, so 256k tokens per GPU costs 16x the 64k cells. With the defaults on 2 H200s (~500 TF/s assumed) that is
roughly 15 s for 32k, 1 min for 64k, 4 min for 128k and 15 min for 256k: split the run, e.g.
    torchrun --nproc-per-node 2 bench/cp_bench.py --tokens 32768,65536,131072 --out bench/results/h200x2-cp
    torchrun --nproc-per-node 2 bench/cp_bench.py --tokens 262144 --causal 1 --modes fwd_bwd --out .../h200x2-cp-256k
"""
import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

import flashtile
import flashtile.distributed as ftd
from flashtile.distributed import _ring


# --- peer kernels, with flash_attn_func / flash_attn_backward's signatures on (B, S, H, D) tensors --------------

def _bhsd(x):
    return x.transpose(1, 2)


def _peer_ops(kind, device):
    """(forward, backward) doing one block with torch's own kernels; they take and return flashtile's layouts."""
    aten = torch.ops.aten
    empty = torch.empty(0, dtype=torch.int64, device=device)

    def check(causal, window_size, softcap):
        assert window_size == (-1, -1) and softcap == 0.0, "the peer ring runs full and causal blocks only"

    if device.type == "cpu":  # --smoke: the CPU flash kernel of SDPA
        def fwd(q, k, v, softmax_scale, softcap, return_lse, causal, window_size):
            check(causal, window_size, softcap)
            o, lse = aten._scaled_dot_product_flash_attention_for_cpu(_bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal,
                                                                     scale=softmax_scale)
            return _bhsd(o), lse

        def bwd(q, k, v, out, dout, lse, softmax_scale, softcap, causal, window_size):
            check(causal, window_size, softcap)
            g = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out), lse, 0.0, causal, scale=softmax_scale)
            return tuple(_bhsd(x) for x in g)
        return fwd, bwd

    # Non-nested calls: cum_seq_q / cum_seq_k / attn_bias are undefined tensors, which torch.ops takes as None
    # (an empty tensor would be "defined" and read as a nested batch). Dropout is 0: philox tensors are not read.
    lse_dims = []

    if kind == "cudnn":
        def fwd(q, k, v, softmax_scale, softcap, return_lse, causal, window_size):
            check(causal, window_size, softcap)
            r = aten._scaled_dot_product_cudnn_attention(_bhsd(q), _bhsd(k), _bhsd(v), None, True, 0.0, causal,
                                                         False, scale=softmax_scale)
            b, s, h, _ = q.shape
            lse_dims[:] = [r[1].dim()]  # (B, H, S) or (B, H, S, 1), handed back to the backward as it came
            return _bhsd(r[0]), r[1].reshape(b, h, s).float()

        def bwd(q, k, v, out, dout, lse, softmax_scale, softcap, causal, window_size):
            check(causal, window_size, softcap)
            if lse_dims and lse_dims[0] == 4:
                lse = lse.unsqueeze(-1)
            g = aten._scaled_dot_product_cudnn_attention_backward(
                _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out), lse, empty, empty, None, None, None,
                q.shape[1], k.shape[1], 0.0, causal, scale=softmax_scale)
            return tuple(_bhsd(x) for x in g)
        return fwd, bwd

    def fwd(q, k, v, softmax_scale, softcap, return_lse, causal, window_size):  # SDPA's flash (FlashAttention-2)
        check(causal, window_size, softcap)
        r = aten._scaled_dot_product_flash_attention(_bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, False,
                                                     scale=softmax_scale)
        return _bhsd(r[0]), r[1]

    def bwd(q, k, v, out, dout, lse, softmax_scale, softcap, causal, window_size):
        check(causal, window_size, softcap)
        g = aten._scaled_dot_product_flash_attention_backward(
            _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out), lse, None, None, q.shape[1], k.shape[1], 0.0,
            causal, empty, empty, scale=softmax_scale)
        return tuple(_bhsd(x) for x in g)
    return fwd, bwd


@contextlib.contextmanager
def kernels(fwd, bwd):
    """The ring code with another kernel per block: the schedule, transfers and merges stay flashtile's."""
    saved = _ring.flash_attn_func, _ring.flash_attn_backward
    # torch's kernels take no SM margin (the ring passes flashtile's sm_margin to every block call).
    _ring.flash_attn_func = lambda *a, sm_margin=0, **kw: fwd(*a, **kw)
    _ring.flash_attn_backward = lambda *a, sm_margin=0, **kw: bwd(*a, **kw)
    try:
        yield
    finally:
        _ring.flash_attn_func, _ring.flash_attn_backward = saved


@contextlib.contextmanager
def no_transfers():
    """Every 'received' block is the one sent (equal shards: same shapes): the ring's compute alone."""
    saved = _ring.Ring.exchange
    _ring.Ring.exchange = lambda self, send, rows, tags, like, back=False: (list(like), [])
    try:
        yield
    finally:
        _ring.Ring.exchange = saved


# --- timing ------------------------------------------------------------------------------------------------------

class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time_ms(self, fn):
        self.sync()
        if not self.cuda:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)


def measure(timer, fn, reps, warmup, collective=True):
    """Median ms over reps; collective: every rep starts after a barrier, and the slowest rank's median counts."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if collective:
            timer.sync()
            dist.barrier(device_ids=[torch.cuda.current_device()] if timer.cuda else None)
        times.append(timer.time_ms(fn))
    med = statistics.median(times)
    if collective:
        t = torch.tensor([med], dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        med = t.item()
    return med


def _comm_device():
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def flops(b, h, s, d, causal, mode):
    f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd_bwd" else 1.0)


# --- one cell ------------------------------------------------------------------------------------------------------

def step(fn, q, k, v, dout, mode):
    """A closure running fn(q, k, v) forward, or forward and backward."""
    if mode == "fwd":
        def run():
            with torch.no_grad():
                fn(q, k, v)
        return run

    def run():
        for x in (q, k, v):
            x.grad = None
        fn(q, k, v).backward(dout)
    return run


def comm_only(ring, k, v, mode, timer):
    """The ring's transfers alone, as the forward (and backward) posts them."""
    def run():
        kv = (k, v)
        for _ in range(ring.world - 1):
            kv, reqs = ring.exchange(list(kv), k.shape[1], (_ring._TAG_K, _ring._TAG_V), list(kv))
            _ring._wait(reqs)
        if mode == "fwd_bwd":  # the backward: world-2 K/V hops and world-1 dK/dV hops (float32), toward rank r-1
            kv = (k, v)
            for _ in range(ring.world - 2):
                kv, reqs = ring.exchange(list(kv), k.shape[1], (_ring._TAG_K, _ring._TAG_V), list(kv), back=True)
                _ring._wait(reqs)
            acc = [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in range(2)]
            for _ in range(ring.world - 1):
                acc, reqs = ring.exchange(acc, k.shape[1], (_ring._TAG_DK, _ring._TAG_DV), acc, back=True)
                _ring._wait(reqs)
    return run


def cell(a, tokens, causal, mode, device, timer, peer, margins):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(device=device).manual_seed(1000 * rank + tokens)
    shape = (a.batch, tokens, a.heads, a.hdim)
    dtype = torch.float32 if a.smoke else torch.bfloat16
    q, k, v, dout = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4))
    grad = mode == "fwd_bwd"
    q, k, v = (x.requires_grad_(grad) for x in (q, k, v))
    layout = "zigzag" if causal else "contiguous"
    kw = dict(causal=causal, layout=layout)
    ring_fn = lambda q, k, v: ftd.ring_flash_attn_func(q, k, v, strategy="ring", **kw)  # noqa: E731
    a2a_fn = lambda q, k, v: ftd.ring_flash_attn_func(q, k, v, strategy="all_to_all", **kw)  # noqa: E731
    row = dict(tokens_per_gpu=tokens, world=world, causal=causal, layout=layout, mode=mode, heads=a.heads,
               hdim=a.hdim, batch=a.batch, dtype=str(dtype).replace("torch.", ""))
    # Outputs agree before anything is timed.
    with torch.no_grad():
        ref = ring_fn(q, k, v)
        with kernels(*peer):
            try:
                row["peer_max_diff"] = (ring_fn(q, k, v).float() - ref.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001 (recorded; the peer's timing is then skipped)
                row["peer_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        if a.heads % world == 0:
            row["a2a_max_diff"] = (a2a_fn(q, k, v).float() - ref.float()).abs().max().item()
    del ref
    reps, warm = a.reps, a.warmup
    row["ring_ms"] = measure(timer, step(ring_fn, q, k, v, dout, mode), reps, warm)
    if world > 1:
        with no_transfers():
            row["compute_ms"] = measure(timer, step(ring_fn, q, k, v, dout, mode), reps, warm)
        ring = _ring.Ring(None, world, rank, [[tokens]] * world, layout, causal, (-1, -1))
        row["comm_ms"] = measure(timer, comm_only(ring, k.detach(), v.detach(), mode, timer), reps, warm)
    for m in margins:
        fn = lambda q, k, v, m=m: ftd.ring_flash_attn_func(q, k, v, strategy="ring", sm_margin=m, **kw)  # noqa: E731
        row.setdefault("ring_margin_ms", {})[str(m)] = measure(timer, step(fn, q, k, v, dout, mode), reps, warm)
    if a.heads % world == 0:
        row["a2a_ms"] = measure(timer, step(a2a_fn, q, k, v, dout, mode), reps, warm)
    if "peer_error" not in row:
        with kernels(*peer):
            _guard(row, "peer", lambda: measure(timer, step(ring_fn, q, k, v, dout, mode), reps, warm))
    # One GPU on `tokens`: rank 0 alone, the others wait.
    if rank == 0:
        single = lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        row["single_ms"] = measure(timer, step(single, q, k, v, dout, mode), reps, warm, collective=False)
        if "peer_error" not in row:
            peer_single = lambda q, k, v: _PeerSingle.apply(q, k, v, causal, peer)  # noqa: E731
            _guard(row, "peer_single", lambda: measure(timer, step(peer_single, q, k, v, dout, mode), reps, warm,
                                                       collective=False))
    dist.barrier()
    _figures(row, world)
    return row


def _guard(row, key, fn):
    """row[key_ms] = fn(), or row["peer_error"] when the peer kernel refuses (e.g. an op missing from this torch).
    A refusal is raised on every rank alike (same shapes), so the collective timing stays in step."""
    try:
        row[f"{key}_ms"] = fn()
    except (RuntimeError, NotImplementedError, AssertionError) as e:
        row["peer_error"] = f"{key}: {type(e).__name__}: {str(e)[:300]}"


class _PeerSingle(torch.autograd.Function):
    """The peer kernel on one GPU, forward and backward, for its own weak-scaling figure."""
    @staticmethod
    def forward(ctx, q, k, v, causal, peer):
        scale = q.shape[-1] ** -0.5
        out, lse = peer[0](q, k, v, softmax_scale=scale, softcap=0.0, return_lse=True, causal=causal,
                           window_size=(-1, -1))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.peer, ctx.scale = causal, peer, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        g = ctx.peer[1](q, k, v, out, dout.contiguous(), lse, softmax_scale=ctx.scale, softcap=0.0, causal=ctx.causal,
                        window_size=(-1, -1))
        return g[0], g[1], g[2], None, None


def _figures(row, world):
    b, h, d, s = row["batch"], row["heads"], row["hdim"], row["tokens_per_gpu"]
    f_cp = flops(b, h, world * s, d, row["causal"], row["mode"]) / world
    f_one = flops(b, h, s, d, row["causal"], row["mode"])
    for key in ("ring", "compute", "a2a", "peer"):
        if f"{key}_ms" in row:
            row[f"{key}_tflops_per_gpu"] = f_cp / row[f"{key}_ms"] / 1e9
    for key in ("single", "peer_single"):
        if f"{key}_ms" in row:
            row[f"{key}_tflops"] = f_one / row[f"{key}_ms"] / 1e9
    if "single_ms" in row:
        row["weak_scaling_eff"] = row["ring_tflops_per_gpu"] / row["single_tflops"]
    if "peer_single_ms" in row and "peer_ms" in row:
        row["peer_weak_scaling_eff"] = row["peer_tflops_per_gpu"] / row["peer_single_tflops"]
    if "compute_ms" in row and row.get("comm_ms", 0) > 0:
        row["comm_hidden"] = max(0.0, min(1.0, 1 - max(0.0, row["ring_ms"] - row["compute_ms"]) / row["comm_ms"]))
    if row.get("ring_margin_ms"):
        m, ms = min(row["ring_margin_ms"].items(), key=lambda x: x[1])
        row["best_margin"], row["best_margin_ms"] = int(m), ms
        if "single_ms" in row:
            row["best_margin_weak_eff"] = f_cp / ms / 1e9 / row["single_tflops"]
        if "compute_ms" in row and row.get("comm_ms", 0) > 0:
            row["best_margin_comm_hidden"] = max(0.0, min(1.0, 1 - max(0.0, ms - row["compute_ms"]) / row["comm_ms"]))


# --- output ------------------------------------------------------------------------------------------------------

COLS = [("tokens_per_gpu", "tokens/GPU", "{}"), ("causal", "causal", "{}"), ("mode", "pass", "{}"),
        ("ring_ms", "ring ms", "{:.2f}"), ("single_ms", "1 GPU ms", "{:.2f}"),
        ("ring_tflops_per_gpu", "ring TF/GPU", "{:.0f}"), ("single_tflops", "1 GPU TF", "{:.0f}"),
        ("weak_scaling_eff", "weak eff", "{:.0%}"), ("compute_ms", "compute ms", "{:.2f}"),
        ("comm_ms", "comm ms", "{:.2f}"), ("comm_hidden", "comm hidden", "{:.0%}"), ("a2a_ms", "a2a ms", "{:.2f}"),
        ("peer_ms", "peer ring ms", "{:.2f}"), ("peer_tflops_per_gpu", "peer TF/GPU", "{:.0f}"),
        ("peer_weak_scaling_eff", "peer weak eff", "{:.0%}"), ("peer_max_diff", "peer |diff|", "{:.1e}"),
        ("best_margin", "best sm_margin", "{}"), ("best_margin_ms", "ring ms at it", "{:.2f}"),
        ("best_margin_weak_eff", "weak eff at it", "{:.0%}"), ("best_margin_comm_hidden", "comm hidden at it", "{:.0%}")]


def markdown(meta, rows):
    lines = [f"# Context parallelism: {meta['world']} x {meta['device']}", "",
             f"{meta['date']}, `{meta['command']}`, torch {meta['torch']}, flashtile {meta['flashtile']}, "
             f"peer = {meta['peer']}, NCCL_MAX_CTAS = {meta.get('nccl_max_ctas', 'default')}. bf16 unless --smoke; batch {meta['batch']}, {meta['heads']} heads, hdim "
             f"{meta['hdim']}; causal cells use the zigzag layout, full ones contiguous. Median of {meta['reps']} "
             "(slowest rank). TF/GPU counts the useful FLOPs of the whole sequence divided by the world size.", "",
             "| " + " | ".join(c[1] for c in COLS) + " |", "|" + "---|" * len(COLS)]
    cols = [c for c in COLS if any(c[0] in r for r in rows)]  # the margin columns only when swept
    lines[-2:] = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt.format(r[key]) if key in r else "" for key, _, fmt in cols) + " |")
    swept = [r for r in rows if r.get("ring_margin_ms")]
    if swept:
        lines += ["", "Ring ms by sm_margin (same cells, same order): " + "; ".join(
            ", ".join(f"{m}: {ms:.2f}" for m, ms in r["ring_margin_ms"].items()) for r in swept)]
    errors = {r["peer_error"] for r in rows if "peer_error" in r}
    lines += [""] + [f"peer error: {e}" for e in sorted(errors)]
    return "\n".join(lines) + "\n"


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is missing: {path} not drawn")
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for causal in (True, False):
        for mode, style in (("fwd", "--"), ("fwd_bwd", "-")):
            sel = [r for r in rows if r["causal"] == causal and r["mode"] == mode]
            if not sel:
                continue
            x = [r["tokens_per_gpu"] for r in sel]
            label = f"{'causal (zigzag)' if causal else 'full'} {mode}"
            color = "C0" if causal else "C1"
            axes[0].plot(x, [r.get("weak_scaling_eff", float("nan")) * 100 for r in sel], style, color=color,
                         marker="o", label=f"FlashTile {label}")
            axes[0].plot(x, [r.get("peer_weak_scaling_eff", float("nan")) * 100 for r in sel], style, color=color,
                         marker="x", alpha=0.5, label=f"cuDNN ring {label}")
            axes[1].plot(x, [r.get("ring_tflops_per_gpu", float("nan")) for r in sel], style, color=color,
                         marker="o", label=f"FlashTile ring {label}")
            axes[1].plot(x, [r.get("peer_tflops_per_gpu", float("nan")) for r in sel], style, color=color,
                         marker="x", alpha=0.5, label=f"cuDNN ring {label}")
    axes[0].axhline(90, color="grey", lw=0.8)
    axes[0].set(xscale="log", xlabel="tokens per GPU", ylabel="weak-scaling efficiency %", ylim=(0, 110),
                title="world x tokens vs 1 GPU x tokens")
    axes[1].set(xscale="log", xlabel="tokens per GPU", ylabel="TFLOP/s per GPU", title="ring, per GPU")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="32768,65536,131072,262144", help="tokens per GPU, comma-separated")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--causal", default="1,0", help="1 = causal (zigzag), 0 = full (contiguous)")
    ap.add_argument("--modes", default="fwd,fwd_bwd")
    ap.add_argument("--peer", default="cudnn", choices=("cudnn", "flash"))
    ap.add_argument("--smoke", action="store_true", help="CPU processes with gloo, float32, tiny shapes")
    ap.add_argument("--sm-margins", default="", help="also time the ring with each sm_margin, comma-separated")
    ap.add_argument("--nccl-max-ctas", type=int, default=0,
                    help="NCCL_MAX_CTAS for this run's communicators (0: NCCL's default): fewer SMs held by the "
                         "transfers, to pair with --sm-margins")
    ap.add_argument("--out", default="cp_bench", help="writes OUT.json, OUT.md, OUT.png")
    a = ap.parse_args()
    if a.smoke:
        a.tokens, a.heads, a.hdim = (a.tokens if a.tokens != ap.get_default("tokens") else "64,128"), 2, 32
        a.reps, a.warmup = min(a.reps, 3), 1
    if a.nccl_max_ctas > 0:  # read by NCCL when the communicators are made, i.e. after this
        os.environ["NCCL_MAX_CTAS"] = str(a.nccl_max_ctas)
    dist.init_process_group("gloo" if a.smoke else "nccl")
    if a.smoke:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    timer = Timer(device)
    peer = _peer_ops(a.peer, device)
    margins = [int(x) for x in a.sm_margins.split(",") if x]
    rows = []
    for tokens in [int(x) for x in a.tokens.split(",")]:
        for causal in [x == "1" for x in a.causal.split(",")]:
            for mode in a.modes.split(","):
                row = cell(a, tokens, causal, mode, device, timer, peer, margins)
                rows.append(row)
                if dist.get_rank() == 0:
                    print(json.dumps(row), flush=True)
    if dist.get_rank() == 0:
        meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    command="torchrun --nproc-per-node %d bench/cp_bench.py %s" % (
                        dist.get_world_size(), " ".join(sys.argv[1:])),
                    world=dist.get_world_size(), torch=torch.__version__, flashtile=flashtile.__version__,
                    device=(torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.processor() or "CPU"),
                    peer=a.peer if not a.smoke else "SDPA CPU flash kernel", heads=a.heads, hdim=a.hdim,
                    batch=a.batch, reps=a.reps, nccl_max_ctas=os.environ.get("NCCL_MAX_CTAS", "default"))
        with open(a.out + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(markdown(meta, rows))
        plot(rows, a.out + ".png")
        print(markdown(meta, rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
