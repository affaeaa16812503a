"""flash_attn_with_kvcache (issue 14) through the Python API, numpy and torch, on the CPU.

The reference is written here, independent of the library: the test appends k, v into its own copy of the cache,
gathers each sequence's keys through cache_batch_idx or the block table itself, and computes dense attention in
float64 with the bottom-right causal rule, the window, softcap, ALiBi and sinks as docs/semantics.md defines them.
Tolerances are reference.within's: standard attention's error in the same precision (computed here in float32, P
rounded to the 16-bit type for 16-bit inputs) plus float32 rounding of the terms behind each element. After every
call the caches must equal the test's copy bit for bit: the appended rows are k and v, the rest untouched; after a
refused call they must equal the caches before it."""

import itertools

import numpy as np
import pytest

import flashtile
from reference import np_dtype, rounded, within

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


# --- the reference ----------------------------------------------------------------------------------------------

def attend(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, alibi=None, sinks=None, ftype=np.float64,
           p_dtype=None):
    """One sequence: q (Sq, Hq, D), k (L, Hkv, D), v (L, Hkv, Dv) -> out (Sq, Hq, Dv), lse (Hq, Sq), and the
    magnitudes behind them (forward: sum_j P_ij (1 + |s|_ij) |v_j|; lse: |lse| + the largest visible |s|_ij)."""
    sq, hq, _ = q.shape
    sl, hkv = k.shape[:2]
    kk, vv = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(ftype), kk.astype(ftype)) * ftype(scale)
    s_abs = np.einsum("qhd,khd->hqk", np.abs(q).astype(np.float64), np.abs(kk).astype(np.float64)) * scale
    if softcap > 0:
        s = ftype(softcap) * np.tanh(s / ftype(softcap))
    i, j = np.arange(sq)[:, None], np.arange(sl)[None, :]
    diag = i + sl - sq
    if alibi is not None:
        bias = alibi.astype(np.float64)[:, None, None] * np.abs(diag - j)
        s = s - bias.astype(ftype)
        s_abs = s_abs + bias
    left, right = window
    right = 0 if causal else right
    seen = np.ones((sq, sl), dtype=bool)
    if left >= 0:
        seen &= j >= diag - left
    if right >= 0:
        seen &= j <= diag + right
    s = np.where(seen, s, -np.inf)
    if sinks is not None:
        s = np.concatenate([s, np.broadcast_to(sinks.astype(ftype)[:, None, None], (hq, sq, 1))], axis=-1)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total[..., 0] > 0, m[..., 0] + np.log(total[..., 0]), -np.inf)
        p = np.where(total > 0, p / np.where(total > 0, total, 1), 0)[..., :sl]
    if p_dtype is not None:
        p = rounded(p, p_dtype).astype(ftype)
    out = np.einsum("hqk,khd->qhd", p, vv.astype(ftype))
    s_abs = np.where(seen, s_abs, 0)
    mag = np.einsum("hqk,khd->qhd", p.astype(np.float64) * (1 + s_abs), np.abs(vv).astype(np.float64))
    lse_mag = np.abs(np.where(np.isfinite(lse), lse, 0)) + s_abs.max(axis=-1, initial=0.0)
    if sinks is not None:
        lse_mag = lse_mag + np.abs(sinks.astype(np.float64))[:, None]
    return out, lse, mag, lse_mag


