"""CUDA graphs and streams: flash_attn_func's forward and backward captured in a torch.cuda.graph and replayed on new
inputs give exactly the eager results (deterministic backward), and eager calls on a side stream are ordered with
that stream's work. Skipped without a CUDA device or without a CUDA kernel for the shapes in this build."""

import pytest

torch = pytest.importorskip("torch")

import flashtile  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

SHAPES = [  # (B, S, Hq, Hkv, D, causal)
    (1, 128, 8, 8, 64, False),
    (2, 200, 8, 2, 64, True),
    (1, 77, 4, 1, 128, True),
]


def make(shape, seed):
    b, s, hq, hkv, d, _ = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    return rnd(hq), rnd(hkv), rnd(hkv), rnd(hq)


def require_kernel(q, k, v, causal):
    for backward in (False, True):
        r = flashtile.explain(q, k, v, causal=causal, backward=backward)
        if not r.backend.startswith("cuda"):
            pytest.skip(f"no CUDA kernel for this shape in this build: {r}")


def warm_up(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_capture_replays_eager(shape):
    causal = shape[-1]
    q, k, v, _ = make(shape, 1)
    require_kernel(q, k, v, causal)
    sq, sk, sv = q.clone(), k.clone(), v.clone()
    warm_up(lambda: flashtile.flash_attn_func(sq, sk, sv, causal=causal))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = flashtile.flash_attn_func(sq, sk, sv, causal=causal, return_lse=True)
    for trial in range(2):
        nq, nk, nv, _ = make(shape, 10 + trial)
        sq.copy_(nq), sk.copy_(nk), sv.copy_(nv)
        graph.replay()
        ref_out, ref_lse = flashtile.flash_attn_func(nq, nk, nv, causal=causal, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(out, ref_out)
        assert torch.equal(lse, ref_lse)


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward_capture_replays_eager(shape):
    causal = shape[-1]
    q, k, v, dout = make(shape, 2)
    require_kernel(q, k, v, causal)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    sdout = dout.clone()

    def step():
        flashtile.flash_attn_func(*leaves, causal=causal, deterministic=True).backward(sdout)

    warm_up(step)
    for x in leaves:
        x.grad = None  # allocated inside the capture, from the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashtile.flash_attn_func(*leaves, causal=causal, deterministic=True)
        out.backward(sdout)
    for trial in range(2):
        nq, nk, nv, ndout = make(shape, 20 + trial)
        with torch.no_grad():
            for x, y in zip(leaves + [sdout], (nq, nk, nv, ndout)):
                x.copy_(y)
        graph.replay()
        ref = [x.clone().requires_grad_(True) for x in (nq, nk, nv)]
        ref_out = flashtile.flash_attn_func(*ref, causal=causal, deterministic=True)
        ref_out.backward(ndout)
        torch.cuda.synchronize()
        assert torch.equal(out, ref_out)
        for got, want in zip(leaves, ref):
            assert torch.equal(got.grad, want.grad)


def test_eager_call_on_a_side_stream_is_ordered_with_it():
    """Inputs written by a long kernel on a side stream: the call on that stream must see them (it runs on the
    caller's current stream, not the default one), and its outputs must be ready for that stream's next op."""
    shape = (2, 256, 8, 8, 64, False)
    q, k, v, _ = make(shape, 3)
    require_kernel(q, k, v, False)
    ref = flashtile.flash_attn_func(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):  # keeps the side stream busy well past the copy below
            big = big @ big / 64
        qs = torch.zeros_like(q)
        qs.copy_(q)
        out = flashtile.flash_attn_func(qs, k, v)
        out2 = out * 1  # the stream's next op reads the output
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert torch.equal(out2, ref)
