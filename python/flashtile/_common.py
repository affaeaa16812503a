"""Argument checks and state shared by the numpy and torch paths."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _core

InvalidArgumentError = _core.InvalidArgumentError
DTypeError = _core.DTypeError

FLOAT_DTYPES = ("float32", "float16", "bfloat16")

Q, K, V = "[B, Sq, Hq, D]", "[B, Sk, Hkv, D]", "[B, Sk, Hkv, Dv]"
OUT, LSE = "[B, Sq, Hq, Dv]", "[B, Hq, Sq]"
# A packed (varlen) batch.
VQ, VK, VV = "[total_q, Hq, D]", "[total_k, Hkv, D]", "[total_k, Hkv, Dv]"
VOUT, VLSE = "[total_q, Hq, Dv]", "[Hq, total_q]"


def last_dispatch():
    """The DispatchReport of the most recent forward or backward call made through flashtile in this
    process (any thread: torch runs the backward on its own threads), or None before the first call."""
    return _core.last_report()


def dtype_name(x) -> str:
    # torch.float16 -> "float16"; numpy (and ml_dtypes) dtypes already print that way.
    return str(x.dtype).replace("torch.", "")


def shape_str(x) -> str:
    return "[" + ", ".join(str(int(s)) for s in x.shape) + "]"


def check_rank(name: str, x, rank: int, layout: str) -> None:
    if x.ndim != rank:
        raise InvalidArgumentError(
            f"{name}: expected {rank} dimensions {layout}, got {x.ndim} (shape {shape_str(x)})"
        )


def check_float(name: str, x) -> None:
    if dtype_name(x) not in FLOAT_DTYPES:
        raise DTypeError(
            f"{name}: unsupported dtype {dtype_name(x)}; FlashTile takes float32, float16 or bfloat16"
        )


def check_dropout(dropout_p) -> None:
    # Accepted so that calls written for flash_attn / torch keep working when they pass 0.0.
    if dropout_p != 0.0:
        raise InvalidArgumentError(f"dropout_p: FlashTile has no dropout; expected 0.0, got {dropout_p}")


def kind_name(x) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


class Call(NamedTuple):
    """A call's arguments after q, k, v, in the order of the torch ops' schemas (flashtile_ext::attention,
    flashtile::fwd): the varlen description, the per-head tensors, then the scalar options."""
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    alibi_slopes: Any = None
    sinks: Any = None
    softmax_scale: Optional[float] = None
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    backend: str = "auto"
    strict: bool = False
    deterministic: bool = False
    sm_margin: int = 0

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None or self.cu_seqlens_k is not None

    def variants(self, dsinks=None):
        """The tuple flashtile._core takes for the variants, or None for a plain call (the cheap path)."""
        if (self.cu_seqlens_q is None and self.cu_seqlens_k is None and self.alibi_slopes is None
                and self.sinks is None and self.window_left == -1 and self.window_right == -1
                and self.softcap == 0.0 and self.sm_margin == 0):
            return None
        return (self.window_left, self.window_right, self.softcap, self.alibi_slopes, self.sinks, dsinks,
                self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k, self.sm_margin)


def window_pair(window_size):
    """(left, right) from flash_attn's window_size; the library checks the values (>= -1)."""
    try:
        left, right = window_size
        return int(left), int(right)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"window_size: expected a pair (left, right) of integers, -1 for unbounded; "
                                   f"got {window_size!r}") from None


def sm_margin_arg(sm_margin) -> int:
    """sm_margin as an int (the library checks its value: >= 0, below the device's SM count)."""
    if isinstance(sm_margin, int) and not isinstance(sm_margin, bool):
        return sm_margin
    raise InvalidArgumentError(f"sm_margin: expected an int (SMs to leave free), got {kind_name(sm_margin)} "
                               f"{sm_margin!r}")


def make_call(softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, backend, strict, deterministic,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, sm_margin=0) -> Call:
    left, right = (-1, -1) if window_size == (-1, -1) else window_pair(window_size)
    return Call(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), alibi_slopes, sinks,
                softmax_scale, bool(causal), left, right, float(softcap), backend, bool(strict), bool(deterministic),
                sm_margin_arg(sm_margin))


def layouts(call: Call):
    """(q, k, v, out, lse) layouts of this call, varlen or not, for error messages."""
    return (VQ, VK, VV, VOUT, VLSE) if call.varlen else (Q, K, V, OUT, LSE)