class Case:
    """A cache (contiguous, or paged with shuffled pages), its contents, the new rows, and the test's own copy
    with the append done and every sequence gathered."""

    def __init__(self, rng, dtype="float32", b=3, sq=1, snew=0, hq=4, hkv=1, d=32, dv=32, page=0, seqlens=None,
                 capacity=96, batch_idx=False, spare_slots=2):
        self.dtype, self.page = dtype, page
        dt = np_dtype(dtype)
        self.seqlens = np.asarray(seqlens if seqlens is not None else rng.integers(1, capacity - snew, b),
                                  dtype=np.int32)
        b = len(self.seqlens)
        lens = self.seqlens + snew
        gen = lambda *shape: rng.standard_normal(shape).astype(np.float32).astype(dt)  # noqa: E731
        self.q = gen(b, sq, hq, d)
        self.k = gen(b, snew, hkv, d) if snew else None
        self.v = gen(b, snew, hkv, dv) if snew else None
        self.block_table = self.batch_idx = None
        if page:
            max_pages = -(-capacity // page)
            need = [-(-int(x) // page) for x in lens]
            num_pages = sum(need) + 3  # spare pages that no sequence uses
            order = rng.permutation(num_pages)
            self.block_table = np.full((b, max_pages), -1, dtype=np.int32)  # unused entries: never read
            at = 0
            for i, n in enumerate(need):
                self.block_table[i, :n] = order[at:at + n]
                at += n
            slots, rows = num_pages, page
        else:
            slots, rows = (b + spare_slots if batch_idx else b), capacity
            if batch_idx:
                self.batch_idx = rng.permutation(slots)[:b].astype(np.int32)
        # Every row holds data, the rows past each sequence's length too: a kernel that read them would be wrong.
        self.k_cache, self.v_cache = gen(slots, rows, hkv, d), gen(slots, rows, hkv, dv)
        self.expect_k, self.expect_v = self.k_cache.copy(), self.v_cache.copy()
        for i in range(b):
            for t in range(snew):
                self.expect_k[self.where(i, self.seqlens[i] + t)] = self.k[i, t]
                self.expect_v[self.where(i, self.seqlens[i] + t)] = self.v[i, t]

    def where(self, i, j):
        """The cache index (slot or page, row) of key j of sequence i, by the block table's definition."""
        if self.page:
            return int(self.block_table[i, j // self.page]), j % self.page
        return (int(self.batch_idx[i]) if self.batch_idx is not None else i), j

    def gathered(self, i):
        """Sequence i's keys and values after the append, from the test's copy."""
        n = int(self.seqlens[i]) + (0 if self.k is None else self.k.shape[1])
        idx = [self.where(i, j) for j in range(n)]
        pick = lambda c: np.stack([c[s, r] for s, r in idx]) if idx else c[:1, :0].reshape(0, *c.shape[2:])  # noqa
        return pick(self.expect_k), pick(self.expect_v)

    def kwargs(self):
        return dict(k=self.k, v=self.v, cache_seqlens=self.seqlens, block_table=self.block_table,
                    cache_batch_idx=self.batch_idx)

    def check(self, out, lse, scale=None, **opts):
        """out (and lse, unless None) against the reference, sequence by sequence; the caches against the
        test's copy."""
        out = np.asarray(out, dtype=np.float64)
        scale = 1.0 / np.sqrt(self.q.shape[3]) if scale is None else scale
        for i in range(self.q.shape[0]):
            k, v = self.gathered(i)
            o64, l64, mag, lmag = attend(self.q[i], k, v, scale, **opts)
            low = None if self.dtype == "float32" else np_dtype(self.dtype)
            o32, l32, _, _ = attend(self.q[i], k, v, scale, ftype=np.float32, p_dtype=low, **opts)
            if low is not None:
                o32 = rounded(o32, low)
            # Standard attention's largest error as the yardstick, as test_numpy / test_torch take it: kernels that
            # round P to 16 bits before it is normalised (FlashAttention's order, the AMX decode's) err where the
            # reference's rounding of the normalised P does not, so elementwise the two errors do not track.
            r = within(out[i], o64, np.abs(o32 - o64).max(initial=0.0), mag, self.dtype)
            assert r <= 1, f"sequence {i}: out error {r:.3g} x the allowance ({self.dtype})"
            if lse is None:
                continue
            got = np.asarray(lse[i], dtype=np.float64)
            seen = np.isfinite(l64)  # rows that see no key: -inf
            assert np.array_equal(np.isneginf(got), ~seen), f"sequence {i}: -inf pattern of lse"
            r = within(got[seen], l64[seen], np.abs(l32[seen] - l64[seen]), lmag[seen])
            assert r <= 1, f"sequence {i}: lse error {r:.3g} x the allowance"
        self.check_caches(self.k_cache, self.v_cache)

    def check_caches(self, k_cache, v_cache):
        assert same_bits(k_cache, self.expect_k), "k_cache differs from the test's copy after the append"
        assert same_bits(v_cache, self.expect_v), "v_cache differs from the test's copy after the append"


def same_bits(x, y):
    x, y = np.asarray(x), np.asarray(y)
    return x.shape == y.shape and x.tobytes() == y.tobytes()


def ref_opts(kw, alibi=None, sinks=None):
    return dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                softcap=kw.get("softcap", 0.0), alibi=alibi, sinks=sinks)


# --- numpy ------------------------------------------------------------------------------------------------------

LAYOUTS = {"contiguous": {}, "batch_idx": dict(batch_idx=True), "paged16": dict(page=16), "paged32": dict(page=32)}


@pytest.mark.parametrize("layout,append,sq,gqa", list(itertools.product(LAYOUTS, (False, True), (1, 4), (1, 4))))
def test_matches_reference(rng, layout, append, sq, gqa):
    for dtype in ("float32", "float16", "bfloat16"):
        case = Case(rng, dtype, sq=sq, snew=sq if append else 0, hq=4, hkv=4 // gqa, **LAYOUTS[layout])
        out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, causal=True,
                                                     return_lse=True, **case.kwargs())
        assert out.dtype == case.q.dtype and out.shape == case.q.shape and lse.shape == (3, 4, sq)
        case.check(out, lse, causal=True)
        report = flashtile.last_dispatch()
        assert report.kernel == "cpu_flash_decode" and report.ran.splits >= 1


MASKS = {"none": {}, "causal": dict(causal=True), "window": dict(window_size=(20, 3)),
         "causal_window": dict(causal=True, window_size=(33, -1)), "softcap_alibi": dict(softcap=2.0, alibi=True)}


@pytest.mark.parametrize("mask,splits,sinks", list(itertools.product(MASKS, (1, 3, 0), (False, True))))
def test_masks_splits_sinks(rng, mask, splits, sinks):
    kw = dict(MASKS[mask])
    alibi = (rng.random(8) * 0.3).astype(np.float32) if kw.pop("alibi", False) else None
    sink = rng.standard_normal(8).astype(np.float32) if sinks else None
    case = Case(rng, "float32", b=2, sq=4, snew=2, hq=8, hkv=2, page=16, capacity=160,
                seqlens=rng.integers(60, 150, 2))
    out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, alibi_slopes=alibi, sinks=sink,
                                                 num_splits=splits, return_lse=True, **case.kwargs(), **kw)
    case.check(out, lse, **ref_opts(kw, alibi, sink))
    if splits:
        assert flashtile.last_dispatch().ran.splits == splits


def test_automatic_splits_on_a_long_cache(rng):
    # One sequence, one KV head: the work is one task, so num_splits=0 splits the keys for the threads.
    case = Case(rng, "bfloat16", b=1, sq=1, snew=1, hq=4, hkv=1, d=64, dv=64, capacity=4096, page=32,
                seqlens=[4000])
    report = flashtile.explain_kvcache(case.q, case.k_cache, case.v_cache, **case.kwargs(), num_threads=4)
    assert report.ran.splits > 1, str(report)
    out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, **case.kwargs(),
                                                 num_threads=4, return_lse=True)
    assert flashtile.last_dispatch().ran.splits == report.ran.splits
    case.check(out, lse)


def test_cuda_options_change_nothing_on_the_cpu(rng):
    # CUDA options: async_index_check (do not wait for the device-side index check; the CPU reads the indices on
    # the host anyway) and sm_margin (SMs left free; the CPU ignores it).
    case = Case(rng, "float32", sq=2, snew=2, page=16, seqlens=[10, 59, 20])
    out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, **case.kwargs(),
                                                 return_lse=True, async_index_check=True, sm_margin=7)
    case.check(out, lse)


def test_explain_writes_nothing(rng):
    case = Case(rng, "float16", sq=2, snew=2, page=16)
    before = (case.k_cache.copy(), case.v_cache.copy())
    report = flashtile.explain_kvcache(case.q, case.k_cache, case.v_cache, num_splits=3, **case.kwargs())
    assert report.backend == "cpu-flash" and report.kernel == "cpu_flash_decode" and report.ran.splits == 3
    assert "paged_kvcache" in report.ran.mask and report.to_dict()["ran"]["splits"] == 3
    assert same_bits(case.k_cache, before[0]) and same_bits(case.v_cache, before[1])


def test_seqlens_int_empty_sequences_and_no_seqlens(rng):
    # An int: every sequence holds that many keys.
    case = Case(rng, "float32", b=2, sq=3, snew=3, seqlens=[40, 40])
    out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, k=case.k, v=case.v,
                                                 cache_seqlens=40, causal=True, return_lse=True)
    case.check(out, lse, causal=True)
    # Empty caches: with causal, rows that see no key give out 0 and lse -inf.
    case = Case(rng, "float32", b=2, sq=3, seqlens=[0, 2])
    out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, causal=True, return_lse=True,
                                                 **case.kwargs())
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0])) and np.all(np.isneginf(lse[1, :, 0]))
    case.check(out, lse, causal=True)
    # No cache_seqlens: every sequence is its whole cache. Without return_lse, the same out.
    case = Case(rng, "float32", b=2, sq=2, capacity=50, seqlens=[50, 50])
    out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, return_lse=True)
    case.check(out, lse)
    assert same_bits(flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache), out)


