#!/usr/bin/env python3
"""The variants on the GPU (issue 12): sliding window, softcap, ALiBi, sinks and packed (varlen) batches, FlashTile
(flashtile.flash_attn_func / flash_attn_varlen_func on torch tensors) against torch's FlexAttention (compiled,
with the equivalent block mask and score_mod) and, for the plain cells, torch SDPA's flash backend, in one process.

Cells (bf16, 16 heads, hdim 128 by default):
  full_4k, causal_4k        plain calls, B=4, S=4096 (the peers' home ground)
  window_32k                S=32768, causal with window (4095, 0): every row sees <= 4096 keys, as in full_4k
  softcap/alibi/sinks_4k    causal_4k with each score hook (FlexAttention has no sinks: n/a)
  varlen_mixed              64 causal sequences, lengths drawn from 128..8192 (seeded), packed
  varlen_equal              one batch of equal lengths with the same total causal work
  varlen_padded             the mixed batch padded to its longest sequence (B=64, S=max): what padding costs
Timing: CUDA events around each call, warm-up first, median of --reps (>= 20). forward, and forward+backward
(out.backward(dout)); backward = the difference of the medians. TFLOP/s count only visible score elements:
forward 4·H·D per element, backward 2.5× that (the padded cell counts the mixed batch's useful work).

    python3 bench/gpu_variants.py --json out.json --md out.md
    python3 bench/gpu_variants.py --plot out.md          (matplotlib: out.png beside it, from the tables)
"""
import argparse
import datetime
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

import flashtile

sys.path.insert(0, __import__("os").path.dirname(__file__))
from gpu_bench import time_ms  # noqa: E402  (CUDA events around each call, median)


def visible_pairs(sq, sk, causal=False, window=(-1, -1)):
    """Number of (query, key) pairs the mask lets through, from the definition."""
    i = np.arange(sq, dtype=np.int64)
    diag = i + sk - sq
    left, right = window
    right = 0 if causal else right
    lo = np.zeros_like(i) if left < 0 else np.clip(diag - left, 0, sk)
    hi = np.full_like(i, sk) if right < 0 else np.clip(diag + right + 1, 0, sk)
    return int(np.maximum(hi - lo, 0).sum())


def rand(*shape, grad=True):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)


def measure(fwd, inputs, dout, reps):
    """(forward ms, backward ms) of fwd(*inputs) -> out."""
    def f():
        with torch.no_grad():
            fwd(*inputs)

    def fb():
        fwd(*inputs).backward(dout)
    t_f = time_ms(f, reps, warmup=3)
    t_fb = time_ms(fb, reps, warmup=3)
    for x in inputs:
        x.grad = None
    return t_f, max(t_fb - t_f, 0.0)


# --- FlexAttention peers -------------------------------------------------------------------------------------

_FLEX = None

