"""flash_attn_with_kvcache: attention of a few new query tokens per sequence against that sequence's KV cache,
after appending the new keys and values to the cache in place (FlashAttention's call of the same name; the C++
API is include/flashtile/kvcache.h, forward_kvcache). numpy arrays go through DLPack here; torch tensors through
_kvcache_torch (a custom op that mutates the caches, for torch.compile)."""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

import numpy as np

from . import _core
from ._common import (DTypeError, InvalidArgumentError, check_float, check_rank, dtype_name, kind_name, sm_margin_arg,
                      window_pair)

UnsupportedError = _core.UnsupportedError

Q, OUT, LSE, NEW_K, NEW_V = "[B, Sq, Hq, D]", "[B, Sq, Hq, Dv]", "[B, Hq, Sq]", "[B, Snew, Hkv, D]", "[B, Snew, Hkv, Dv]"
CACHE_K, CACHE_V = "[B_cache, capacity, Hkv, D] or [num_pages, page_size, Hkv, D]", \
    "[B_cache, capacity, Hkv, Dv] or [num_pages, page_size, Hkv, Dv]"
INDEX = {"cache_seqlens": (1, "[B]"), "block_table": (2, "[B, max_pages]"), "cache_batch_idx": (1, "[B]")}


class KVCall(NamedTuple):
    """The scalar options of a call, in the order of the torch ops' schemas (_kvcache_torch)."""
    softmax_scale: Optional[float] = None
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    num_splits: int = 0
    max_seqlen_k: int = 0
    backend: str = "auto"
    strict: bool = False
    num_threads: int = 0
    async_index_check: bool = False
    sm_margin: int = 0

    def variants(self, alibi_slopes, sinks):
        """The tuple flashtile._core.forward_kvcache takes for the variants (and the index-check mode)."""
        return (self.window_left, self.window_right, self.softcap, alibi_slopes, sinks, self.max_seqlen_k,
                self.async_index_check, self.sm_margin)


def make_call(softmax_scale, causal, window_size, softcap, num_splits, max_seqlen_k, backend, strict,
              num_threads, async_index_check=False, sm_margin=0) -> KVCall:
    left, right = (-1, -1) if window_size == (-1, -1) else window_pair(window_size)
    return KVCall(None if softmax_scale is None else float(softmax_scale), bool(causal), left, right, float(softcap),
                  int(num_splits), int(max_seqlen_k), backend, bool(strict), int(num_threads),
                  bool(async_index_check), sm_margin_arg(sm_margin))


# The C++ API calls the new keys and values k_new / v_new; here they are the arguments k and v.
_RENAME = re.compile(r"\b([kv])_new\b")


def renamed(e: Exception) -> Exception:
    """A library error with the argument names of this function (k, v for the C++ API's k_new, v_new)."""
    text = str(e)
    fixed = _RENAME.sub(r"\1", text)
    return e if fixed == text else type(e)(fixed)


def is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_operands(is_kind, kind, q, k_cache, v_cache, k, v, index) -> None:
    """Ranks, kinds and float dtypes of the operands, and int32 for the index tensors, with errors that name the
    argument. The library checks everything else (shapes, devices, values) before it writes anything."""
    for name, x, layout in (("q", q, Q), ("k_cache", k_cache, CACHE_K), ("v_cache", v_cache, CACHE_V),
                            ("k", k, NEW_K), ("v", v, NEW_V)):
        if x is None:
            continue
        if not is_kind(x):
            raise TypeError(f"{name}: expected a {kind} like q, got {kind_name(x)}")
        check_rank(name, x, 4, layout)
        check_float(name, x)
    for name, x in index.items():
        if x is None:
            continue
        if not is_kind(x):
            raise TypeError(f"{name}: expected an int32 {kind} like q" +
                            (" or an int" if name == "cache_seqlens" else "") + f", got {kind_name(x)}")
        rank, layout = INDEX[name]
        check_rank(name, x, rank, layout)
        if dtype_name(x) != "int32":
            raise DTypeError(f"{name}: dtype {dtype_name(x)}, expected int32")


def _bits(x):
    # numpy cannot export ml_dtypes' bfloat16 through DLPack: the same memory as uint16, read as bfloat16 by the
    # binding (bf16_bits=True); genuine uint16 arrays were refused by check_float.
    return x.view(np.uint16) if x is not None and x.dtype.name == "bfloat16" else x