def test_append_only(rng):
    # No query tokens (Sq = 0): the call only writes k and v into the cache (a prefill's keys, say).
    case = Case(rng, "bfloat16", sq=0, snew=5, page=32)
    out, lse = flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, return_lse=True,
                                                 **case.kwargs())
    assert out.shape == (3, 0, 4, 32) and lse.shape == (3, 4, 0)
    case.check_caches(case.k_cache, case.v_cache)


def test_strided_operands(rng):
    # q as a view whose heads are strided (one padding head); the caches as an interleaved [.., 2, Hkv, D] buffer's
    # halves.
    case = Case(rng, "float32", b=2, sq=2, snew=2, hq=4, hkv=2)
    kv = np.stack([case.k_cache, case.v_cache], axis=2)  # [B, capacity, 2, Hkv, D]
    q = np.pad(case.q, ((0, 0), (0, 0), (0, 1), (0, 0)))[:, :, :4]
    out, lse = flashtile.flash_attn_with_kvcache(q, kv[:, :, 0], kv[:, :, 1], k=case.k, v=case.v,
                                                 cache_seqlens=case.seqlens, return_lse=True)
    case.k_cache, case.v_cache = kv[:, :, 0], kv[:, :, 1]
    case.check(out, lse)


# --- bad input: typed errors, caches unchanged ------------------------------------------------------------------

