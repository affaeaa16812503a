"""The numpy path: outputs are numpy arrays allocated here; inputs cross into C++ through DLPack."""

from __future__ import annotations

import numpy as np

from . import _core
from ._common import Call, check_float, check_rank, kind_name, layouts

def check(args, rank=4) -> None:
    """args: (name, array, layout) triples; every array must be a numpy array of `rank` dims (lse: rank - 1)."""
    for name, x, layout in args:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray like q, got {kind_name(x)}")
        check_rank(name, x, rank - 1 if name == "lse" else rank, layout)
        if name != "lse":
            check_float(name, x)


def _bits(x: np.ndarray) -> np.ndarray:
    # numpy cannot export ml_dtypes' bfloat16 through DLPack; pass the same memory as uint16 and tell the
    # binding (bf16_bits=True) to read it as bfloat16. Genuine uint16 arrays were rejected by check().
    return x.view(np.uint16) if x.dtype.name == "bfloat16" else x


def empty_outputs(q, v, call: Call):
    """out and lse for q, v: lse is [B, Hq, Sq], or [Hq, total_q] for a packed batch."""
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    lse_shape = (q.shape[1], q.shape[0]) if call.varlen else (q.shape[0], q.shape[2], q.shape[1])
    return out, np.empty(lse_shape, dtype=np.float32)


def forward(q, k, v, call: Call, explain=False):
    lq, lk, lv, _, _ = layouts(call)
    rank = 3 if call.varlen else 4
    check((("q", q, lq), ("k", k, lk), ("v", v, lv)), rank)
    out, lse = empty_outputs(q, v, call)
    report = _core.forward(_bits(q), _bits(k), _bits(v), _bits(out), lse, softmax_scale=call.softmax_scale,
                           causal=call.causal, backend=call.backend, strict=call.strict, bf16_bits=True,
                           explain=explain, variants=call.variants())
    return report if explain else (out, lse)


def backward(q, k, v, out, dout, lse, call: Call, explain=False):
    """(dq, dk, dv), and dsinks as a fourth entry when call.sinks is given."""
    lq, lk, lv, lo, ll = layouts(call)
    rank = 3 if call.varlen else 4
    check((("q", q, lq), ("k", k, lk), ("v", v, lv), ("out", out, lo), ("dout", dout, lo), ("lse", lse, ll)), rank)
    dq = np.empty(q.shape, dtype=q.dtype)
    # With no query rows the library runs no kernel, and dk, dv (sums over query rows) must be zero.
    alloc = np.zeros if q.shape[0 if call.varlen else 1] == 0 else np.empty
    dk = alloc(k.shape, dtype=q.dtype)
    dv = alloc(v.shape, dtype=q.dtype)
    dsinks = None if call.sinks is None else np.empty(np.shape(call.sinks), dtype=np.float32)
    report = _core.backward(_bits(q), _bits(k), _bits(v), _bits(out), _bits(dout), lse, _bits(dq), _bits(dk),
                            _bits(dv), softmax_scale=call.softmax_scale, causal=call.causal, backend=call.backend,
                            strict=call.strict, deterministic=call.deterministic, bf16_bits=True, explain=explain,
                            variants=call.variants(dsinks))
    if explain:
        return report
    return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)
