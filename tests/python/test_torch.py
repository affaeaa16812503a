"""torch integration: the custom ops, autograd against torch's math SDPA in float64, torch.compile
(fullgraph) and errors. Skipped when torch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashtile  # noqa: E402
from reference import EPS, attention_backward, forward_magnitudes, max_err, within  # noqa: E402

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def randn(rng, shape, dtype, requires_grad=False):
    t = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(TORCH_DTYPES[dtype])
    return t.requires_grad_(requires_grad)


def bottom_right_mask(sq, sk):
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    return j <= i + sk - sq


def math_sdpa(q, k, v, causal, scale=None):
    """torch's math SDPA on (B, S, H, D) tensors, with the KV heads repeated for GQA and FlashTile's
    bottom-right causal mask spelled out (torch's is_causal is top-left aligned)."""
    g = q.shape[2] // k.shape[2]
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(g, dim=1), vt.repeat_interleave(g, dim=1)
    mask = bottom_right_mask(q.shape[1], k.shape[1]) if causal else None
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def grads(fn, inputs, dout):
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*inputs)
    out.backward(dout)
    return out.detach(), [x.grad for x in inputs]


def to64(x):
    return x.detach().to(torch.float64).numpy()


CASES = [  # (B, Sq, Sk, Hkv, group, D, Dv, causal); causal cases keep Sq <= Sk (torch NaNs on empty rows)
    (2, 17, 17, 2, 1, 64, 64, True), (1, 1, 65, 1, 8, 32, 32, True), (2, 64, 130, 2, 2, 128, 64, True),
    (1, 65, 17, 2, 2, 40, 40, False), (2, 130, 64, 1, 8, 16, 96, False), (1, 17, 130, 2, 1, 256, 256, False),
    # head dim 128, the one a restricted GPU build (FLASHTILE_CUDA_KERNELS=hdim128;bf16) always has
    (2, 130, 130, 2, 4, 128, 128, True), (1, 17, 300, 1, 2, 128, 128, True), (2, 257, 65, 2, 1, 128, 128, False),
]


HAS_CUDA = torch.cuda.is_available()
CUDA_BACKENDS = [n for n in flashtile.backend_names() if n.startswith("cuda")]
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def skip_unless_runs_on(device, q, k, v, causal):
    """On CUDA, skip calls that this build's CUDA kernels do not cover (explain() says why)."""
    if device == "cpu":
        return
    r = flashtile.explain(q, k, v, causal=causal)
    if not r.backend.startswith("cuda"):
        pytest.skip(f"no CUDA kernel for this call: {r}")
    r = flashtile.explain(q, k, v, causal=causal, backward=True)
    if not r.backend.startswith("cuda"):
        pytest.skip(f"no CUDA backward kernel for this call: {r}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_autograd_vs_math_sdpa(rng, device, dtype, case):
    """Gradients through torch autograd against torch's math SDPA in float64 (on the CPU), with the error
    of math SDPA in the same dtype as the yardstick."""
    b, sq, sk, hkv, group, d, dv, causal = CASES[case]
    hq = hkv * group
    q, k, v = randn(rng, (b, sq, hq, d), dtype), randn(rng, (b, sk, hkv, d), dtype), randn(rng, (b, sk, hkv, dv), dtype)
    dout = randn(rng, (b, sq, hq, dv), dtype)
    on = [x.to(device) for x in (q, k, v)]
    skip_unless_runs_on(device, *on, causal)

    out, (dq, dk, dv_) = grads(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=causal), on,
                               dout.to(device))
    assert "bwd" in flashtile.last_dispatch().ran.kernel
    assert flashtile.last_dispatch().backend.startswith(device)
    assert out.device == on[0].device and dq.device == on[0].device
    out, dq, dk, dv_ = (x.cpu() for x in (out, dq, dk, dv_))
    ref_out, ref_g = grads(lambda q, k, v: math_sdpa(q, k, v, causal), [x.double() for x in (q, k, v)], dout.double())
    std_out, std_g = grads(lambda q, k, v: math_sdpa(q, k, v, causal), (q, k, v), dout)

    err, std = max_err(to64(out), to64(ref_out)), max_err(to64(std_out), to64(ref_out))
    worst = within(to64(out), to64(ref_out), std, forward_magnitudes(to64(q), to64(k), to64(v), None, causal), dtype)
    assert worst <= 1, f"out: error {err:.3g} ({worst:.2f} of allowance), math SDPA in {dtype} {std:.3g}"
    mags = attention_backward(to64(q), to64(k), to64(v), to64(dout), causal=causal, magnitudes=True)
    for name, g, r, s, m in zip(("dq", "dk", "dv"), (dq, dk, dv_), ref_g, std_g, mags):
        assert g.dtype == q.dtype and g.shape == r.shape
        err, std = max_err(to64(g), to64(r)), max_err(to64(s), to64(r))
        worst = within(to64(g), to64(r), std, m, dtype)
        assert worst <= 1, f"{name}: error {err:.3g} ({worst:.2f} of allowance), math SDPA in {dtype} {std:.3g}"


