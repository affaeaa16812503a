"""The variants through the Python API (issue 12): sliding window, softcap, ALiBi, sinks and packed (varlen)
batches, on torch (both eager doors, autograd including dsinks, torch.compile) and numpy, against a float64
reference written here from the definition (torch autograd in float64 gives its gradients). The C++ suite checks
every ISA path and the edge cases against the library's float64 oracle; this file checks that the Python layer
passes each argument through with the semantics the docs state."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashtile  # noqa: E402
from flashtile import _torch_ops  # noqa: E402

EPS32 = 2.0 ** -24


def reference(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None, sinks=None):
    """One sequence: q (Sq, Hq, D), k (Sk, Hkv, D), v (Sk, Hkv, Dv); alibi (Hq), sinks (Hq). Returns out
    (Sq, Hq, Dv) and lse (Hq, Sq), in the tensors' dtype, differentiable."""
    sq, hq, d = q.shape
    sk, hkv = k.shape[:2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kk, vv = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = i + sk - sq
    if alibi is not None:
        s = s - alibi[:, None, None] * (diag - j).abs().to(s.dtype)
    left, right = window
    right = 0 if causal else right
    seen = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        seen &= j >= diag - left
    if right >= 0:
        seen &= j <= diag + right
    s = s.masked_fill(~seen, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks[:, None, None].expand(hq, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    p = torch.where(torch.isfinite(lse)[..., None], p, 0)[..., :sk]  # a row that sees nothing: P = 0
    return torch.einsum("hqk,khd->qhd", p, vv), lse


def close(name, got, ref64, std):
    """got within the error of the same reference computed in float32 (std), plus a few float32 ulps."""
    got, ref64, std = got.detach().double(), ref64.detach().double(), std.detach().double()
    finite = torch.isfinite(ref64)
    assert torch.equal(torch.isfinite(got), finite), f"{name}: -inf / finite pattern differs"
    scale = ref64[finite].abs().max().item() if finite.any() else 0.0
    err = (got - ref64)[finite].abs().max().item() if finite.any() else 0.0
    base = (std - ref64)[finite].abs().max().item() if finite.any() else 0.0
    assert err <= 4 * base + 64 * EPS32 * scale, f"{name}: error {err:.3g}, float32 reference {base:.3g}"


def rand(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


VARIANTS = {
    "window": dict(window_size=(5, 2)),
    "causal_window": dict(causal=True, window_size=(7, -1)),
    "softcap": dict(softcap=2.5),
    "alibi": dict(alibi=True),
    "sinks": dict(sinks=True),
    "all": dict(causal=True, window_size=(9, -1), softcap=3.0, alibi=True, sinks=True),
}


def make_args(rng, hq, spec):
    kw = {key: val for key, val in spec.items() if key not in ("alibi", "sinks")}
    alibi = torch.rand(hq) * 0.5 if spec.get("alibi") else None
    sinks = rand(rng, hq).requires_grad_(True) if spec.get("sinks") else None
    return kw, alibi, sinks


def ref_kwargs(kw, alibi, sinks):
    return dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                softcap=kw.get("softcap", 0.0), alibi=alibi, sinks=sinks)


def grads_of(out, inputs, dout):
    live = [x for x in inputs if x is not None]
    return torch.autograd.grad(out, live, dout)


@pytest.mark.parametrize("door", ["extension", "python"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_dense_variants_forward_and_gradients(rng, monkeypatch, door, name):
    if door == "python":
        monkeypatch.setattr(_torch_ops, "_ext", None)
    elif _torch_ops._ext is None:
        pytest.skip(f"flashtile._torch_ext: {flashtile.torch_extension()}")
    b, sq, sk, hq, hkv, d = 2, 37, 70, 4, 2, 32
    kw, alibi, sinks = make_args(rng, hq, VARIANTS[name])
    q, k, v = (x.requires_grad_(True) for x in (rand(rng, b, sq, hq, d), rand(rng, b, sk, hkv, d),
                                                 rand(rng, b, sk, hkv, d)))
    dout = rand(rng, b, sq, hq, d)
    out, lse = flashtile.flash_attn_func(q, k, v, alibi_slopes=alibi, sinks=sinks, return_lse=True, **kw)
    assert not lse.requires_grad
    g = grads_of(out, (q, k, v, sinks), dout)
    for bi in range(b):
        parts = {}
        for ft in (torch.float64, torch.float32):
            args = [x.detach()[bi].to(ft).requires_grad_(True) for x in (q, k, v)]
            s = None if sinks is None else sinks.detach().to(ft).requires_grad_(True)
            o, l = reference(*args, **ref_kwargs(kw, None if alibi is None else alibi.to(ft), s))
            parts[ft] = (o, l, grads_of(o, (*args, s), dout[bi].to(ft)))
        (o64, l64, g64), (o32, l32, g32) = parts[torch.float64], parts[torch.float32]
        close("out", out[bi], o64, o32)
        close("lse", lse[bi], l64, l32)
        for gname, got, r, s in zip(("dq", "dk", "dv"), g[:3], g64[:3], g32[:3]):
            close(gname, got[bi], r, s)
    if sinks is not None:  # dsinks sums over the batch: compare the whole
        s64 = sinks.detach().double().requires_grad_(True)
        s32 = sinks.detach().requires_grad_(True)
        total = [0, 0]
        for bi in range(b):
            for n, (ft, s) in enumerate(((torch.float64, s64), (torch.float32, s32))):
                args = [x.detach()[bi].to(ft) for x in (q, k, v)]
                o, _ = reference(*args, **ref_kwargs(kw, None if alibi is None else alibi.to(ft), s))
                total[n] = total[n] + (o * dout[bi].to(ft)).sum()
        close("dsinks", g[3], torch.autograd.grad(total[0], s64)[0], torch.autograd.grad(total[1], s32)[0])


def packed(rng, lens, h, d):
    return rand(rng, sum(lens), h, d)


def cu(lens):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)


def test_varlen_matches_reference_per_sequence(rng):
    """Mixed lengths with an empty sequence and Sq > Sk in one of them; causal + window + GQA + softcap + sinks."""
    lq, lk = [5, 0, 17, 9, 12], [8, 3, 17, 30, 6]
    hq, hkv, d = 4, 2, 16
    kw = dict(causal=True, window_size=(6, -1), softcap=4.0)
    sinks = rand(rng, hq).requires_grad_(True)
    q, k, v = (x.requires_grad_(True) for x in (packed(rng, lq, hq, d), packed(rng, lk, hkv, d),
                                                 packed(rng, lk, hkv, d)))
    dout = packed(rng, lq, hq, d)
    out, lse = flashtile.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), sinks=sinks,
                                                return_lse=True, **kw)
    assert out.shape == (sum(lq), hq, d) and lse.shape == (hq, sum(lq))
    dq, dk, dv, dsinks = grads_of(out, (q, k, v, sinks), dout)
    cq, ck = cu(lq).tolist(), cu(lk).tolist()
    for bi in range(len(lq)):
        rq, rk = slice(cq[bi], cq[bi + 1]), slice(ck[bi], ck[bi + 1])
        res = {}
        for ft in (torch.float64, torch.float32):
            args = [x.detach()[r].to(ft).requires_grad_(True) for x, r in ((q, rq), (k, rk), (v, rk))]
            o, l = reference(*args, **ref_kwargs(kw, None, sinks.detach().to(ft)))
            res[ft] = (o, l, grads_of(o, args, dout[rq].to(ft)) if o.numel() else [torch.zeros_like(a) for a in args])
        (o64, l64, g64), (o32, l32, g32) = res[torch.float64], res[torch.float32]
        close(f"out[{bi}]", out[rq], o64, o32)
        close(f"lse[{bi}]", lse[:, rq], l64, l32)
        for gname, got, r, s in zip(("dq", "dk", "dv"), (dq[rq], dk[rk], dv[rk]), g64, g32):
            close(f"{gname}[{bi}]", got, r, s)
    assert dsinks.shape == (hq,) and torch.isfinite(dsinks).all()


def test_numpy_path_gives_the_torch_numbers(rng):
    """numpy forward and backward functions, dense and varlen, with the variants: the same kernels as torch."""
    lq, lk, hq, d = [6, 11], [9, 4], 2, 16
    q, k, v, dout = (packed(rng, lq, hq, d), packed(rng, lk, hq, d), packed(rng, lk, hq, d), packed(rng, lq, hq, d))
    sinks = rand(rng, hq)
    alibi = torch.rand(hq)
    kw = dict(window_size=(3, 1), softcap=2.0, deterministic=True)
    args = (cu(lq), cu(lk), max(lq), max(lk))
    tq, tk, tv = (x.clone().requires_grad_(True) for x in (q, k, v))
    ts = sinks.clone().requires_grad_(True)
    out, lse = flashtile.flash_attn_varlen_func(tq, tk, tv, *args, alibi_slopes=alibi, sinks=ts, return_lse=True,
                                                **kw)
    tgrads = grads_of(out, (tq, tk, tv, ts), dout)
    nargs = tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in args)
    nout, nlse = flashtile.flash_attn_varlen_func(q.numpy(), k.numpy(), v.numpy(), *nargs,
                                                  alibi_slopes=alibi.numpy(), sinks=sinks.numpy(), return_lse=True,
                                                  **kw)
    ngrads = flashtile.flash_attn_varlen_backward(q.numpy(), k.numpy(), v.numpy(), nout, dout.numpy(), nlse, *nargs,
                                                  alibi_slopes=alibi.numpy(), sinks=sinks.numpy(), **kw)
    assert np.array_equal(out.detach().numpy(), nout) and np.array_equal(lse.numpy(), nlse)
    assert len(ngrads) == 4
    for t, n in zip(tgrads, ngrads):
        assert np.array_equal(t.numpy(), n)


def test_compile_traces_the_variants(rng):
    hq, d = 2, 16
    sinks = rand(rng, hq).requires_grad_(True)

    def dense(q, k, v):
        return flashtile.flash_attn_func(q, k, v, causal=True, window_size=(4, -1), softcap=3.0, sinks=sinks)

    cu_seqlens = cu([5, 7])

    def varlen(q, k, v):
        return flashtile.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, 7, 7, window_size=(2, 2))

    for fn, shape in ((dense, (2, 9, hq, d)), (varlen, (12, hq, d))):
        x = [rand(rng, *shape).requires_grad_(True) for _ in range(3)]
        eager = fn(*x)
        ge = torch.autograd.grad(eager.square().sum(), x)
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*x)
        gc = torch.autograd.grad(compiled.square().sum(), x)
        assert torch.equal(eager, compiled)
        for a, c in zip(ge, gc):
            assert torch.allclose(a, c, rtol=0, atol=1e-6)