def _numpy_call(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
                call: KVCall, want_lse: bool, explain: bool):
    if isinstance(cache_seqlens, np.ndarray) or cache_seqlens is None:
        seqlens = cache_seqlens
    elif is_int(cache_seqlens):
        seqlens = np.full(q.shape[0] if isinstance(q, np.ndarray) and q.ndim == 4 else 0, cache_seqlens, np.int32)
    else:
        seqlens = cache_seqlens  # check_operands names it
    check_operands(lambda x: isinstance(x, np.ndarray), "numpy.ndarray", q, k_cache, v_cache, k, v,
                   {"cache_seqlens": seqlens, "block_table": block_table, "cache_batch_idx": cache_batch_idx})
    if k is not None or v is not None:
        for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not x.flags.writeable:
                raise InvalidArgumentError(f"{name}: a read-only array; k and v are appended to the cache in place")
    out = np.empty(q.shape[:-1] + v_cache.shape[-1:], dtype=q.dtype)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32) if want_lse else None
    try:
        report = _core.forward_kvcache(
            _bits(q), _bits(k_cache), _bits(v_cache), _bits(k), _bits(v), seqlens, block_table, cache_batch_idx,
            _bits(out), lse, call.num_splits, call.softmax_scale, call.causal, call.backend, call.strict,
            call.num_threads, call.variants(alibi_slopes, sinks), False, 0, True, explain)
    except _core.FlashTileError as e:
        raise renamed(e) from None
    return report if explain else (out, lse)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                            cache_batch_idx=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                            softcap=0.0, alibi_slopes=None, sinks=None, num_splits=0, return_lse=False,
                            backend="auto", strict=False, num_threads=0, max_seqlen_k=0, async_index_check=False,
                            sm_margin=0):
    """Attention of q against a KV cache, after appending k and v to it in place (inference; decode steps).

    Args:
        q: (B, Sq, Hq, D) numpy array or torch tensor, float32, float16 or bfloat16: the new query tokens.
        k_cache, v_cache: the cache, q's dtype and device, either contiguous (B_cache, capacity, Hkv, D) /
            (B_cache, capacity, Hkv, Dv), or paged (num_pages, page_size, Hkv, D) / (.., Dv) with block_table;
            page_size a multiple of 16. Written in place when k and v are given. Hq must be a multiple of Hkv.
        k, v: (B, Snew, Hkv, D) and (B, Snew, Hkv, Dv), both or neither: new keys and values, written into the
            cache at rows cache_seqlens[b] .. cache_seqlens[b] + Snew - 1 of sequence b, then attended.
        cache_seqlens: (B) int32 array / tensor on q's device, or an int for every sequence: the keys each
            sequence holds before the append. Required with k and v; absent, every sequence fills its cache.
        block_table: (B, max_pages) int32: page block_table[b][j // page_size] holds key j of sequence b.
        cache_batch_idx: (B) int32, contiguous caches only: the cache slot of sequence b (default b).
        softmax_scale, causal, window_size, softcap, alibi_slopes, sinks: as in flash_attn_func, with Sk = L_b =
            cache_seqlens[b] + Snew per sequence, so causal is bottom-right over the new tokens (query i sees keys
            j <= i + L_b - Sq).
        num_splits: split-KV parts per sequence (computed in parallel, then merged); 0 = the backend chooses.
        return_lse: also return lse, (B, Hq, Sq) float32.
        backend, strict: as in flash_attn_func. num_threads: CPU threads (0 = the default).
        max_seqlen_k: when > 0, a bound on every L_b (lets a GPU backend size its splits without reading
            cache_seqlens, as flash_attn's CUDA-graph callers pass it).
        async_index_check: CUDA only. cache_seqlens, block_table and cache_batch_idx live on the GPU and are
            checked there; by default the call waits for that verdict (a stream synchronisation) and raises the
            typed error. True: no wait, for eager decode loops; a bad index then leaves the cache unchanged and NaN
            in out and lse, as it always does inside a captured CUDA graph.
        sm_margin: CUDA: SMs to leave to kernels running beside the call; the automatic split-KV plan spreads
            its CTAs over the device's SMs less this many (as in flash_attn_func).

    Returns:
        out (B, Sq, Hq, Dv) of q's type, dtype and device, or (out, lse) with return_lse.

    Inference only: not differentiable (as flash_attn's is not); a torch call with an input that requires grad
    while grad mode is on raises UnsupportedError. Every argument is checked before anything is written: a
    refused call leaves the cache unchanged. Arguments after v are keyword-only (flash_attn's sixth positional
    argument is rotary_cos, which FlashTile does not take).
    """
    call = make_call(softmax_scale, causal, window_size, softcap, num_splits, max_seqlen_k, backend, strict,
                     num_threads, async_index_check, sm_margin)
    if torch is not None and isinstance(q, torch.Tensor):
        out, lse = _torch_kv.forward(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx,
                                     alibi_slopes, sinks, call, return_lse)
    elif isinstance(q, np.ndarray):
        out, lse = _numpy_call(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx,
                               alibi_slopes, sinks, call, return_lse, False)
    else:
        raise TypeError(f"q: expected a numpy.ndarray or a torch.Tensor, got {kind_name(q)}")
    return (out, lse) if return_lse else out


def explain_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                    cache_batch_idx=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, sinks=None, num_splits=0, backend="auto", strict=False, num_threads=0,
                    max_seqlen_k=0, async_index_check=False, sm_margin=0):
    """The DispatchReport of the kernel flash_attn_with_kvcache would run for these arguments (backend, split-KV
    count and why, report.ran.splits), with every refused backend's reasons; writes nothing, not even the append.
    Bad arguments raise the same errors as the real call."""
    call = make_call(softmax_scale, causal, window_size, softcap, num_splits, max_seqlen_k, backend, strict,
                     num_threads, async_index_check, sm_margin)
    if torch is not None and isinstance(q, torch.Tensor):
        return _torch_kv.explain(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx,
                                 alibi_slopes, sinks, call)
    if isinstance(q, np.ndarray):
        return _numpy_call(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes,
                           sinks, call, True, True)
    raise TypeError(f"q: expected a numpy.ndarray or a torch.Tensor, got {kind_name(q)}")


try:
    import torch
except ImportError:  # numpy-only install
    torch = None

_torch_kv = None
if torch is not None:  # imported last: it uses this module's checks
    from . import _kvcache_torch as _torch_kv
