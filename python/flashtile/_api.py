"""The public functions. Each one routes torch tensors to the torch.library ops (autograd,
torch.compile) and numpy arrays to the numpy path; both end in the same C++ call."""

from __future__ import annotations

import numpy as np

from . import _common, _numpy
from ._common import InvalidArgumentError, check_dropout, check_rank, kind_name, layouts, make_call

try:
    import torch
except ImportError:  # numpy-only install
    torch = None

_torch_ops = None
if torch is not None:
    from . import _torch_ops


def _is_torch(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _path(q):
    if _is_torch(q):
        return _torch_ops
    if isinstance(q, np.ndarray):
        return _numpy
    raise TypeError(f"q: expected a numpy.ndarray or a torch.Tensor, got {kind_name(q)}")


_VARIANT_DOC = """
        window_size: (left, right) sliding window around each query's aligned diagonal: query i sees keys j with
            i + Sk - Sq - left <= j <= i + Sk - Sq + right; -1 means unbounded on that side. causal=True
            means right = 0.
        softcap: score capping (Gemma 2, Grok): s = softcap * tanh(s / softcap) after the scale; 0.0 = off.
        alibi_slopes: (Hq) or (B, Hq) float32 on q's device: s -= slope * |i + Sk - Sq - j| (BLOOM, MPT).
        sinks: (Hq) float32 on q's device: one logit per query head in each softmax denominator that adds no
            value (gpt-oss): lse_i = log(exp(sink) + sum_j exp(s_ij)). Differentiable for torch tensors."""


def flash_attn_func(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, sinks=None, return_lse=False, backend="auto", strict=False,
                    deterministic=False, dropout_p=0.0, sm_margin=0):
    """Exact attention, softmax(softmax_scale * q @ k^T) @ v, computed in tiles without materialising P.

    Args:
        q: (B, Sq, Hq, D) numpy array or torch tensor, float32, float16 or bfloat16 (numpy bfloat16
            through ml_dtypes). Any strides on the first three dims; the last dim must be contiguous.
        k: (B, Sk, Hkv, D), same dtype and device as q. Hq must be a multiple of Hkv (GQA / MQA).
        v: (B, Sk, Hkv, Dv).
        softmax_scale: multiplies q @ k^T; default 1 / sqrt(D).
        causal: mask aligned to the bottom-right corner, as in flash_attn >= 2.1: query i sees keys
            j <= i + Sk - Sq. A row that sees no key (e.g. the first Sq - Sk rows when Sq > Sk) gets output 0
            and lse -inf (with sinks: lse = sink).{variants}
        return_lse: also return lse, (B, Hq, Sq) float32, the log-sum-exp of each score row.
        backend: "auto" or a name from flashtile.backend_names(), e.g. "cpu-flash" or "cpu-reference".
        strict: error instead of falling back when the requested (or, with "auto", the first-choice)
            backend cannot run; the error lists its reasons.
        deterministic: make the backward pass bitwise reproducible (used by torch autograd).
        dropout_p: accepted for source compatibility with flash_attn; only 0.0 is supported.
        sm_margin: CUDA: streaming multiprocessors to leave to kernels running beside this call, such as the
            transfers of context-parallel attention (FlashAttention-3's sm_margin): cuda-sm90's persistent
            forward runs on the device's SMs less this many. Kernels with a CTA per tile ignore it (the
            hardware places them on the free SMs), and so do the CPU backends. 0 <= sm_margin < the SM count.

    Returns:
        out (B, Sq, Hq, Dv) of q's type, dtype and device, or (out, lse) with return_lse. For torch tensors
        the call is differentiable in q, k, v and sinks (not in lse) and traceable by torch.compile(fullgraph=True).

    Every argument after v is keyword-only: flash_attn's fourth positional argument is dropout_p, and a
    call written for it must not silently pass that value as softmax_scale.
    """
    if dropout_p != 0.0:
        check_dropout(dropout_p)
    call = make_call(softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, backend, strict, deterministic,
                     sm_margin=sm_margin)
    if _is_torch(q):  # checked first: this runs on every call of a training or serving loop
        out, lse = _torch_ops.forward(q, k, v, call)
    else:
        _path(q)  # raises for what is neither numpy nor torch
        out, lse = _numpy.forward(q, k, v, call)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale=None,
                           causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                           return_lse=False, backend="auto", strict=False, deterministic=False, dropout_p=0.0,
                           sm_margin=0):
    """flash_attn_func over a packed batch of sequences of different lengths (flash_attn's varlen form).

    Args:
        q: (total_q, Hq, D): the batch's query rows, sequence b at rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1.
        k, v: (total_k, Hkv, D) and (total_k, Hkv, Dv), sequence b at rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1.
        cu_seqlens_q, cu_seqlens_k: (B + 1) int32 on q's device: 0, then the running sums of the lengths.
            Empty sequences are allowed.
        max_seqlen_q, max_seqlen_k: at least the longest query / key sequence (they size the kernels' grids).
        Every other argument as in flash_attn_func, applied per sequence (the causal diagonal and the window
        are aligned to each sequence's own bottom-right corner).

    Returns:
        out (total_q, Hq, Dv), or (out, lse) with return_lse, lse (Hq, total_q) float32.
    """
    if dropout_p != 0.0:
        check_dropout(dropout_p)
    call = make_call(softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, backend, strict, deterministic,
                     cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_margin)
    if _is_torch(q):
        out, lse = _torch_ops.forward(q, k, v, call)
    else:
        _path(q)
        out, lse = _numpy.forward(q, k, v, call)
    return (out, lse) if return_lse else out


