"""The numpy path: outputs are numpy arrays allocated here; inputs cross into C++ through DLPack."""

from __future__ import annotations

import numpy as np

from . import _core
from ._common import check_float, check_rank, kind_name

Q, K, V = "[B, Sq, Hq, D]", "[B, Sk, Hkv, D]", "[B, Sk, Hkv, Dv]"
OUT, LSE = "[B, Sq, Hq, Dv]", "[B, Hq, Sq]"


def check(args) -> None:
    """args: (name, array, layout) triples; every array must be a 4-D (3-D for lse) numpy array."""
    for name, x, layout in args:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray like q, got {kind_name(x)}")
        check_rank(name, x, 3 if name == "lse" else 4, layout)
        if name != "lse":
            check_float(name, x)


def _bits(x: np.ndarray) -> np.ndarray:
    # numpy cannot export ml_dtypes' bfloat16 through DLPack; pass the same memory as uint16 and tell the
    # binding (bf16_bits=True) to read it as bfloat16. Genuine uint16 arrays were rejected by check().
    return x.view(np.uint16) if x.dtype.name == "bfloat16" else x


def forward(q, k, v, *, softmax_scale, causal, backend, strict, explain=False):
    check((("q", q, Q), ("k", k, K), ("v", v, V)))
    b, sq, hq, _ = q.shape
    out = np.empty((b, sq, hq, v.shape[3]), dtype=q.dtype)
    lse = np.empty((b, hq, sq), dtype=np.float32)
    report = _core.forward(_bits(q), _bits(k), _bits(v), _bits(out), lse, softmax_scale=softmax_scale,
                           causal=causal, backend=backend, strict=strict, bf16_bits=True, explain=explain)
    return report if explain else (out, lse)


def backward(q, k, v, out, dout, lse, *, softmax_scale, causal, backend, strict, deterministic, explain=False):
    check((("q", q, Q), ("k", k, K), ("v", v, V), ("out", out, OUT), ("dout", dout, OUT), ("lse", lse, LSE)))
    dq = np.empty(q.shape, dtype=q.dtype)
    # With no query rows the library runs no kernel, and dk, dv (sums over query rows) must be zero.
    alloc = np.zeros if q.shape[1] == 0 else np.empty
    dk = alloc(k.shape, dtype=q.dtype)
    dv = alloc(v.shape, dtype=q.dtype)
    report = _core.backward(_bits(q), _bits(k), _bits(v), _bits(out), _bits(dout), lse, _bits(dq), _bits(dk),
                            _bits(dv), softmax_scale=softmax_scale, causal=causal, backend=backend,
                            strict=strict, deterministic=deterministic, bf16_bits=True, explain=explain)
    return report if explain else (dq, dk, dv)
