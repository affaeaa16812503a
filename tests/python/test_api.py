"""Dispatch reports, explain(), the SDPA layout, threads, and the package without torch."""

import subprocess
import sys
import threading

import numpy as np
import pytest

import flashtile
from inputs import f64, make
from reference import attention, max_err


def test_backend_names():
    names = flashtile.backend_names()
    assert names[-2:] == ["cpu-flash", "cpu-reference"]


def test_last_dispatch_and_report_object(rng):
    q, k, v = (make(rng, (1, 80, 2, 32), "float32") for _ in range(3))  # 80 rows per head: the tiled forward kernel
    flashtile.flash_attn_func(q, k, v)
    r = flashtile.last_dispatch()
    assert isinstance(r, flashtile.DispatchReport)
    assert r.requested == "auto" and r.backend == "cpu-flash" and r.kernel == "cpu_flash_fwd"
    assert r.ran.threads >= 1 and r.ran.block_q > 0 and r.ran.isa
    assert not r.fell_back
    refused = {x.backend: x.reasons for x in r.refused}
    assert "not chosen by auto" in refused["cpu-reference"][0]
    d = r.to_dict()
    assert d["ran"]["backend"] == "cpu-flash" and "cpu-reference" in d["refused"]
    assert str(r).startswith("ran cpu-flash / cpu_flash_fwd")
    assert "refused cpu-reference" in str(r)


def test_few_query_rows_run_on_the_decode_kernel(rng):
    """A forward with few query rows per KV head (G·Sq <= 64) runs on the decode kernel (the report says so and
    why); the result still matches the reference, and its backward runs on the backward kernel."""
    q = make(rng, (2, 1, 8, 64), "float32")
    k, v = (make(rng, (2, 300, 2, 64), "float32") for _ in range(2))
    out = flashtile.flash_attn_func(q, k, v, causal=True)
    r = flashtile.last_dispatch()
    assert r.kernel == "cpu_flash_decode" and r.ran.splits >= 1, str(r)
    assert "4 query rows per KV head fit one decode tile" in r.ran.detail, str(r)
    assert max_err(out, attention(q, k, v, causal=True)[0]) < 1e-5


def test_explain_runs_nothing(rng):
    q, k, v = (make(rng, (1, 17, 2, 32), "float32") for _ in range(3))
    flashtile.flash_attn_func(q, k, v)
    before = flashtile.last_dispatch()
    r = flashtile.explain(q, k, v, backend="cpu-reference")
    assert r.backend == "cpu-reference" and r.kernel == "reference_fwd_f64"
    assert str(flashtile.last_dispatch()) == str(before)  # a copy of the same report
    rb = flashtile.explain(q, k, v, causal=True, backward=True)
    assert rb.kernel == "cpu_flash_bwd"
    with pytest.raises(ValueError, match="^k: "):
        flashtile.explain(q, k[:, :, :1, :5], v)


def test_named_backends_agree(rng):
    q = make(rng, (2, 65, 4, 64), "float32")
    k = make(rng, (2, 130, 2, 64), "float32")
    v = make(rng, (2, 130, 2, 64), "float32")
    a, la = flashtile.flash_attn_func(q, k, v, causal=True, return_lse=True, backend="cpu-flash", strict=True)
    b, lb = flashtile.flash_attn_func(q, k, v, causal=True, return_lse=True, backend="cpu-reference")
    assert flashtile.last_dispatch().backend == "cpu-reference"
    assert max_err(a, b) < 1e-5 and max_err(la, lb) < 1e-5


def test_sdpa_numpy_layout(rng):
    # (B, H, S, D) in, (B, H, S, D) out; the same numbers as flash_attn_func on the swapped views.
    q = make(rng, (2, 4, 17, 32), "float32")
    k = make(rng, (2, 2, 33, 32), "float32")
    v = make(rng, (2, 2, 33, 16), "float32")
    out = flashtile.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True)
    assert out.shape == (2, 4, 17, 16)
    assert out.base is not None  # a view of the (B, Sq, Hq, Dv) result, not a copy
    ref, _ = attention(f64(q).transpose(0, 2, 1, 3), f64(k).transpose(0, 2, 1, 3), f64(v).transpose(0, 2, 1, 3),
                       0.2, True)
    assert max_err(out, ref.transpose(0, 2, 1, 3)) < 1e-5


def test_threads_release_the_gil(rng):
    q, k, v = (make(rng, (2, 130, 4, 64), "float32") for _ in range(3))
    want = flashtile.flash_attn_func(q, k, v, causal=True)
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                results.append(flashtile.flash_attn_func(q, k, v, causal=True))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 20
    assert all(np.array_equal(r, want) for r in results)


def test_imports_and_works_without_torch():
    # sys.modules["torch"] = None makes `import torch` fail as if torch were not installed.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, flashtile\n"
        "from flashtile import _api\n"
        "assert _api._torch_ops is None\n"
        "q = np.ones((1, 4, 2, 8), np.float32)\n"
        "print(flashtile.flash_attn_func(q, q, q).shape, flashtile.last_dispatch().backend)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(1, 4, 2, 8) cpu-flash"