def _bad_inputs(case):
    """(name, change to the call's arguments, exception type, message pattern)."""
    b = case.q.shape[0]
    seqlens_over = case.seqlens.copy()
    seqlens_over[-1] = case.k_cache.shape[1] if not case.page else case.block_table.shape[1] * case.page
    table_out = None if case.block_table is None else case.block_table.copy()
    if table_out is not None:
        table_out[-1, 0] = case.k_cache.shape[0]
    yield "seqlens_over", dict(cache_seqlens=seqlens_over), flashtile.InvalidArgumentError, r"^cache_seqlens: "
    yield "seqlens_negative", dict(cache_seqlens=np.full(b, -1, np.int32)), ValueError, r"^cache_seqlens: .* negative"
    yield "sm_margin", dict(sm_margin=-1), flashtile.InvalidArgumentError, r"^sm_margin: must be >= 0, got -1"
    yield "k_without_v", dict(v=None), flashtile.InvalidArgumentError, r"^v: required with k"
    yield "v_without_k", dict(k=None), flashtile.InvalidArgumentError, r"^k: required with v"
    yield "k_dtype", dict(k=case.k.astype(np.float16)), flashtile.DTypeError, r"^k: dtype float16 does not match"
    yield "seqlens_dtype", dict(cache_seqlens=case.seqlens.astype(np.int64)), flashtile.DTypeError, \
        r"^cache_seqlens: dtype int64, expected int32"
    yield "seqlens_missing", dict(cache_seqlens=None), flashtile.InvalidArgumentError, r"^cache_seqlens: required"
    yield "num_splits", dict(num_splits=-2), flashtile.InvalidArgumentError, r"^num_splits: "
    yield "max_seqlen_k", dict(max_seqlen_k=1), flashtile.InvalidArgumentError, r"^max_seqlen_k: "
    if case.page:
        yield "table_out_of_range", dict(block_table=table_out), flashtile.InvalidArgumentError, \
            r"^block_table: block_table\[2\]\[0\] = \d+ is outside \[0, num_pages"
        yield "table_dtype", dict(block_table=case.block_table.astype(np.int64)), flashtile.DTypeError, \
            r"^block_table: dtype int64, expected int32"
        shared = case.block_table.copy()
        shared[1, 0] = shared[0, 0]  # sequence 0 appends to rows of its first page that sequence 1 reads
        yield "appends_overlap", dict(block_table=shared), flashtile.InvalidArgumentError, \
            r"^block_table: sequence \d appends to rows"
        yield "with_batch_idx", dict(cache_batch_idx=np.arange(b, dtype=np.int32)), \
            flashtile.InvalidArgumentError, r"^cache_batch_idx: not taken with block_table"
    else:
        yield "batch_idx_out", dict(cache_batch_idx=np.array([0, 1, 7], np.int32)), \
            flashtile.InvalidArgumentError, r"^cache_batch_idx: cache_batch_idx\[2\] = 7 is outside"
        yield "batch_idx_shared", dict(cache_batch_idx=np.array([0, 1, 1], np.int32)), \
            flashtile.InvalidArgumentError, r"^cache_batch_idx: sequence \d appends to rows"


