"""numpy on the CPU against a float64 numpy reference, with tolerances tied to the error of standard
attention in the same precision."""

import numpy as np
import pytest

import flashtile
from conftest import SEED
from inputs import LAYOUTS, f64, make
from reference import DTYPES, LSE_POLY_ERR, attention, attention_backward, max_err, np_dtype, standard_backward, \
    forward_magnitudes, lse_magnitudes, standard_forward, visible, within

SEQLENS = (1, 17, 64, 65, 130)
HEAD_DIMS = (8, 16, 32, 40, 64, 80, 96, 128, 160, 256)
GROUPS = (1, 2, 8)
N_SWEEP = 30


def random_case(rng, index):
    """Sweep case `index`: dtype and causal cycle so that every run covers each pair; the rest is random."""
    d = int(rng.choice(HEAD_DIMS))
    return dict(
        dtype=DTYPES[index % 3],
        causal=bool((index // 3) % 2),
        batch=int(rng.integers(1, 3)),
        sq=int(rng.choice(SEQLENS)),
        sk=int(rng.choice(SEQLENS)),
        hkv=int(rng.integers(1, 3)),
        group=int(rng.choice(GROUPS)),
        d=d,
        dv=d if rng.random() < 0.6 else int(rng.choice(HEAD_DIMS)),
        layout=str(rng.choice(LAYOUTS)),
    )


def run_forward_case(rng, c, scale=None):
    hq = c["hkv"] * c["group"]
    q = make(rng, (c["batch"], c["sq"], hq, c["d"]), c["dtype"], c["layout"])
    k = make(rng, (c["batch"], c["sk"], c["hkv"], c["d"]), c["dtype"], c["layout"])
    v = make(rng, (c["batch"], c["sk"], c["hkv"], c["dv"]), c["dtype"], c["layout"])
    out, lse = flashtile.flash_attn_func(q, k, v, softmax_scale=scale, causal=c["causal"], return_lse=True)
    assert out.shape == (c["batch"], c["sq"], hq, c["dv"]) and out.dtype == q.dtype
    assert lse.shape == (c["batch"], hq, c["sq"]) and lse.dtype == np.float32

    ref_out, ref_lse = attention(f64(q), f64(k), f64(v), scale, c["causal"])
    std_out, std_lse = standard_forward(f64(q), f64(k), f64(v), c["dtype"], scale, c["causal"])
    err, std = max_err(out, ref_out), max_err(std_out, ref_out)
    worst = within(out, ref_out, std, forward_magnitudes(f64(q), f64(k), f64(v), scale, c["causal"]), c["dtype"])
    assert worst <= 1, f"out: error {err:.3g} ({worst:.2f} of the allowance), standard attention {std:.3g}, {c}"
    err, std = max_err(lse, ref_lse), max_err(std_lse, ref_lse)
    # lse is float32 whatever the input dtype. -inf rows are checked below.
    seen = np.isfinite(ref_lse)
    worst = within(np.where(seen, lse, 0), np.where(seen, ref_lse, 0), std,
                   lse_magnitudes(f64(q), f64(k), scale, c["causal"]), extra=LSE_POLY_ERR.get(c["dtype"], 0.0))
    assert worst <= 1, f"lse: error {err:.3g} ({worst:.2f} of the allowance), standard {std:.3g}, {c}"

    # Rows that see no key (causal with Sq > Sk): out = 0 and lse = -inf exactly.
    blind = ~visible(c["sq"], c["sk"], c["causal"]).any(axis=1)
    if blind.any():
        assert np.all(f64(out)[:, blind] == 0)
        assert np.all(np.isneginf(lse[:, :, blind]))
    return q, k, v, out, lse


@pytest.mark.parametrize("index", range(N_SWEEP))
def test_forward_sweep(rng, index):
    run_forward_case(rng, random_case(rng, index))


EDGE_CASES = [
    # Sq != Sk both ways, with the bottom-right causal alignment and rows that see nothing.
    dict(sq=1, sk=130, causal=True), dict(sq=130, sk=1, causal=True), dict(sq=65, sk=64, causal=True),
    dict(sq=64, sk=65, causal=True), dict(sq=17, sk=130, causal=False), dict(sq=130, sk=17, causal=False),
    dict(sq=1, sk=1, causal=True), dict(sq=130, sk=130, causal=True, d=256, dv=256),
    dict(sq=65, sk=17, causal=False, group=8, d=8, dv=8), dict(sq=17, sk=65, causal=True, d=40, dv=96),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(EDGE_CASES)))
def test_forward_edges(rng, dtype, case):
    c = dict(batch=2, hkv=2, group=2, d=64, dv=64, layout="contiguous", dtype=dtype)
    c.update(EDGE_CASES[case])
    run_forward_case(rng, c)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_layouts_and_scale(rng, layout):
    c = dict(batch=2, hkv=2, group=2, d=32, dv=48, sq=65, sk=130, causal=True, layout=layout, dtype="float32")
    run_forward_case(rng, c, scale=0.3)


def backward_case(rng, c):
    hq = c["hkv"] * c["group"]
    q = make(rng, (c["batch"], c["sq"], hq, c["d"]), c["dtype"], c["layout"])
    k = make(rng, (c["batch"], c["sk"], c["hkv"], c["d"]), c["dtype"], c["layout"])
    v = make(rng, (c["batch"], c["sk"], c["hkv"], c["dv"]), c["dtype"], c["layout"])
    dout = make(rng, (c["batch"], c["sq"], hq, c["dv"]), c["dtype"], c["layout"])
    out, lse = flashtile.flash_attn_func(q, k, v, causal=c["causal"], return_lse=True)
    dq, dk, dv = flashtile.flash_attn_backward(q, k, v, out, dout, lse, causal=c["causal"])
    for g, x in ((dq, q), (dk, k), (dv, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
    assert flashtile.last_dispatch().ran.kernel.endswith("bwd")

    refs = attention_backward(f64(q), f64(k), f64(v), f64(dout), causal=c["causal"])
    stds = standard_backward(f64(q), f64(k), f64(v), f64(dout), f64(out), c["dtype"], causal=c["causal"])
    mags = attention_backward(f64(q), f64(k), f64(v), f64(dout), causal=c["causal"], magnitudes=True)
    for name, g, ref, std, mag in zip(("dq", "dk", "dv"), (dq, dk, dv), refs, stds, mags):
        err, std_err = max_err(g, ref), max_err(std, ref)
        worst = within(g, ref, std_err, mag, c["dtype"])
        assert worst <= 1, f"{name}: error {err:.3g} ({worst:.2f} of the allowance), standard attention " \
                           f"{std_err:.3g}, {c}"


@pytest.mark.parametrize("index", range(12))
def test_backward_sweep(rng, index):
    c = random_case(rng, index)
    # Keep the float64 reference cheap: the backward materialises several [B, H, Sq, Sk] arrays.
    c["d"], c["dv"] = min(c["d"], 128), min(c["dv"], 128)
    backward_case(rng, c)


@pytest.mark.parametrize("sq,sk", [(1, 130), (130, 1), (65, 64), (17, 17)])
def test_backward_causal_edges(rng, sq, sk):
    backward_case(rng, dict(batch=1, hkv=2, group=2, d=64, dv=32, sq=sq, sk=sk, causal=True, layout="transposed",
                            dtype="float32"))


def test_zero_sized():
    f = np.float32
    # No keys: every row sees nothing.
    q, k, v = np.ones((1, 3, 2, 8), f), np.ones((1, 0, 2, 8), f), np.ones((1, 0, 2, 4), f)
    out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True)
    assert out.shape == (1, 3, 2, 4) and np.all(out == 0) and np.all(np.isneginf(lse))
    # No queries: empty outputs, and no query row contributes to dk, dv.
    q, k, v = np.ones((1, 0, 2, 8), f), np.ones((1, 5, 2, 8), f), np.ones((1, 5, 2, 4), f)
    out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True)
    assert out.shape == (1, 0, 2, 4) and lse.shape == (1, 2, 0)
    dq, dk, dv = flashtile.flash_attn_backward(q, k, v, out, out.copy(), lse)
    assert dq.shape == q.shape and np.all(dk == 0) and np.all(dv == 0)
    # No batch.
    out = flashtile.flash_attn_func(np.ones((0, 4, 2, 8), f), np.ones((0, 4, 2, 8), f), np.ones((0, 4, 2, 8), f))
    assert out.shape == (0, 4, 2, 8)


def test_read_only_and_broadcast_inputs(rng):
    # np.broadcast_to gives read-only arrays with stride 0 on the batch dim; inputs need not be writable.
    q1 = rng.standard_normal((1, 17, 2, 16)).astype(np.float32)
    q = np.broadcast_to(q1, (3, 17, 2, 16))
    k = np.broadcast_to(rng.standard_normal((1, 9, 2, 16)).astype(np.float32), (3, 9, 2, 16))
    v = np.broadcast_to(rng.standard_normal((1, 9, 2, 16)).astype(np.float32), (3, 9, 2, 16))
    assert not q.flags.writeable
    out = flashtile.flash_attn_func(q, k, v)
    ref, _ = attention(f64(q), f64(k), f64(v))
    assert max_err(out, ref) < 1e-5


def test_results_do_not_depend_on_layout(rng):
    q = make(rng, (2, 33, 4, 32), "float16")
    k = make(rng, (2, 40, 2, 32), "float16")
    v = make(rng, (2, 40, 2, 32), "float16")
    a = flashtile.flash_attn_func(q, k, v, causal=True)
    b = flashtile.flash_attn_func(np.swapaxes(np.ascontiguousarray(np.swapaxes(q, 1, 2)), 1, 2), k, v, causal=True)
    assert np.array_equal(a, b)


def test_bfloat16_roundtrip(rng):
    bf16 = np_dtype("bfloat16")
    q, k, v = (make(rng, (1, 17, 2, 64), "bfloat16") for _ in range(3))
    out = flashtile.flash_attn_func(q, k, v)
    assert out.dtype == bf16
    assert "bfloat16" in flashtile.last_dispatch().ran.detail


def test_seed_is_printed():
    assert isinstance(SEED, int)
