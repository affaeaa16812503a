"""Bad inputs raise the right exception type, with a message that names the argument, before any kernel
runs; nothing crashes the interpreter."""

import numpy as np
import pytest

import flashtile
from inputs import make


@pytest.fixture
def qkv(rng):
    return (make(rng, (2, 17, 4, 32), "float32"), make(rng, (2, 9, 2, 32), "float32"),
            make(rng, (2, 9, 2, 16), "float32"))


def call(q, k, v, **kw):
    return flashtile.flash_attn_func(q, k, v, **kw)


def test_exception_hierarchy():
    assert issubclass(flashtile.InvalidArgumentError, ValueError)
    assert issubclass(flashtile.DeviceError, ValueError)
    assert issubclass(flashtile.DTypeError, TypeError)
    assert issubclass(flashtile.UnsupportedError, RuntimeError)
    assert issubclass(flashtile.BackendError, RuntimeError)
    for e in (flashtile.InvalidArgumentError, flashtile.DeviceError, flashtile.DTypeError,
              flashtile.UnsupportedError, flashtile.BackendError):
        assert issubclass(e, flashtile.FlashTileError)
        assert e.__module__ == "flashtile"


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint16, np.bool_])
def test_unsupported_dtype(qkv, dtype):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"^q: unsupported dtype"):
        call(q.astype(dtype), k, v)
    with pytest.raises(flashtile.DTypeError, match=r"^v: unsupported dtype"):
        call(q, k, v.astype(dtype))


def test_mismatched_dtypes(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"^k: dtype float16 does not match q's dtype \(float32\)"):
        call(q, k.astype(np.float16), v)


def test_non_contiguous_last_dim(qkv):
    q, k, v = qkv
    wide = np.repeat(q, 2, axis=3)[..., ::2]
    assert wide.strides[3] != wide.itemsize
    with pytest.raises(ValueError, match=r"^q: the last dimension must be contiguous"):
        call(wide, k, v)
    with pytest.raises(ValueError, match=r"^v: the last dimension must be contiguous"):
        call(q, k, np.asfortranarray(v))


def test_negative_strides(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^k: negative strides"):
        call(q, k[:, ::-1], v)


@pytest.mark.parametrize(
    "change,pattern",
    [
        (lambda q, k, v: (q, k[:1], v), r"^k: expected \[B, Sk, Hkv, D\] with B = 2"),
        (lambda q, k, v: (q, k[..., :16], v), r"^k: expected \[B, Sk, Hkv, D\] with B = 2 and D = 32"),
        (lambda q, k, v: (q, k, v[:, :5]), r"^v: expected shape \[2, 9, 2, 16\]"),
        (lambda q, k, v: (q[:, :, :3], k, v), r"^k: query heads Hq = 3 must be a multiple"),
        (lambda q, k, v: (np.zeros((2, 17, 4, 300), np.float32), np.zeros((2, 9, 2, 300), np.float32), v),
         r"^q: head dim D = 300 is out of range"),
        (lambda q, k, v: (q[0], k, v), r"^q: expected 4 dimensions \[B, Sq, Hq, D\], got 3"),
        (lambda q, k, v: (q, k, v[None]), r"^v: expected 4 dimensions \[B, Sk, Hkv, Dv\], got 5"),
    ],
)
def test_mismatched_shapes(qkv, change, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(*change(*qkv))


def test_not_an_array(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"^q: expected a numpy.ndarray or a torch.Tensor, got list"):
        call(q.tolist(), k, v)
    with pytest.raises(TypeError, match=r"^v: expected a numpy.ndarray like q, got float"):
        call(q, k, 1.0)


def test_byte_swapped_array_is_refused_not_copied(qkv):
    # Only native byte order crosses DLPack; FlashTile never converts silently.
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"^q: unsupported dtype >f4"):
        call(q.astype(">f4"), k, v)


def test_bad_options(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^softmax_scale: must be finite"):
        call(q, k, v, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match=r"^backend: unknown backend 'cuda-sm999'; this build has: auto, .*cpu-flash"):
        call(q, k, v, backend="cuda-sm999")
    with pytest.raises(ValueError, match=r"^dropout_p: FlashTile has no dropout"):
        call(q, k, v, dropout_p=0.1)
    with pytest.raises(TypeError):
        flashtile.flash_attn_func(q, k, v, 0.0)  # flash_attn's 4th positional is dropout_p: keyword-only here


def test_sm_margin(qkv):
    """sm_margin (a CUDA option): a bad value is refused naming it on every door; on the CPU a good one changes
    nothing."""
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^sm_margin: must be >= 0, got -1"):
        call(q, k, v, sm_margin=-1)
    with pytest.raises(ValueError, match=r"^sm_margin: expected an int .*got float 2.0"):
        call(q, k, v, sm_margin=2.0)
    with pytest.raises(ValueError, match=r"^sm_margin: must fit an int, got 4294967296"):
        call(q, k, v, sm_margin=1 << 32)
    out, lse = call(q, k, v, return_lse=True)
    out2, lse2 = call(q, k, v, return_lse=True, sm_margin=3)
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
    dq, dk, dv = flashtile.flash_attn_backward(q, k, v, out, out, lse)
    g = flashtile.flash_attn_backward(q, k, v, out, out, lse, sm_margin=3)
    assert all(np.array_equal(a, b) for a, b in zip((dq, dk, dv), g))
    with pytest.raises(ValueError, match=r"^sm_margin: must be >= 0, got -2"):
        flashtile.flash_attn_backward(q, k, v, out, out, lse, sm_margin=-2)
    with pytest.raises(ValueError, match=r"^sm_margin: must be >= 0, got -4"):
        flashtile.explain(q, k, v, sm_margin=-4)


def test_backward_bad_inputs(qkv):
    q, k, v = qkv
    out, lse = call(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match=r"^lse: unsupported dtype float64"):
        flashtile.flash_attn_backward(q, k, v, out, out, lse.astype(np.float64))
    with pytest.raises(ValueError, match=r"^lse: expected shape \[2, 4, 17\]"):
        flashtile.flash_attn_backward(q, k, v, out, out, lse[:, :, :5])
    with pytest.raises(ValueError, match=r"^dout: expected shape"):
        flashtile.flash_attn_backward(q, k, v, out, out[:, :3], lse)
    with pytest.raises(TypeError, match=r"^dout: dtype float16 does not match"):
        flashtile.flash_attn_backward(q, k, v, out, out.astype(np.float16), lse)


def test_sdpa_bad_inputs(rng):
    q = make(rng, (2, 17, 4, 32), "float32").transpose(0, 2, 1, 3)
    kv = make(rng, (2, 9, 2, 32), "float32").transpose(0, 2, 1, 3)
    with pytest.raises(ValueError, match=r"^key: 2 heads differ from query's 4; pass enable_gqa=True"):
        flashtile.scaled_dot_product_attention(q, kv, kv)
    with pytest.raises(ValueError, match=r"^attn_mask: not supported"):
        flashtile.scaled_dot_product_attention(q, kv, kv, np.ones((17, 9), bool), enable_gqa=True)
    with pytest.raises(ValueError, match=r"^query: expected 4 dimensions \(B, Hq, Sq, D\), got 3"):
        flashtile.scaled_dot_product_attention(q[0], kv, kv, enable_gqa=True)


def test_errors_leave_no_state(qkv):
    q, k, v = qkv
    call(q, k, v)
    before = str(flashtile.last_dispatch())
    with pytest.raises(ValueError):
        call(q, k[:1], v)
    assert str(flashtile.last_dispatch()) == before