def test_same_numbers_as_numpy(rng):
    q, k, v = randn(rng, (2, 33, 4, 32), "float32"), randn(rng, (2, 40, 2, 32), "float32"), randn(rng, (2, 40, 2, 32), "float32")
    a = flashtile.flash_attn_func(q, k, v, causal=True)
    b = flashtile.flash_attn_func(q.numpy(), k.numpy(), v.numpy(), causal=True)
    assert isinstance(a, torch.Tensor) and isinstance(b, np.ndarray)
    assert np.array_equal(a.numpy(), b)


def test_sdpa_matches_torch(rng):
    # Sq == Sk, where torch's top-left causal mask and FlashTile's bottom-right one agree.
    q = randn(rng, (2, 8, 33, 64), "float32", True)
    k = randn(rng, (2, 2, 33, 64), "float32", True)
    v = randn(rng, (2, 2, 33, 64), "float32", True)
    out = flashtile.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.shape == (2, 8, 33, 64) and out.transpose(1, 2).is_contiguous()  # a view, not a copy
    out.sum().backward()
    mine = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    with sdpa_kernel(SDPBackend.MATH):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want.sum().backward()
    assert max_err(to64(out), to64(want)) < 1e-5
    for a, b in zip(mine, (x.grad for x in (q, k, v))):
        assert max_err(to64(a), to64(b)) < 1e-4


def test_lse_is_returned_but_not_differentiable(rng):
    q, k, v = (randn(rng, (1, 17, 2, 16), "float32", True) for _ in range(3))
    out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 17) and not lse.requires_grad
    assert out.requires_grad
    out.sum().backward()  # the gradient of a sum arrives expanded (stride 0) and must still work
    assert all(x.grad is not None for x in (q, k, v))


def test_deterministic_backward_is_reproducible(rng):
    q, k, v = (randn(rng, (2, 65, 4, 32), "float32") for _ in range(3))
    dout = randn(rng, (2, 65, 4, 32), "float32")
    fn = lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True)  # noqa: E731
    _, a = grads(fn, (q, k, v), dout)
    _, b = grads(fn, (q, k, v), dout)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_backward_entry_for_tensors(rng):
    q, k, v = (randn(rng, (1, 17, 2, 16), "float32", True) for _ in range(3))
    dout = randn(rng, (1, 17, 2, 16), "float32")
    out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True)
    dq, dk, dv = flashtile.flash_attn_backward(q, k, v, out, dout, lse)
    out.backward(dout)
    assert torch.equal(dq, q.grad) and torch.equal(dk, k.grad) and torch.equal(dv, v.grad)


def test_opcheck(rng):
    """torch's own checks of the custom ops (schema, fake tensors, autograd registration), plain and with the
    variants' arguments (Call's fields follow q, k, v)."""
    from flashtile._common import Call
    q, k, v = (randn(rng, (1, 9, 2, 16), "float32", True) for _ in range(3))
    sinks = randn(rng, (2,), "float32", True)
    alibi = torch.tensor([0.5, 0.25])
    for call in (Call(causal=True), Call(alibi_slopes=alibi, sinks=sinks, window_left=3, window_right=1, softcap=5.0),
                 Call(sm_margin=2)):
        torch.library.opcheck(torch.ops.flashtile.fwd.default, (q, k, v, *call))
        call = call._replace(sinks=None if call.sinks is None else call.sinks.detach())  # bwd has no gradient
        out, lse = torch.ops.flashtile.fwd(q.detach(), k.detach(), v.detach(), *call)
        torch.library.opcheck(torch.ops.flashtile.bwd.default,
                              (q.detach(), k.detach(), v.detach(), out, torch.randn_like(out), lse, *call))


