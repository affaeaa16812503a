"""The torch path: forward and backward on torch tensors, with autograd, for eager calls and for torch.compile.

Three doors to the same library calls, chosen per call by forward():
  * eager, when flashtile._torch_ext loaded: its op flashtile_ext::attention, whose autograd node is C++ and which
    reads tensors as at::Tensors (python/src/torch_ext.cpp); the cheapest per call;
  * eager otherwise: a torch.autograd.Function (or, when no gradient is wanted, a plain call). On the H200 host the
    torch.library custom op's own Python machinery cost ~35 us per forward, twice a tiny call's whole budget
    (bench/results/overhead.md), so eager calls do not go through it;
  * torch.compile: the custom ops flashtile::fwd / flashtile::bwd with fake kernels and a registered autograd
    formula, which the compiler traces without graph breaks (its tracing sees is_compiling() true).
Outputs (and the CUDA backward's workspace) are allocated with torch.empty, so they come from torch's caching
allocator, and from the graph's private pool while a CUDA graph is captured. The kernels run on torch's current
stream of the tensors' device, passed to the library as Options::cuda_stream: the call is ordered like any torch
op and can be captured.
"""

# No `from __future__ import annotations`: torch.library.custom_op reads these annotations as types.
from typing import Optional, Tuple

import os

import torch

from . import _core
from ._common import Call, check_float, check_rank, kind_name, layouts

Tensor = torch.Tensor
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _load_extension():
    """(the op flashtile_ext::attention or None, a line saying which door eager calls take and why)."""
    if os.environ.get("FLASHTILE_USE_TORCH_EXT", "1") == "0":
        return None, "off (FLASHTILE_USE_TORCH_EXT=0): eager calls use the Python autograd.Function"
    path = os.path.join(os.path.dirname(__file__), "_torch_ext.so")
    if not os.path.exists(path):
        return None, ("not built (torch was not importable when flashtile was built; build with "
                      "`pip install --no-build-isolation .`): eager calls use the Python autograd.Function")
    try:
        torch.ops.load_library(path)
        torch.ops.flashtile_ext.set_bridge(_core.torch_bridge())
    except Exception as e:  # a torch other than the one it was built against, most likely
        return None, f"not loaded ({type(e).__name__}: {e}): eager calls use the Python autograd.Function"
    return torch.ops.flashtile_ext.attention.default, f"loaded from {path}"


_ext, extension_status = _load_extension()
# 1 + flashtile::ErrorCode, as python/src/bridge.h returns it.
_ext_errors = {1: _core.InvalidArgumentError, 2: _core.DTypeError, 3: _core.DeviceError, 4: _core.UnsupportedError,
               5: _core.BackendError}


def _ext_error(e: RuntimeError):
    """The flashtile exception a tagged extension error stands for; None for "[flashtile:fallback]"."""
    text = str(e)
    at = text.find("[flashtile:")
    if at < 0:
        return e
    tag, _, rest = text[at + 11:].partition("] ")
    if tag == "fallback":
        return None
    return _ext_errors.get(int(tag) if tag.isdigit() else 0, RuntimeError)(rest)


def _stream(q: Tensor) -> int:
    """torch's current CUDA stream of q's device as an integer handle (0 for CPU tensors)."""
    if not q.is_cuda:
        return 0
    if _current_raw_stream is not None:
        return _current_raw_stream(q.get_device())
    return torch.cuda.current_stream(q.device).cuda_stream


def _workspace(nbytes: int, like: Tensor) -> Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=like.device)


def _forward(q, k, v, call: Call):
    """out [B, Sq, Hq, Dv] and lse [B, Hq, Sq] (float32); varlen: out [total_q, Hq, Dv], lse [Hq, total_q]."""
    out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if call.varlen else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    _core.forward_torch(q, k, v, out, lse, call.softmax_scale, call.causal, call.backend, call.strict, _stream(q),
                        call.variants())
    return out, lse


