"""torch.library custom ops flashtile::fwd and flashtile::bwd, with autograd and fake (meta) kernels.

Imported by the package only when torch is importable. Outputs are allocated with torch.empty on the
inputs' device and handed to the C++ library through DLPack, so the same code serves CPU and CUDA
tensors: the library reads the device (DLPack device type and index) from the tensors.
"""

# No `from __future__ import annotations`: torch.library.custom_op reads these annotations as types.
from typing import Optional, Tuple

import torch

from . import _core
from ._common import check_float, check_rank, kind_name, record

Tensor = torch.Tensor


def _on_library_stream(device: torch.device, call):
    """Runs call() ordered after the caller's pending work on `device` and before its later work.

    The CUDA backend launches on the legacy default stream (the C++ API has no stream argument yet),
    which is torch's default stream. When the caller has made another stream current, that stream's work
    on the inputs must finish before the kernels start, and its later work must wait for the outputs."""
    if device.type != "cuda":
        return call()
    current = torch.cuda.current_stream(device)
    default = torch.cuda.default_stream(device)
    if current == default:
        return call()
    default.wait_stream(current)
    try:
        return call()
    finally:
        current.wait_stream(default)


def _fwd_shapes(q: Tensor, v: Tensor):
    b, sq, hq, _ = q.shape
    return (b, sq, hq, v.shape[3]), (b, hq, sq)


@torch.library.custom_op("flashtile::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float], causal: bool, backend: str,
        strict: bool, deterministic: bool) -> Tuple[Tensor, Tensor]:
    """out [B, Sq, Hq, Dv] and lse [B, Hq, Sq] (float32). `deterministic` is only kept for backward."""
    out_shape, lse_shape = _fwd_shapes(q, v)
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    # detach(): torch refuses to export tensors that require grad through DLPack; autograd is handled
    # by the op's registered backward, not by looking into this function.
    record(_on_library_stream(q.device, lambda: _core.forward(
        q.detach(), k.detach(), v.detach(), out, lse, softmax_scale=softmax_scale, causal=causal,
        backend=backend, strict=strict)))
    return out, lse


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, backend, strict, deterministic):
    out_shape, lse_shape = _fwd_shapes(q, v)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashtile::bwd", mutates_args=())
def bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, softmax_scale: Optional[float],
        causal: bool, backend: str, strict: bool, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (shapes and dtype of q, k, v) from the saved out and lse; recomputes P in tiles."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # With no query rows the library runs no kernel, and dk, dv (sums over query rows) must be zero.
    alloc = torch.zeros if q.shape[1] == 0 else torch.empty
    dk = alloc(k.shape, dtype=q.dtype, device=q.device)
    dv = alloc(v.shape, dtype=q.dtype, device=q.device)
    record(_on_library_stream(q.device, lambda: _core.backward(
        q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), lse.detach(), dq, dk, dv,
        softmax_scale=softmax_scale, causal=causal, backend=backend, strict=strict,
        deterministic=deterministic)))
    return dq, dk, dv


@bwd.register_fake
def _bwd_fake(q, k, v, out, dout, lse, softmax_scale, causal, backend, strict, deterministic):
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, backend, strict, deterministic = inputs
    out, lse = output
    # out and lse are all backward needs: P is recomputed, never stored.
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (softmax_scale, causal, backend, strict, deterministic)
    # The library's backward has no gradient input for lse; a loss that uses lse must not silently get a
    # wrong gradient, so lse is a constant for autograd.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    # Gradients of reductions arrive as expanded (stride 0) tensors; the kernel needs a unit-stride last dim.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = bwd(q, k, v, out, dout, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


fwd.register_autograd(_backward, setup_context=_setup_context)


# --- entry points used by the public functions ---------------------------------------------------------

Q, K, V = "[B, Sq, Hq, D]", "[B, Sk, Hkv, D]", "[B, Sk, Hkv, Dv]"
OUT, LSE = "[B, Sq, Hq, Dv]", "[B, Hq, Sq]"


def check(args) -> None:
    """args: (name, tensor, layout) triples; every one must be a 4-D (3-D for lse) torch tensor."""
    for name, x, layout in args:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor like q, got {kind_name(x)}")
        check_rank(name, x, 3 if name == "lse" else 4, layout)
        if name != "lse":
            check_float(name, x)


def forward(q, k, v, *, softmax_scale, causal, backend, strict, deterministic):
    check((("q", q, Q), ("k", k, K), ("v", v, V)))
    return fwd(q, k, v, softmax_scale, causal, backend, strict, deterministic)


def backward(q, k, v, out, dout, lse, *, softmax_scale, causal, backend, strict, deterministic):
    check((("q", q, Q), ("k", k, K), ("v", v, V), ("out", out, OUT), ("dout", dout, OUT), ("lse", lse, LSE)))
    # A direct call, not part of a graph being differentiated.
    with torch.no_grad():
        return bwd(q, k, v, out, dout, lse, softmax_scale, causal, backend, strict, deterministic)


def explain(q, k, v, *, softmax_scale, causal, backend, strict, deterministic, backward):
    check((("q", q, Q), ("k", k, K), ("v", v, V)))
    q, k, v = q.detach(), k.detach(), v.detach()
    out_shape, lse_shape = _fwd_shapes(q, v)
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if not backward:
        return _core.forward(q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, backend=backend,
                             strict=strict, explain=True)
    dq, dk, dv = (torch.empty(x.shape, dtype=q.dtype, device=q.device) for x in (q, k, v))
    return _core.backward(q, k, v, out, torch.empty_like(out), lse, dq, dk, dv, softmax_scale=softmax_scale,
                          causal=causal, backend=backend, strict=strict, deterministic=deterministic, explain=True)