@pytest.mark.parametrize("page", [0, 16])
def test_refused_calls_leave_the_cache_unchanged(rng, page):
    case = Case(rng, "float32", sq=2, snew=2, page=page, capacity=64, seqlens=[10, 20, 30])
    before = (case.k_cache.copy(), case.v_cache.copy())
    seen = 0
    for name, change, exc, pattern in _bad_inputs(case):
        kw = dict(case.kwargs(), **change)
        with pytest.raises(exc, match=pattern):
            flashtile.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, **kw)
        assert same_bits(case.k_cache, before[0]) and same_bits(case.v_cache, before[1]), name
        seen += 1
    assert seen >= 11


def test_bad_layouts_and_dtypes(rng):
    case = Case(rng, "float32", sq=1, snew=1, page=16)
    k, v = case.k_cache, case.v_cache
    pages24 = np.zeros((8, 24) + k.shape[2:], np.float32)
    table = np.arange(12, dtype=np.int32).reshape(3, 4) % 8
    with pytest.raises(flashtile.InvalidArgumentError, match=r"^k_cache: page_size = 24 .* multiple of 16"):
        flashtile.flash_attn_with_kvcache(case.q, pages24, pages24.copy(), k=case.k, v=case.v, cache_seqlens=1,
                                          block_table=table)
    assert not pages24.any()
    with pytest.raises(flashtile.DTypeError, match=r"^k_cache: dtype float16 does not match q's dtype"):
        flashtile.flash_attn_with_kvcache(case.q, k.astype(np.float16), v.astype(np.float16))
    with pytest.raises(flashtile.DTypeError, match=r"^q: unsupported dtype float64"):
        flashtile.flash_attn_with_kvcache(case.q.astype(np.float64), k, v)
    with pytest.raises(flashtile.InvalidArgumentError, match=r"^k_cache: expected 4 dimensions"):
        flashtile.flash_attn_with_kvcache(case.q, k[0], v)
    with pytest.raises(TypeError, match=r"^cache_seqlens: expected an int32 numpy.ndarray like q or an int"):
        flashtile.flash_attn_with_kvcache(case.q, k, v, cache_seqlens=[1, 2, 3])
    with pytest.raises(TypeError, match=r"^q: expected a numpy.ndarray or a torch.Tensor"):
        flashtile.flash_attn_with_kvcache([1.0], k, v)
    frozen = case.k_cache.copy()
    frozen.flags.writeable = False
    with pytest.raises(flashtile.InvalidArgumentError, match=r"^k_cache: a read-only array"):
        flashtile.flash_attn_with_kvcache(case.q, frozen, v, **case.kwargs())
    # Read only is fine when nothing is appended.
    flashtile.flash_attn_with_kvcache(case.q, frozen, v, cache_seqlens=case.seqlens, block_table=case.block_table)