def flex_fn(sq, sk, causal, window, softcap, alibi, doc=None):
    """A compiled FlexAttention call on (B, S, H, D) tensors (transposed inside), or None where it has no
    equivalent (sinks). doc: [total] int32 sequence ids of a packed batch (document mask)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    off = sk - sq
    left, right = window
    right = 0 if causal else right

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx + off - kv_idx  # >= 0: key at or before the diagonal
        m = (d >= -right) if right >= 0 else (d == d)
        if left >= 0:
            m = m & (d <= left)
        if doc is not None:
            m = m & (doc[q_idx] == doc[kv_idx])
        return m

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap > 0:
            score = softcap * torch.tanh(score / softcap)
        if alibi is not None:
            score = score - alibi[h] * (q_idx + off - kv_idx).abs()
        return score

    needs_mask = causal or left >= 0 or right >= 0 or doc is not None
    # _compile: build the block mask blockwise (a packed batch of 260k tokens would otherwise materialise S).
    block_mask = create_block_mask(mask_mod, None, None, sq, sk, device="cuda", _compile=True) if needs_mask else None
    hooked = softcap > 0 or alibi is not None
    global _FLEX
    if _FLEX is None:
        # One compiled function for every cell; each (mask, score_mod, grad mode) is a recompile, so the limit is
        # raised (past it torch silently runs the unfused, S-materialising implementation).
        torch._dynamo.config.recompile_limit = 64
        torch._dynamo.config.cache_size_limit = 64
        _FLEX = torch.compile(flex_attention, dynamic=False)
    compiled = _FLEX

    def run(q, k, v):
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod if hooked else None,
                       block_mask=block_mask)
        return out.transpose(1, 2)
    return run


def sdpa_flash(causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)
    return run


# --- cells ---------------------------------------------------------------------------------------------------

def dense_cell(name, b, s, h, d, reps, peers, causal=False, window=(-1, -1), softcap=0.0, alibi=False, sinks=False):
    q, k, v = rand(b, s, h, d), rand(b, s, h, d), rand(b, s, h, d)
    dout = torch.randn_like(q)
    slopes = torch.rand(h, device="cuda", dtype=torch.float32) * 0.1 if alibi else None
    sink = torch.randn(h, device="cuda", dtype=torch.float32, requires_grad=True) if sinks else None

    def ft(q, k, v):
        return flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                         alibi_slopes=slopes, sinks=sink, strict=True)
    work = b * visible_pairs(s, s, causal, window) * 4 * h * d
    row = {"cell": name, "shape": f"B={b} S={s} H={h} D={d}", "work_fwd": work}
    row["flashtile"] = measure(ft, (q, k, v), dout, reps)
    row["kernel"] = str(flashtile.last_dispatch().ran.kernel)
    if "flex" in peers:
        row["flex"] = None if sinks else measure(flex_fn(s, s, causal, window, softcap, slopes), (q, k, v), dout, reps)
    if "sdpa_flash" in peers and not (softcap or alibi or sinks or window != (-1, -1)):
        row["sdpa_flash"] = measure(sdpa_flash(causal), (q, k, v), dout, reps)
    return row


def varlen_cells(h, d, reps, peers, n=64, lo=128, hi=8192, seed=0):
    lens = np.random.default_rng(seed).integers(lo, hi + 1, size=n)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    total, longest = int(lens.sum()), int(lens.max())
    work = sum(visible_pairs(int(x), int(x), True) for x in lens) * 4 * h * d
    q, k, v = rand(total, h, d), rand(total, h, d), rand(total, h, d)
    dout = torch.randn_like(q)

    def ft(q, k, v):
        return flashtile.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True, strict=True)
    rows = [{"cell": "varlen_mixed", "shape": f"{n} seqs {lo}..{hi} (total {total}) H={h} D={d}", "work_fwd": work,
             "flashtile": measure(ft, (q, k, v), dout, reps), "kernel": str(flashtile.last_dispatch().ran.kernel)}]
    if "flex" in peers:
        doc = torch.repeat_interleave(torch.arange(n, device="cuda", dtype=torch.int32),
                                      torch.as_tensor(lens, device="cuda"))
        flex = flex_fn(total, total, True, (-1, -1), 0.0, None, doc)
        rows[0]["flex"] = measure(lambda q, k, v: flex(q[None], k[None], v[None])[0], (q, k, v), dout, reps)
    # Equal lengths, same total causal work: S with n * S^2 / 2 ~= the mixed batch's pairs.
    s_eq = int(round(math.sqrt(2 * work / (4 * h * d) / n)))
    eq = dense_cell("varlen_equal", n, s_eq, h, d, reps, (), causal=True)
    eq["work_fwd"] = n * visible_pairs(s_eq, s_eq, True) * 4 * h * d
    pad = dense_cell("varlen_padded", n, longest, h, d, reps, (), causal=True)
    pad["work_fwd"] = work  # useful work only: the padding is waste
    return rows + [eq, pad]


def tflops(work, ms):
    return work / (ms * 1e-3) / 1e12 if ms else 0.0


def markdown(meta, rows):
    libs = ["flashtile", "flex", "sdpa_flash"]
    out = [f"Date {meta['date']}; {meta['gpu']}; torch {meta['torch']}; command `{meta['command']}`; "
           f"median of {meta['reps']} calls; TFLOP/s over visible score elements (fwd 4·H·D each, bwd 2.5×).", "",
           "| cell | shape | FlashTile fwd | bwd | FlexAttention fwd | bwd | FT/Flex fwd | bwd | SDPA flash fwd | bwd |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cols = {}
        for lib in libs:
            t = r.get(lib)
            cols[lib] = (tflops(r["work_fwd"], t[0]), tflops(2.5 * r["work_fwd"], t[1])) if t else None
        ft, fl, sd = cols["flashtile"], cols["flex"], cols["sdpa_flash"]
        fmt = lambda p, i: f"{p[i]:.0f}" if p else "n/a"  # noqa: E731
        ratio = lambda i: f"{ft[i] / fl[i]:.2f}" if fl and fl[i] else "n/a"  # noqa: E731
        out.append(f"| {r['cell']} | {r['shape']} | {fmt(ft, 0)} | {fmt(ft, 1)} | {fmt(fl, 0)} | {fmt(fl, 1)} | "
                   f"{ratio(0)} | {ratio(1)} | {fmt(sd, 0)} | {fmt(sd, 1)} |")
    return "\n".join(out) + "\n"


def table_rows(text):
    """{cell: {lib: (fwd, bwd) TFLOP/s or None}} from the Markdown rows this script writes (every table in text)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 10 or cells[0] in ("cell", "") or cells[0].startswith("---"):
            continue
        num = lambda x: None if x == "n/a" else float(x)  # noqa: E731
        pair = lambda i: None if num(cells[i]) is None else (num(cells[i]), num(cells[i + 1]))  # noqa: E731
        rows[cells[0]] = {"flashtile": pair(2), "flex": pair(4), "sdpa_flash": pair(8)}
    return rows


