"""flash_attn_with_kvcache on torch tensors.

Eager calls go straight to the library (flashtile._core.forward_kvcache reads the tensors through their
attributes): a torch.library custom op's own Python machinery costs ~35 us per call (bench/results/overhead.md),
more than a small decode step. Under torch.compile the call is one of two custom ops with fake kernels:
  * flashtile::kvcache_append, declared as mutating k_cache and v_cache (the append), so the compiler orders it
    against every other use of the caches and keeps the write;
  * flashtile::kvcache, which mutates nothing (no k, v): declaring a mutation there would make the compiler
    protect the caches, possibly with copies, for a call that only reads them.
Not differentiable (inference only, as flash_attn's is not): an input that requires grad while grad mode is on is
refused rather than silently cut from the graph.
"""

# No `from __future__ import annotations`: torch.library.custom_op reads these annotations as types.
from typing import Optional, Tuple

import torch

from . import _core
from . import _kvcache as kv
from ._torch_ops import _stream

Tensor = torch.Tensor


def _run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
         call: "kv.KVCall", want_lse: bool, explain: bool = False):
    out = torch.empty(q.shape[:-1] + v_cache.shape[-1:], dtype=q.dtype, device=q.device)
    lse = (torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device) if want_lse
           else None)
    try:
        report = _core.forward_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, out,
                                       lse, call.num_splits, call.softmax_scale, call.causal, call.backend,
                                       call.strict, call.num_threads, call.variants(alibi_slopes, sinks), True,
                                       _stream(q), False, explain)
    except _core.FlashTileError as e:
        raise kv.renamed(e) from None
    return report if explain else (out, lse)


def _op_body(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
             softmax_scale, causal, window_left, window_right, softcap, num_splits, max_seqlen_k, backend, strict,
             num_threads, async_index_check, sm_margin, want_lse):
    call = kv.KVCall(softmax_scale, causal, window_left, window_right, softcap, num_splits, max_seqlen_k, backend,
                     strict, num_threads, async_index_check, sm_margin)
    out, lse = _run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
                    call, want_lse)
    return out, (lse if lse is not None else q.new_empty(0, dtype=torch.float32))


def _fake(q, k_cache, v_cache, *args):
    want_lse = args[-1]
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if want_lse else (0,)
    return q.new_empty(q.shape[:-1] + v_cache.shape[-1:]), q.new_empty(lse_shape, dtype=torch.float32)


# The two ops share one schema: q, the caches, the new rows, the index tensors, the per-head tensors, then
# KVCall's fields in its order and want_lse. lse is empty (0,) when want_lse is False (an op returns tensors).
@torch.library.custom_op("flashtile::kvcache_append", mutates_args=("k_cache", "v_cache"))
def kvcache_append(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                   cache_seqlens: Optional[Tensor], block_table: Optional[Tensor], cache_batch_idx: Optional[Tensor],
                   alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], softmax_scale: Optional[float],
                   causal: bool, window_left: int, window_right: int, softcap: float, num_splits: int,
                   max_seqlen_k: int, backend: str, strict: bool, num_threads: int, async_index_check: bool,
                   sm_margin: int, want_lse: bool) -> Tuple[Tensor, Tensor]:
    """out [B, Sq, Hq, Dv] and lse [B, Hq, Sq] (float32) after appending k, v to the caches in place."""
    return _op_body(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
                    softmax_scale, causal, window_left, window_right, softcap, num_splits, max_seqlen_k, backend,
                    strict, num_threads, async_index_check, sm_margin, want_lse)


@torch.library.custom_op("flashtile::kvcache", mutates_args=())
def kvcache_read(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                 cache_seqlens: Optional[Tensor], block_table: Optional[Tensor], cache_batch_idx: Optional[Tensor],
                 alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], softmax_scale: Optional[float],
                 causal: bool, window_left: int, window_right: int, softcap: float, num_splits: int,
                 max_seqlen_k: int, backend: str, strict: bool, num_threads: int, async_index_check: bool,
                 sm_margin: int, want_lse: bool) -> Tuple[Tensor, Tensor]:
    """out and lse of the cache as it is (k and v are None here)."""
    return _op_body(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
                    softmax_scale, causal, window_left, window_right, softcap, num_splits, max_seqlen_k, backend,
                    strict, num_threads, async_index_check, sm_margin, want_lse)


kvcache_append.register_fake(_fake)
kvcache_read.register_fake(_fake)


def _prepare(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx):
    """cache_seqlens as a tensor (an int means every sequence). The library names a bad rank or float dtype as
    these checks would (torch_view reads no uint16 as bfloat16, unlike the numpy path): only what it cannot say
    well is checked here first, objects that are no tensors and index tensors that are not int32 (it would call
    them unsupported floats). The quick test costs ~1 us of a ~5 us full check per call."""
    if kv.is_int(cache_seqlens) and isinstance(q, Tensor) and q.dim() == 4:
        cache_seqlens = torch.full((q.shape[0],), int(cache_seqlens), dtype=torch.int32, device=q.device)
    if not (isinstance(k_cache, Tensor) and isinstance(v_cache, Tensor) and (k is None or isinstance(k, Tensor))
            and (v is None or isinstance(v, Tensor)) and _int32(cache_seqlens) and _int32(block_table)
            and _int32(cache_batch_idx)):
        kv.check_operands(lambda x: isinstance(x, Tensor), "torch.Tensor", q, k_cache, v_cache, k, v,
                          {"cache_seqlens": cache_seqlens, "block_table": block_table,
                           "cache_batch_idx": cache_batch_idx})
    return cache_seqlens


def _int32(x) -> bool:
    return x is None or (isinstance(x, Tensor) and x.dtype == torch.int32)


def forward(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
            call: "kv.KVCall", want_lse: bool):
    cache_seqlens = _prepare(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx)
    if torch.is_grad_enabled():
        for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                        ("alibi_slopes", alibi_slopes), ("sinks", sinks)):
            if x is not None and x.requires_grad:
                raise kv.UnsupportedError(
                    f"{name}: requires grad, but flash_attn_with_kvcache is inference only (not differentiable); "
                    "call it under torch.no_grad() or torch.inference_mode(), or pass detached tensors")
    append = k is not None or v is not None
    if torch.compiler.is_compiling():
        op = kvcache_append if append else kvcache_read
        out, lse = op(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
                      *call, want_lse)
        return out, (lse if want_lse else None)
    out, lse = _run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
                    call, want_lse)
    if append:  # written behind torch's back: bump the version counters, as an in-place torch op would
        torch.autograd.graph.increment_version(k_cache)
        torch.autograd.graph.increment_version(v_cache)
    return out, lse


def explain(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks,
            call: "kv.KVCall"):
    cache_seqlens = _prepare(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx)
    return _run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, alibi_slopes, sinks, call,
                True, explain=True)
