"""merge_attention_states: parts of the keys attended separately and merged equal one call over every key
(numpy through the C++ library, torch through torch operations, with gradients); refusals."""

import numpy as np
import pytest

import flashtile

EPS32 = 2.0 ** -23


def _inputs(rng, b=2, sq=6, sk=20, h=3, d=16):
    mk = lambda s: rng.standard_normal((b, s, h, d)).astype(np.float32)  # noqa: E731
    return mk(sq), mk(sk), mk(sk)


def _split(x, bounds):
    return [x[:, a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("bounds", [(0, 8, 20), (0, 1, 20), (0, 5, 5, 12, 20), (0, 20)])
def test_numpy_parts_equal_one_call(bounds):
    rng = np.random.default_rng(len(bounds))
    q, k, v = _inputs(rng)
    call = dict(backend="cpu-reference", strict=True, return_lse=True)
    full_out, full_lse = flashtile.flash_attn_func(q, k, v, **call)
    parts = [flashtile.flash_attn_func(q, kk, vv, **call) for kk, vv in zip(_split(k, bounds), _split(v, bounds))]
    out, lse = flashtile.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    # The merge's own rounding: a few float32 eps per unit of |lse_i - max| (< 10 here) per weight; 64 eps bounds it.
    np.testing.assert_allclose(out, full_out, rtol=0, atol=64 * EPS32 * np.abs(full_out).max())
    np.testing.assert_allclose(lse, full_lse, rtol=64 * EPS32, atol=64 * EPS32)
    if len(parts) == 2:
        out2, lse2 = flashtile.merge_attention_states(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
        np.testing.assert_array_equal(out2, out)
        np.testing.assert_array_equal(lse2, lse)


def test_numpy_all_parts_empty_and_refusals():
    out = np.ones((1, 2, 1, 4), np.float32)
    lse = np.full((1, 1, 2), -np.inf, np.float32)
    o, l = flashtile.merge_attention_states(out, lse, out * 3, lse)
    assert (o == 0).all() and np.isneginf(l).all()
    with pytest.raises(flashtile.InvalidArgumentError, match="one lse per part"):
        flashtile.merge_attention_states([out, out], [lse])
    with pytest.raises(flashtile.InvalidArgumentError, match="at least one part"):
        flashtile.merge_attention_states([], [])
    with pytest.raises(flashtile.DTypeError, match=r"lses\[1\]"):
        flashtile.merge_attention_states(out, lse, out, lse.astype(np.float64))
    with pytest.raises(flashtile.InvalidArgumentError, match=r"outs\[1\]: shape"):
        flashtile.merge_attention_states(out, lse, np.ones((1, 2, 1, 8), np.float32), lse)
    with pytest.raises(TypeError, match="numpy arrays or all torch tensors"):
        flashtile.merge_attention_states(out, lse, [[1.0]], lse)


def test_torch_parts_equal_one_call_and_merge_gradients():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    q, k, v = (torch.from_numpy(x) for x in _inputs(rng))
    full_out, full_lse = flashtile.flash_attn_func(q, k, v, return_lse=True, backend="cpu-reference", strict=True)
    parts = [flashtile.flash_attn_func(q, k[:, a:b], v[:, a:b], return_lse=True, backend="cpu-reference", strict=True)
             for a, b in ((0, 7), (7, 7), (7, 20))]  # with an empty part
    out, lse = flashtile.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    tol = 64 * EPS32 * full_out.abs().max().item()
    assert (out - full_out).abs().max().item() <= tol
    assert (lse - full_lse).abs().max().item() <= 64 * EPS32 * (1 + full_lse.abs().max().item())

    # The merge's gradients in out_i and lse_i, against the same rule written in float64 autograd.
    outs = [p[0].double().clone().requires_grad_(True) for p in parts]
    lses = [p[1].double().clone().requires_grad_(True) for p in parts]
    got_o, got_l = flashtile.merge_attention_states([o.float() for o in outs], [l.float() for l in lses])
    g_o = torch.from_numpy(rng.standard_normal(got_o.shape))
    g_l = torch.from_numpy(rng.standard_normal(got_l.shape))
    got = torch.autograd.grad((got_o.double() * g_o).sum() + (got_l.double() * g_l).sum(), outs + lses,
                              allow_unused=True)
    stacked = torch.stack(lses)
    ref_l = torch.logsumexp(stacked, 0)
    w = torch.exp(stacked - ref_l).nan_to_num(0.0).transpose(2, 3).unsqueeze(-1)
    ref_o = sum(wi * oi for wi, oi in zip(w, outs))
    ref = torch.autograd.grad((ref_o * g_o).sum() + (ref_l * g_l).sum(), outs + lses, allow_unused=True)
    for a, b in zip(got, ref):
        assert (a - b).abs().max().item() <= 64 * EPS32 * (1 + b.abs().max().item())


def test_torch_refuses_mismatched_parts():
    torch = pytest.importorskip("torch")
    o = torch.zeros(1, 3, 2, 4)
    l = torch.zeros(1, 2, 3)
    with pytest.raises(flashtile.InvalidArgumentError, match="do not match"):
        flashtile.merge_attention_states(o, l, torch.zeros(1, 3, 2, 8), l)
    with pytest.raises(flashtile.InvalidArgumentError, match="float32"):
        flashtile.merge_attention_states(o, l, o, l.double())
