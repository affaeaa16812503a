"""Float64 numpy attention (the oracle) and standard attention in low precision (the error yardstick).

Layouts as in flashtile: q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], out [B, Sq, Hq, Dv],
lse [B, Hq, Sq]. Causal masks are bottom-right aligned: query i sees keys j <= i + Sk - Sq.
"""

import numpy as np

try:
    import ml_dtypes
except ImportError:  # bfloat16 tests skip
    ml_dtypes = None

DTYPES = ("float32", "float16", "bfloat16")


def np_dtype(name):
    if name == "bfloat16":
        if ml_dtypes is None:
            import pytest

            pytest.skip("bfloat16 needs ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def rounded(x, dtype):
    """x rounded to `dtype`, returned as float32 (numpy arithmetic on bfloat16 is slow and not the point)."""
    return np.asarray(x, dtype=np.float32).astype(dtype).astype(np.float32)


def visible(sq, sk, causal):
    """[Sq, Sk] bool: which keys each query row sees."""
    if not causal:
        return np.ones((sq, sk), dtype=bool)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return j <= i + sk - sq


def _expand_kv(k, v, hq):
    g = hq // k.shape[2]
    return np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)


def _scores(q, k, scale, causal, ftype):
    kk, _ = _expand_kv(k, k, q.shape[2])
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(ftype), kk.astype(ftype)) * ftype(scale)
    mask = visible(q.shape[1], k.shape[1], causal)
    return np.where(mask, s, -np.inf), mask


def _softmax(s):
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(l > 0, p / np.where(l > 0, l, 1), 0)
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(np.where(l > 0, l, 1)[..., 0]), -np.inf)
    return p, lse


def attention(q, k, v, scale=None, causal=False, ftype=np.float64, p_dtype=None):
    """Standard attention computed in `ftype`. p_dtype rounds P to a 16-bit type before P @ V, as a
    16-bit kernel feeding its tensor cores would. Returns out [B, Sq, Hq, Dv] and lse [B, Hq, Sq]."""
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    s, _ = _scores(q, k, scale, causal, ftype)
    p, lse = _softmax(s)
    if p_dtype is not None:
        p = rounded(p, p_dtype).astype(ftype)
    _, vv = _expand_kv(k, v, q.shape[2])
    out = np.einsum("bhqk,bkhd->bqhd", p, vv.astype(ftype))
    return out, lse


def forward_magnitudes(q, k, v, scale=None, causal=False):
    """[B, Sq, Hq, Dv]: sum_j P_ij (1 + |s|_ij) |v_j|, where |s|_ij = scale * sum_d |q_id k_jd| scales the
    rounding error of the float32 score that P_ij is the exponential of."""
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    s, _ = _scores(q, k, scale, causal, np.float64)
    p, _ = _softmax(s)
    s_abs, mask = _scores(np.abs(q), np.abs(k), scale, causal, np.float64)
    _, vv = _expand_kv(k, np.abs(v), q.shape[2])
    return np.einsum("bhqk,bkhd->bqhd", p * (1 + np.where(mask, s_abs, 0)), vv)


def lse_magnitudes(q, k, scale=None, causal=False):
    """[B, Hq, Sq]: |lse| plus the largest sum of |scale * q_d * k_d| over the row's visible keys, the
    scale of the rounding error of a float32 lse (kernels fold scale * log2(e) into q and work in log2)."""
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    s_abs, mask = _scores(np.abs(q), np.abs(k), scale, causal, np.float64)
    _, lse = attention(q, k, k[..., :1], scale, causal)
    row = np.where(mask, s_abs, 0).max(axis=-1, initial=0.0)
    return row + np.abs(np.where(np.isfinite(lse), lse, 0))