def _backward(q, k, v, out, dout, lse, call: Call):
    """dq, dk, dv (shapes and dtype of q, k, v) and dsinks (None without sinks) from the saved out and lse;
    recomputes P in tiles."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # With no query rows the library runs no kernel, and dk, dv (sums over query rows) must be zero.
    alloc = torch.zeros if q.shape[0 if call.varlen else 1] == 0 else torch.empty
    dk = alloc(k.shape, dtype=q.dtype, device=q.device)
    dv = alloc(v.shape, dtype=q.dtype, device=q.device)
    dsinks = None if call.sinks is None else torch.empty_like(call.sinks)
    _core.backward_torch(q, k, v, out, dout, lse, dq, dk, dv, call.softmax_scale, call.causal, call.backend,
                         call.strict, call.deterministic, _stream(q),
                         lambda n: _workspace(n, q),  # called only when the backend needs scratch memory
                         call.variants(dsinks))
    return dq, dk, dv, dsinks


def _unit_stride(dout):
    # Gradients of reductions arrive as expanded (stride 0) tensors; the kernel needs a unit-stride last dim.
    return dout if dout.stride(-1) == 1 else dout.contiguous()


# --- eager without the extension: autograd.Function -----------------------------------------------------------

class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, call):
        # sinks is an input of its own so that autograd sees it (its gradient is dsinks); call holds it too.
        out, lse = _forward(q, k, v, call)
        # out and lse are all backward needs: P is recomputed, never stored.
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.call = call
        # The library's backward has no gradient input for lse; a loss that uses lse must not silently get a
        # wrong gradient, so lse is a constant for autograd.
        ctx.mark_non_differentiable(lse)
        # lse never has a gradient: without this, autograd would fill a zero tensor for it on every backward.
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # out did not reach the loss
            return None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv, dsinks = _backward(q, k, v, out, _unit_stride(dout), lse, ctx.call)
        return dq, dk, dv, dsinks, None


# --- torch.compile: custom ops ---------------------------------------------------------------------------------
# Their arguments after q, k, v (and out, dout, lse) are Call's fields, in its order.

@torch.library.custom_op("flashtile::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        max_seqlen_q: int, max_seqlen_k: int, alibi_slopes: Optional[Tensor], sinks: Optional[Tensor],
        softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
        backend: str, strict: bool, deterministic: bool, sm_margin: int = 0) -> Tuple[Tensor, Tensor]:
    """out [B, Sq, Hq, Dv] and lse [B, Hq, Sq] (float32), or [total_q, Hq, Dv] and [Hq, total_q] with cu_seqlens.
    `deterministic` is only kept for backward."""
    return _forward(q, k, v, Call(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, sinks,
                                  softmax_scale, causal, window_left, window_right, softcap, backend, strict,
                                  deterministic, sm_margin))


@fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, *_):
    lse_shape = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(q.shape[:-1] + v.shape[-1:]), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashtile::bwd", mutates_args=())
def bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, alibi_slopes: Optional[Tensor],
        sinks: Optional[Tensor], softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
        softcap: float, backend: str, strict: bool, deterministic: bool,
        sm_margin: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv (shapes and dtype of q, k, v) and dsinks (empty without sinks); recomputes P in tiles."""
    call = Call(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, sinks, softmax_scale, causal,
                window_left, window_right, softcap, backend, strict, deterministic, sm_margin)
    dq, dk, dv, dsinks = _backward(q, k, v, out, dout, lse, call)
    return dq, dk, dv, (dsinks if dsinks is not None else q.new_empty(0, dtype=torch.float32))


@bwd.register_fake
def _bwd_fake(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, sinks,
              *_):
    dsinks = sinks.new_empty(sinks.shape) if sinks is not None else q.new_empty(0, dtype=torch.float32)
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape), dsinks


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.call = Call(*inputs[3:])
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv, dsinks = bwd(q, k, v, out, _unit_stride(dout), lse, *ctx.call)
    none = [None] * len(Call._fields)
    none[Call._fields.index("sinks")] = dsinks if ctx.call.sinks is not None else None
    return (dq, dk, dv, *none)


fwd.register_autograd(_op_backward, setup_context=_setup_context)


# --- entry points used by the public functions -----------------------------------------------------------------

def check(args, rank=4) -> None:
    """args: (name, tensor, layout) triples; every one must be a torch tensor of `rank` dims (lse: rank - 1)."""
    for name, x, layout in args:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor like q, got {kind_name(x)}")
        check_rank(name, x, rank - 1 if name == "lse" else rank, layout)
        if name != "lse":
            check_float(name, x)


def forward(q, k, v, call: Call):
    rank = 3 if call.varlen else 4
    if not (isinstance(k, Tensor) and isinstance(v, Tensor) and q.dim() == rank and k.dim() == rank
            and v.dim() == rank):
        lq, lk, lv, _, _ = layouts(call)
        check((("q", q, lq), ("k", k, lk), ("v", v, lv)), rank)  # raises the error that names the argument
    if torch.compiler.is_compiling():
        return fwd(q, k, v, *call)
    if _ext is not None:
        try:
            return _ext(q, k, v, *call)
        except RuntimeError as e:
            err = _ext_error(e)
            if err is not None:
                raise err from None
            # fallback: a tensor the extension's fast path does not take; the path below names the problem.
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
            call.sinks is not None and call.sinks.requires_grad)):
        return _Attention.apply(q, k, v, call.sinks, call)
    return _forward(q, k, v, call)


def backward(q, k, v, out, dout, lse, call: Call):
    """(dq, dk, dv), and dsinks as a fourth entry when call.sinks is given."""
    lq, lk, lv, lo, ll = layouts(call)
    check((("q", q, lq), ("k", k, lk), ("v", v, lv), ("out", out, lo), ("dout", dout, lo), ("lse", lse, ll)),
          3 if call.varlen else 4)
    # A direct call, not part of a graph being differentiated.
    with torch.no_grad():
        dq, dk, dv, dsinks = _backward(q, k, v, out, dout, lse, call)
    return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)


def explain(q, k, v, call: Call, backward: bool):
    lq, lk, lv, _, _ = layouts(call)
    check((("q", q, lq), ("k", k, lk), ("v", v, lv)), 3 if call.varlen else 4)
    q, k, v = q.detach(), k.detach(), v.detach()
    out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if call.varlen else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    kw = dict(softmax_scale=call.softmax_scale, causal=call.causal, backend=call.backend, strict=call.strict,
              explain=True)
    if not backward:
        return _core.forward(q, k, v, out, lse, variants=call.variants(), **kw)
    dq, dk, dv = (torch.empty(x.shape, dtype=q.dtype, device=q.device) for x in (q, k, v))
    dsinks = None if call.sinks is None else torch.empty_like(call.sinks)
    return _core.backward(q, k, v, out, torch.empty_like(out), lse, dq, dk, dv, deterministic=call.deterministic,
                          variants=call.variants(dsinks), **kw)
