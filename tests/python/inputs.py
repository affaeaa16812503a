"""Random inputs in several memory layouts (all with a contiguous last dim)."""

import numpy as np

from reference import np_dtype

LAYOUTS = ("contiguous", "transposed", "padded", "strided")


def make(rng, shape, dtype_name, layout="contiguous", scale=1.0):
    """A [B, S, H, D] array of `dtype_name` in `layout`:
    transposed: stored [B, H, S, D] and viewed as [B, S, H, D] (the torch SDPA layout);
    padded: the last dim is a prefix of a longer row; strided: every other row of a longer sequence."""
    dt = np_dtype(dtype_name)
    x = (rng.standard_normal(shape) * scale).astype(dt)
    b, s, h, d = shape
    if layout == "contiguous":
        return x
    if layout == "transposed":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    if layout == "padded":
        base = np.zeros((b, s, h, d + 3), dtype=dt)
        base[..., :d] = x
        return base[..., :d]
    if layout == "strided":
        base = np.zeros((b, 2 * s, h, d), dtype=dt)
        base[:, ::2] = x
        return base[:, ::2]
    raise ValueError(layout)


def f64(x):
    return np.asarray(x).astype(np.float64)