# --- torch --------------------------------------------------------------------------------------------------------

def to_torch(x):
    if x is None:
        return None
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def to_numpy(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np_dtype("bfloat16"))
    return t.numpy()


def torch_args(case):
    t = {name: to_torch(x) for name, x in case.kwargs().items()}
    return to_torch(case.q), to_torch(case.k_cache), to_torch(case.v_cache), t


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("page", [0, 32])
def test_torch_matches_reference(rng, dtype, page):
    case = Case(rng, dtype, b=2, sq=4, snew=4, hq=8, hkv=2, page=page, batch_idx=not page, capacity=128)
    q, kc, vc, kw = torch_args(case)
    version = kc._version
    with torch.inference_mode():
        out, lse = flashtile.flash_attn_with_kvcache(q, kc, vc, causal=True, window_size=(50, -1), num_splits=3,
                                                     return_lse=True, **kw)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    case.k_cache, case.v_cache = to_numpy(kc), to_numpy(vc)
    case.check(to_numpy(out.float()), lse.numpy(), causal=True, window=(50, -1))
    assert kc._version > version  # the append is an in-place write, as torch's own ops count them


@needs_torch
def test_torch_refused_calls_leave_the_cache_unchanged(rng):
    case = Case(rng, "float32", sq=2, snew=2, page=16, capacity=64, seqlens=[10, 20, 30])
    q, kc, vc, kw = torch_args(case)
    before = (kc.clone(), vc.clone())
    for name, change, exc, pattern in _bad_inputs(case):
        args = dict(kw, **{key: (val if isinstance(val, int) else to_torch(val)) for key, val in change.items()})
        with pytest.raises(exc, match=pattern):
            flashtile.flash_attn_with_kvcache(q, kc, vc, **args)
        assert torch.equal(kc, before[0]) and torch.equal(vc, before[1]), name
    with pytest.raises(flashtile.DTypeError, match=r"^k_cache: dtype bfloat16 does not match q's dtype"):
        flashtile.flash_attn_with_kvcache(q, kc.bfloat16(), vc.bfloat16(), **kw)
    with pytest.raises(TypeError, match=r"^block_table: expected an int32 torch.Tensor like q, got numpy"):
        flashtile.flash_attn_with_kvcache(q, kc, vc, **dict(kw, block_table=case.block_table))
    with pytest.raises(flashtile.DTypeError, match=r"^q: unsupported dtype float64"):
        flashtile.flash_attn_with_kvcache(q.double(), kc, vc, **kw)
    with pytest.raises(flashtile.InvalidArgumentError, match=r"^k: expected 4 dimensions \[B, Snew, Hkv, D\]"):
        flashtile.flash_attn_with_kvcache(q, kc, vc, **dict(kw, k=kw["k"][0]))
    with pytest.raises(flashtile.DTypeError, match=r"^cache_batch_idx: dtype uint8, expected int32"):
        flashtile.flash_attn_with_kvcache(q, kc, vc, **dict(kw, cache_batch_idx=torch.zeros(3, dtype=torch.uint8)))
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
    q.requires_grad_(True)
    with pytest.raises(flashtile.UnsupportedError, match=r"^q: requires grad, but flash_attn_with_kvcache is "
                                                         r"inference only"):
        flashtile.flash_attn_with_kvcache(q, kc, vc, **kw)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
    with torch.no_grad():
        flashtile.flash_attn_with_kvcache(q, kc, vc, **kw)
    assert not torch.equal(kc, before[0])


@needs_torch
def test_torch_explain(rng):
    case = Case(rng, "bfloat16", sq=1, snew=1, page=16, seqlens=[10, 59, 20])
    q, kc, vc, kw = torch_args(case)
    before = kc.clone()
    report = flashtile.explain_kvcache(q, kc, vc, num_splits=2, **kw)
    assert report.kernel == "cpu_flash_decode" and report.ran.splits == 2
    assert torch.equal(kc, before)
    # An int cache_seqlens: every sequence that long (here past the last sequence's pages: refused).
    assert flashtile.explain_kvcache(q, kc, vc, **dict(kw, cache_seqlens=1)).ran.splits >= 1
    with pytest.raises(flashtile.InvalidArgumentError, match=r"^block_table: block_table\[0\]\[1\] = -1"):
        flashtile.explain_kvcache(q, kc, vc, **dict(kw, cache_seqlens=59))