flash_attn_func.__doc__ = flash_attn_func.__doc__.format(variants=_VARIANT_DOC)


def flash_attn_backward(q, k, v, out, dout, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, sinks=None, backend="auto", strict=False, deterministic=False,
                        sm_margin=0):
    """Gradients (dq, dk, dv) of flash_attn_func's out given dout, for numpy users (torch users get them
    from autograd); with sinks, (dq, dk, dv, dsinks). out and lse are what flash_attn_func(...,
    return_lse=True) returned for the same q, k, v and options; P is recomputed from them. dk and dv sum over
    the query heads sharing a KV head.
    """
    call = make_call(softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, backend, strict, deterministic,
                     sm_margin=sm_margin)
    return _path(q).backward(q, k, v, out, dout, lse, call)


def flash_attn_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, sinks=None, backend="auto", strict=False, deterministic=False,
                               sm_margin=0):
    """flash_attn_backward for flash_attn_varlen_func's packed layout: (dq, dk, dv) or (dq, dk, dv, dsinks)."""
    call = make_call(softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, backend, strict, deterministic,
                     cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_margin)
    return _path(q).backward(q, k, v, out, dout, lse, call)


def _swap12(x):
    return x.transpose(1, 2) if _is_torch(x) else np.swapaxes(x, 1, 2)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's signature and (B, H, S, D) layout.

    query (B, Hq, Sq, D), key (B, Hkv, Sk, D), value (B, Hkv, Sk, Dv) -> (B, Hq, Sq, Dv). The heads and
    sequence dims are swapped as views, never copied; the result is a view of a (B, Sq, Hq, Dv) buffer,
    as with torch's own flash backend. Works on numpy arrays too.

    Differences from torch:
      * is_causal aligns the mask to the bottom-right corner (query i sees keys j <= i + Sk - Sq).
        torch aligns it to the top-left (j <= i); the two agree when Sq == Sk.
      * attn_mask must be None and dropout_p 0.0 (accepted so that existing calls keep working).
      * exactly four dims (B, H, S, D); torch also takes other batch ranks.
      * enable_gqa=True is required when Hq != Hkv, as in torch; Hq must be a multiple of Hkv.
      * error messages name the arguments as flash_attn_func does (q, k, v) with shapes in
        (B, S, H, D) order.
    """
    if attn_mask is not None:
        raise InvalidArgumentError("attn_mask: not supported; FlashTile computes full or causal attention "
                                   "(is_causal=True) only")
    check_dropout(dropout_p)
    for name, x, layout in (("query", query, "(B, Hq, Sq, D)"), ("key", key, "(B, Hkv, Sk, D)"),
                            ("value", value, "(B, Hkv, Sk, Dv)")):
        if not (_is_torch(x) or isinstance(x, np.ndarray)):
            raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got {kind_name(x)}")
        check_rank(name, x, 4, layout)
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise InvalidArgumentError(f"key: {key.shape[1]} heads differ from query's {query.shape[1]}; pass "
                                   "enable_gqa=True for grouped-query attention")
    out = flash_attn_func(_swap12(query), _swap12(key), _swap12(value), softmax_scale=scale, causal=is_causal)
    return _swap12(out)


def explain(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
            sinks=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, backend="auto",
            strict=False, backward=False, deterministic=False, sm_margin=0):
    """The DispatchReport of the kernel that flash_attn_func (or flash_attn_varlen_func, with cu_seqlens; or, with
    backward=True, its backward) would run for these arguments, with every refused backend's reasons; reads no
    data. Bad arguments raise the same errors as the real call; when no backend could run it, report.backend is ""
    and every refusal is listed. str(report) is a readable summary, report.to_dict() a dict."""
    call = make_call(softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, backend, strict, deterministic,
                     cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_margin)
    path = _path(q)
    if path is _torch_ops:
        return _torch_ops.explain(q, k, v, call, backward)
    if not backward:
        return _numpy.forward(q, k, v, call, explain=True)
    lq, lk, lv, _, _ = layouts(call)
    _numpy.check((("q", q, lq), ("k", k, lk), ("v", v, lv)), 3 if call.varlen else 4)
    out, lse = _numpy.empty_outputs(q, v, call)
    return _numpy.backward(q, k, v, out, out.copy(), lse, call, explain=True)


last_dispatch = _common.last_dispatch


def torch_extension() -> str:
    """Which door eager torch calls take: the compiled extension flashtile._torch_ext (its op has a C++
    autograd node; the cheapest per call) or, when it is absent or did not load, a Python autograd.Function;
    with the reason. The results are the same either way; only the per-call host time differs."""
    if _torch_ops is None:
        return "torch is not installed"
    return _torch_ops.extension_status