def attention_backward(q, k, v, dout, scale=None, causal=False, ftype=np.float64, low=None, out=None,
                       magnitudes=False):
    """dq, dk, dv of standard attention in `ftype`. With `low` (a 16-bit dtype) P and dS are rounded to it
    before their products, and D = rowsum(dout * out) uses the given (rounded) out, as 16-bit kernels do.

    magnitudes=True returns instead the same sums taken over absolute values: the scale of the terms that
    cancel in each gradient element, which is what its rounding error is proportional to (dq is exactly
    0 with one visible key, yet its terms are not small)."""
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    hq, hkv = q.shape[2], k.shape[2]
    s, _ = _scores(q, k, scale, causal, ftype)
    p, lse = _softmax(s)
    kk, vv = _expand_kv(k.astype(ftype), v.astype(ftype), hq)
    do = dout.astype(ftype)
    if out is None:
        out = np.einsum("bhqk,bkhd->bqhd", p, vv)
    pl = rounded(p, low).astype(ftype) if low is not None else p
    dv_full = np.einsum("bhqk,bqhd->bkhd", pl, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vv)
    delta = np.einsum("bqhd,bqhd->bhq", do, out.astype(ftype))[..., None]
    if magnitudes:
        # A FlashAttention backward recomputes P = exp(s - lse) from a float32 lse: its relative error
        # grows with |s| + |lse|, which plain attention (P from a fresh softmax) does not pay.
        s_abs = np.einsum("bqhd,bkhd->bhqk", np.abs(q), np.abs(kk)) * ftype(scale)
        lse_abs = np.abs(np.where(np.isfinite(lse), lse, 0))[..., None]
        p = p * (1 + s_abs + lse_abs)
        kk, vv, q, do = np.abs(kk), np.abs(vv), np.abs(q), np.abs(do)
        dp = np.einsum("bqhd,bkhd->bhqk", do, vv)
        delta = np.einsum("bqhd,bqhd->bhq", do, np.abs(out.astype(ftype)))[..., None]
        ds = p * (dp + delta)
        dv_full = np.einsum("bhqk,bqhd->bkhd", p, do)
    else:
        ds = p * (dp - delta)
    if low is not None:
        ds = rounded(ds, low).astype(ftype)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk) * ftype(scale)
    dk_full = np.einsum("bhqk,bqhd->bkhd", ds, q.astype(ftype)) * ftype(scale)

    def fold(x):  # sum the query heads of each KV group
        b, sk, _, d = x.shape
        return x.reshape(b, sk, hkv, hq // hkv, d).sum(axis=3)

    return dq, fold(dk_full), fold(dv_full)


def standard_forward(q, k, v, dtype_name, scale=None, causal=False):
    """What plain attention in the inputs' precision gets: float32 arithmetic for float32 inputs; for
    16-bit inputs float32 scores, P rounded to the 16-bit type, and the output rounded to it."""
    if dtype_name == "float32":
        return attention(q, k, v, scale, causal, ftype=np.float32)
    dt = np_dtype(dtype_name)
    out, lse = attention(q, k, v, scale, causal, ftype=np.float32, p_dtype=dt)
    return rounded(out, dt), lse


def standard_backward(q, k, v, dout, out, dtype_name, scale=None, causal=False):
    if dtype_name == "float32":
        return attention_backward(q, k, v, dout, scale, causal, ftype=np.float32)
    dt = np_dtype(dtype_name)
    grads = attention_backward(q, k, v, dout, scale, causal, ftype=np.float32, low=dt, out=out)
    return tuple(rounded(g, dt) for g in grads)


def max_err(x, ref):
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    both_inf = np.isneginf(x) & np.isneginf(ref)
    with np.errstate(invalid="ignore"):
        d = np.where(both_inf, 0.0, np.abs(x - ref))
    return float(np.nan_to_num(d, nan=np.inf).max(initial=0.0))


EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}

# The bf16 forwards (vdpbf16ps pairs, AMX tiles) take P from a degree-4 polynomial for 2^f, relative error at most
# 4e-6 (src/cpu/exp2.h kExp2Bf16Poly; tests/test_exp2.cpp Bf16PolynomialRelativeError bounds it): each row sum l
# carries that relative error, so LSE = m + log l carries it as an absolute one. A drawn case (seed 2983954312, d = 8,
# causal) had LSE off by 1.59e-6 against 2.2e-7 for standard attention, 1.02 of the float32 allowance without it.
LSE_POLY_ERR = {"bfloat16": 4e-6}


def within(x, ref, std_err, magnitude, dtype_name="float32", factor=4.0, extra=0.0):
    """Elementwise |x - ref| <= factor * std_err + 2 eps32 * magnitude + ulp(ref) + extra, where magnitude is the
    sum of the absolute values of the terms behind each element (forward_magnitudes, lse_magnitudes,
    attention_backward(magnitudes=True)), extra an absolute bound of a known error (LSE_POLY_ERR), and eps32
    float32's epsilon, the precision kernels compute in
    whatever the storage type. std_err, standard attention's error in the same precision, carries the
    16-bit rounding of P; ulp(ref) the final rounding to `dtype_name`. Returns the worst ratio of error to
    allowance (<= 1 passes)."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    allow = (factor * std_err + 2 * EPS["float32"] * np.asarray(magnitude, dtype=np.float64)
             + EPS[dtype_name] * np.abs(ref) + extra + 1e-30)
    return float((np.abs(x - ref) / allow).max(initial=0.0))