class TinyAttention(torch.nn.Module):
    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.hd)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.hd).unbind(2)
        out = flashtile.flash_attn_func(q, k, v, causal=True)
        return self.o(torch.nn.functional.gelu(out.reshape(b, s, -1)))


def check_compiled_matches_eager(compiled, model, x):
    y = compiled(x)
    y.square().mean().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    want = model(x)
    want.square().mean().backward()
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad, atol=1e-5, rtol=1e-4), n
    model.zero_grad()


def test_compile_fullgraph_inductor():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = TinyAttention()
    compiled = torch.compile(model, fullgraph=True)  # raises on any graph break
    check_compiled_matches_eager(compiled, model, torch.randn(2, 33, 64))
    assert flashtile.last_dispatch().ran.kernel == "cpu_flash_bwd"


def test_compile_fullgraph_dynamic_shapes():
    # aot_eager traces the same graphs (fake kernels, autograd) without inductor's C++ compile time.
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = TinyAttention()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for s in (17, 40, 65):
        check_compiled_matches_eager(compiled, model, torch.randn(2, s, 64))


def test_torch_errors(rng):
    q, k, v = (randn(rng, (1, 9, 2, 16), "float32") for _ in range(3))
    with pytest.raises(TypeError, match=r"^q: unsupported dtype float64"):
        flashtile.flash_attn_func(q.double(), k, v)
    with pytest.raises(TypeError, match=r"^k: dtype float16 does not match q's dtype"):
        flashtile.flash_attn_func(q, k.half(), v)
    with pytest.raises(ValueError, match=r"^q: the last dimension must be contiguous"):
        flashtile.flash_attn_func(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    with pytest.raises(ValueError, match=r"^v: expected shape"):
        flashtile.flash_attn_func(q, k, v[:, :3])
    with pytest.raises(TypeError, match=r"^k: expected a torch.Tensor like q, got numpy.ndarray"):
        flashtile.flash_attn_func(q, k.numpy(), v)
    with pytest.raises(ValueError, match=r"^softmax_scale: must be finite"):
        flashtile.flash_attn_func(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(ValueError, match=r"^sm_margin: must be >= 0, got -1"):
        flashtile.flash_attn_func(q, k, v, sm_margin=-1)
    with pytest.raises(ValueError, match=r"^sm_margin: must fit an int, got 4294967296"):
        flashtile.flash_attn_func(q, k, v, sm_margin=1 << 32)
    # On the CPU a valid margin changes nothing, through autograd too.
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    a = flashtile.flash_attn_func(qg, kg, vg, causal=True)
    a.sum().backward()
    qm, km, vm = (x.clone().requires_grad_() for x in (q, k, v))
    b = flashtile.flash_attn_func(qm, km, vm, causal=True, sm_margin=4)
    b.sum().backward()
    assert torch.equal(a, b) and torch.equal(qg.grad, qm.grad) and torch.equal(vg.grad, vm.grad)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_tensors_reach_the_library(rng):
    q, k, v = (randn(rng, (1, 65, 2, 128), "bfloat16").cuda() for _ in range(3))
    if not CUDA_BACKENDS:
        # The device is read from the tensor: without a CUDA backend every CPU backend refuses it.
        with pytest.raises(flashtile.UnsupportedError, match="device: tensors are on cuda:0"):
            flashtile.flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match=r"^k: on cpu:0 but q is on cuda:0"):
        flashtile.flash_attn_func(q, k.cpu(), v)


@pytest.mark.skipif(not (HAS_CUDA and CUDA_BACKENDS), reason="needs a CUDA device and the CUDA backend")
def test_cuda_on_a_side_stream(rng):
    # The library launches on the default stream; work queued on the caller's stream must be ordered
    # around it. Queue a long producer on a side stream, then consume on the same stream.
    q, k, v = (randn(rng, (2, 1024, 8, 128), "bfloat16").cuda() for _ in range(3))
    skip_unless_runs_on("cuda", q, k, v, True)
    want = flashtile.flash_attn_func(q * 2, k, v, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):
            big = big @ big.T / 4096  # keeps the side stream busy before q2 is written
        q2 = q * 2 + big[0, 0] * 0
        got = flashtile.flash_attn_func(q2, k, v, causal=True)
        got_sum = got.float().sum()
    torch.cuda.synchronize()
    assert torch.equal(got, want), float(got_sum)