def plot(path):
    """A Markdown file holding this script's tables -> PNG beside it: TFLOP/s per cell, forward and backward, one
    bar per library (a cell measured in several runs: the last table's row)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(path) as f:
        rows = table_rows(f.read())
    libs = [("flashtile", "FlashTile", "C0"), ("flex", "FlexAttention (compiled)", "C4"),
            ("sdpa_flash", "torch SDPA flash", "C1")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    x = np.arange(len(rows))
    for ax, (i, what) in zip(axes, ((0, "forward"), (1, "backward"))):
        for n, (key, label, colour) in enumerate(libs):
            vals = [r[key][i] if r[key] else 0.0 for r in rows.values()]
            ax.bar(x + (n - 1) * 0.27, vals, 0.27, label=label, color=colour)
        ax.set_xticks(x, list(rows), rotation=35, ha="right")
        ax.set_title(f"{what}, TFLOP/s of visible score elements")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Variants, {path.rsplit('/', 1)[-1]}")
    fig.tight_layout()
    out = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--plot":
        return plot(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compiles take minutes)")
    ap.add_argument("--cells", default="full_4k,causal_4k,window_32k,softcap_4k,alibi_4k,sinks_4k,varlen")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    assert a.reps >= 20, "median of at least 20 calls"
    torch.manual_seed(0)
    peers = ("sdpa_flash",) if a.no_flex else ("flex", "sdpa_flash")
    h, d = a.heads, a.hdim
    specs = {
        "full_4k": dict(b=4, s=4096),
        "causal_4k": dict(b=4, s=4096, causal=True),
        "window_32k": dict(b=1, s=32768, causal=True, window=(4095, -1)),
        "softcap_4k": dict(b=4, s=4096, causal=True, softcap=30.0),
        "alibi_4k": dict(b=4, s=4096, causal=True, alibi=True),
        "sinks_4k": dict(b=4, s=4096, causal=True, sinks=True),
    }
    rows = []
    for name in a.cells.split(","):
        if name == "varlen":
            rows += varlen_cells(h, d, a.reps, peers)
        else:
            sp = dict(specs[name])
            rows.append(dense_cell(name, sp.pop("b"), sp.pop("s"), h, d, a.reps, peers, **sp))
        print(markdown({"date": "", "gpu": "", "torch": "", "command": "", "reps": a.reps}, rows[-1:]).splitlines()[-1],
              flush=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": a.reps,
            "command": " ".join(["python3"] + sys.argv)}
    table = markdown(meta, rows)
    print(table)
    if a.md:
        with open(a.md, "w") as f:
            f.write(table)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
