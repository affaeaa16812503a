"""The two eager doors of the torch path give the same results and the same errors: the compiled extension
flashtile._torch_ext (op flashtile_ext::attention, C++ autograd node) and the Python autograd.Function that
takes over where the extension is absent. Skipped without torch; the extension tests skip where it is not built,
except that FLASHTILE_REQUIRE_TORCH_EXT=1 (set by scripts/ci_python.sh when torch is installed) makes its
absence a failure."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashtile  # noqa: E402
from flashtile import _torch_ops  # noqa: E402

HAS_EXT = _torch_ops._ext is not None
needs_ext = pytest.mark.skipif(not HAS_EXT, reason=f"flashtile._torch_ext: {flashtile.torch_extension()}")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and any(
    n.startswith("cuda") for n in flashtile.backend_names()) else [])


@pytest.fixture
def python_door(monkeypatch):
    """Runs the body with the extension switched off, as in a build without it."""
    def use():
        monkeypatch.setattr(_torch_ops, "_ext", None)
    return use


def test_extension_loads_where_required():
    if os.environ.get("FLASHTILE_REQUIRE_TORCH_EXT") == "1":
        assert flashtile.torch_extension().startswith("loaded"), flashtile.torch_extension()
    else:
        assert isinstance(flashtile.torch_extension(), str)


def inputs(rng, device, dtype, b=2, sq=33, sk=70, hq=4, hkv=2, d=64):
    def r(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(device=device, dtype=dtype)
    return r(b, sq, hq, d), r(b, sk, hkv, d), r(b, sk, hkv, d), r(b, sq, hq, d)


def run(q, k, v, dout, **kw):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True, deterministic=True, **kw)
    report = flashtile.last_dispatch()
    out.backward(dout)
    return [out.detach(), lse, q.grad, k.grad, v.grad], report, out.grad_fn


@needs_ext
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_doors_agree_bit_for_bit(rng, python_door, device, causal):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, dout = inputs(rng, device, dtype)
    ext, ext_report, ext_fn = run(q, k, v, dout, causal=causal)
    assert "CppFunction" in type(ext_fn).__name__, type(ext_fn)  # the C++ node did run
    python_door()
    py, py_report, py_fn = run(q, k, v, dout, causal=causal)
    assert "CppFunction" not in type(py_fn).__name__
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), ext, py):
        assert torch.equal(a, b), f"{name} differs between the two doors"
    assert str(ext_report) == str(py_report)


def errors_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares whatever is raised
        return type(e), str(e)
    return None


@needs_ext
def test_doors_raise_the_same_errors(rng, python_door):
    q, k, v, _ = inputs(rng, "cpu", torch.float32)
    bad = {
        "shape": lambda: flashtile.flash_attn_func(q, k[:, :, :1].repeat(1, 1, 3, 1), v),
        "dtype": lambda: flashtile.flash_attn_func(q.double(), k, v),
        "rank": lambda: flashtile.flash_attn_func(q[0], k, v),
        "mixed dtypes": lambda: flashtile.flash_attn_func(q, k.half(), v),
        "scale": lambda: flashtile.flash_attn_func(q, k, v, softmax_scale=float("inf")),
        "backend": lambda: flashtile.flash_attn_func(q, k, v, backend="no-such-backend"),
    }
    ext = {name: errors_of(f) for name, f in bad.items()}
    python_door()
    py = {name: errors_of(f) for name, f in bad.items()}
    for name in bad:
        assert ext[name] is not None and issubclass(ext[name][0], flashtile.FlashTileError), (name, ext[name])
        assert ext[name] == py[name], name


@needs_ext
def test_extension_without_gradients(rng):
    q, k, v, _ = inputs(rng, "cpu", torch.float32)
    with torch.no_grad():
        a = flashtile.flash_attn_func(q, k, v, causal=True)
    with torch.inference_mode():  # below autograd: the op's CPU kernel, not its autograd one
        b = flashtile.flash_attn_func(q, k, v, causal=True)
    assert not a.requires_grad and torch.equal(a, b)


@needs_ext
def test_extension_lse_is_constant_and_unused_out_gives_no_grad(rng):
    q, k, v, _ = inputs(rng, "cpu", torch.float32)
    q.requires_grad_(True)
    out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    # A loss that does not use out: autograd has nothing to send back through the node.
    (q * 2).sum().backward()
    assert torch.equal(q.grad, torch.full_like(q, 2.0))
