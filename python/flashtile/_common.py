"""Argument checks and state shared by the numpy and torch paths."""

from __future__ import annotations

from . import _core

InvalidArgumentError = _core.InvalidArgumentError
DTypeError = _core.DTypeError

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


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