def decode_steps(q, kv, k, v, seqlens, table):
    """Two decode steps in one graph (append and attend, then the next token, then a read), and reads of the
    caches after them, which must see both appends: the op declares that it mutates the caches. The caches are
    views of one input, kv [2, ...] (as serving code slices one buffer per layer). The same append into caches
    made inside the graph (twice the inputs), whose read a compiler that believed the op pure would compute from
    the inputs, before the op."""
    kc, vc = kv[0], kv[1]
    twice_k, twice_v = kc * 2, vc * 2
    out0 = flashtile.flash_attn_with_kvcache(q, twice_k, twice_v, k=k[:, :1], v=v[:, :1], cache_seqlens=seqlens,
                                             block_table=table)
    out1 = flashtile.flash_attn_with_kvcache(q, kc, vc, k=k[:, :1], v=v[:, :1], cache_seqlens=seqlens,
                                             block_table=table, causal=True)
    out2 = flashtile.flash_attn_with_kvcache(q, kc, vc, k=k[:, 1:], v=v[:, 1:], cache_seqlens=seqlens + 1,
                                             block_table=table, causal=True, async_index_check=True)
    out3 = flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens + 2, block_table=table,
                                             async_index_check=True)
    return out0, out1, out2, out3, kc + vc, twice_k + twice_v  # elementwise: rounded alike in every backend


@needs_torch
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_torch_compile_appends_once(rng, compiler):
    case = Case(rng, "float32", b=2, sq=1, snew=2, hq=4, hkv=2, page=16, capacity=64, seqlens=[9, 30])
    q, kc, vc, kw = torch_args(case)
    kv, eager_kv = torch.stack([kc, vc]), torch.stack([kc, vc])
    args = (kw["k"], kw["v"], kw["cache_seqlens"], kw["block_table"])
    # No compiled graph from an earlier process: inductor's cache key does not cover a custom op's schema.
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        eager = decode_steps(q, eager_kv, *args)
        compiled = torch.compile(decode_steps, fullgraph=True, backend=compiler)(q, kv, *args)
    case.check_caches(kv[0].numpy(), kv[1].numpy())  # the two appends, each once, and nothing else
    case.check_caches(eager_kv[0].numpy(), eager_kv[1].numpy())
    for n, (e, c) in enumerate(zip(eager, compiled)):  # the same library calls on the same data; the reads
        assert torch.equal(c, e), f"output {n}"       # after the appends saw them
    # The last call attended over both appended rows, as the reference computes it.
    case.k_cache, case.v_cache = kv[0].numpy(), kv[1].numpy()
    case.check(compiled[3].numpy(), None)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs torch and a CUDA device")
def test_torch_device_mismatch_is_refused(rng):
    case = Case(rng, "bfloat16", sq=1, snew=1, page=16)
    q, kc, vc, kw = torch_args(case)
    gpu = {name: (None if x is None else x.cuda()) for name, x in kw.items()}
    kc_gpu, vc_gpu = kc.cuda(), vc.cuda()
    for name, call in (
            ("k_cache", lambda: flashtile.flash_attn_with_kvcache(q.cuda(), kc, vc_gpu, **gpu)),
            ("cache_seqlens", lambda: flashtile.flash_attn_with_kvcache(
                q.cuda(), kc_gpu, vc_gpu, **dict(gpu, cache_seqlens=kw["cache_seqlens"]))),
            ("block_table", lambda: flashtile.flash_attn_with_kvcache(
                q.cuda(), kc_gpu, vc_gpu, **dict(gpu, block_table=kw["block_table"])))):
        with pytest.raises(flashtile.DeviceError, match=rf"^{name}: on (cpu|cuda):\d+ but q is on cuda:\d+"):
            call()
    torch.cuda.synchronize()
    assert torch.equal(kc_gpu.cpu(), kc) and torch.equal(vc_gpu.cpu(), vc)