def test_variant_errors_name_the_argument(rng):
    q, k, v = rand(rng, 1, 8, 2, 16), rand(rng, 1, 8, 2, 16), rand(rng, 1, 8, 2, 16)
    with pytest.raises(flashtile.InvalidArgumentError, match=r"^window_size"):
        flashtile.flash_attn_func(q, k, v, window_size="wide")
    with pytest.raises(flashtile.InvalidArgumentError, match=r"window_size"):
        flashtile.flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(flashtile.InvalidArgumentError, match=r"softcap"):
        flashtile.flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(flashtile.FlashTileError, match=r"alibi_slopes"):
        flashtile.flash_attn_func(q, k, v, alibi_slopes=torch.ones(3))
    with pytest.raises(flashtile.FlashTileError, match=r"sinks"):
        flashtile.flash_attn_func(q, k, v, sinks=torch.ones(2, dtype=torch.float16))
    pq, pk = rand(rng, 8, 2, 16), rand(rng, 8, 2, 16)
    with pytest.raises(flashtile.DTypeError, match=r"cu_seqlens_q"):
        flashtile.flash_attn_varlen_func(pq, pk, pk, cu([8]).float(), cu([8]), 8, 8)
    with pytest.raises(flashtile.InvalidArgumentError, match=r"cu_seqlens_k"):
        flashtile.flash_attn_varlen_func(pq, pk, pk, cu([8]), cu([4]), 8, 8)
    with pytest.raises(flashtile.InvalidArgumentError, match=r"max_seqlen_q"):
        flashtile.flash_attn_varlen_func(pq, pk, pk, cu([8]), cu([8]), 4, 8)
