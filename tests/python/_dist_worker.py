"""The processes behind test_distributed.py: one spawned group of 4 CPU processes (gloo) runs every case, world
sizes 1-4 on subgroups of it, and sends back per case and rank None (passed) or the failure's text. Each rank
compares its shard against the float64 reference on the whole sequence (test_variants.reference) with the tolerance
of test_variants.close: the error of the single-process flashtile call in float32, times 4, plus 64 float32 ulps."""

import datetime
import traceback
import zlib

import numpy as np
import torch
import torch.distributed as dist

import flashtile
import flashtile.distributed as ftd
from flashtile.distributed import _ring
from flashtile.distributed._plan import segments
from test_variants import EPS32, reference

WORLD = 4
MASKS = {"full": dict(), "causal": dict(causal=True), "window": dict(window_size=(5, 3)),
         "causal_window_softcap": dict(causal=True, window_size=(16, -1), softcap=3.0)}
ERRORS = ("zigzag_uneven", "all_to_all_heads", "device", "dtype_one_rank", "options_differ", "layout_name",
          "kv_rows", "sm_margin_one_rank", "step_raises")


def _cases():
    cases = {}
    for w in range(1, WORLD + 1):
        for layout in ("zigzag", "contiguous"):
            for strategy in ("ring", "all_to_all"):
                for mask in MASKS:
                    cases[f"dense-w{w}-{layout}-{strategy}-{mask}"] = dict(kind="dense", world=w, layout=layout,
                                                                           strategy=strategy, mask=mask)
                for mask in ("causal", "causal_window_softcap"):
                    cases[f"varlen-w{w}-{layout}-{strategy}-{mask}"] = dict(kind="varlen", world=w, layout=layout,
                                                                            strategy=strategy, mask=mask)
        cases[f"auto-w{w}"] = dict(kind="auto", world=w)
    for w in (2, 4):
        for err in ERRORS:
            cases[f"error-w{w}-{err}"] = dict(kind="error", world=w, error=err)
    return cases


CASES = _cases()


def _lengths(rng, layout, world, total, nseq=1):
    """lengths[r][b] for sequences of `total` rows: zigzag equal even shards; contiguous uneven (some may be 0)."""
    if layout == "zigzag":
        return [[total[b] // world for b in range(nseq)] for _ in range(world)]
    out = [[0] * nseq for _ in range(world)]
    for b in range(nseq):
        cuts = np.sort(rng.integers(0, total[b] + 1, size=world - 1))
        parts = np.diff(np.concatenate([[0], cuts, [total[b]]]))
        for r in range(world):
            out[r][b] = int(parts[r])
    return out


def _local_rows(layout, lengths, rank, seq_off):
    """Rows of the whole packed sequence(s) that rank holds, in local order."""
    return torch.tensor([seq_off[s.seq] + s.start + i for s in segments(layout, lengths)[rank]
                         for i in range(s.length)], dtype=torch.long)


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).float()


def _heads(case, world):
    # all_to_all needs Hq and Hkv divisible by the world size; the ring also runs MQA with odd head counts.
    return (2 * world, world) if case["strategy"] == "all_to_all" else (3, 1) if world == 3 else (4, 2)


def _check_all(name, got, ref64, std, rows, dim):
    """Each of this rank's (out, lse, dq, dk, dv) against its rows of the float64 reference: error at most 4 times
    the single-process call's error on the whole tensor plus 64 float32 ulps of the tensor's largest value (the
    rule of test_variants.close, on whole-tensor figures: a shard can be nearly zero, e.g. dq of rows that see one
    key). The single-process call must itself be near the reference (3e-5 of the largest value, ~250 float32
    ulps): a wrong reference would otherwise widen the tolerance until nothing fails."""
    for what, g, r, s in zip(("out", "lse", "dq", "dk", "dv"), got, ref64, std):
        d = dim if what != "lse" else -1
        r, s, g = r.detach(), s.detach().double(), g.detach().double()
        finite = torch.isfinite(r)
        scale = r[finite].abs().max().item()
        base = (s - r)[finite].abs().max().item()
        assert base <= 3e-5 * scale, f"{name} {what}: single-process error {base:.3g} of {scale:.3g}"
        r_mine = r.index_select(d, rows)
        assert torch.equal(torch.isfinite(g), torch.isfinite(r_mine)), f"{name} {what}: -inf / finite pattern differs"
        ok = torch.isfinite(r_mine)
        err = (g - r_mine)[ok].abs().max().item() if ok.any() else 0.0
        assert err <= 4 * base + 64 * EPS32 * scale, f"{name} {what}: error {err:.3g}, single process {base:.3g}"


def _dense(case, gen, group, rank):
    w, layout = case["world"], case["layout"]
    hq, hkv = _heads(case, w)
    b, s, d = 2, 24 * w, 32
    q, k, v, do = (_randn(gen, b, s, h, d) for h in (hq, hkv, hkv, hq))
    kw = MASKS[case["mask"]]
    lengths = _lengths(np.random.default_rng(int(gen.initial_seed()) % 2**32), layout, w, [s])
    rows = _local_rows(layout, lengths, rank, [0])
    # Single-process flashtile (float32) and the float64 reference on the whole sequence.
    ql, kl, vl = (x.index_select(1, rows).requires_grad_(True) for x in (q, k, v))
    out, lse = ftd.ring_flash_attn_func(ql, kl, vl, group=group, return_lse=True, layout=layout,
                                        strategy=case["strategy"], **kw)
    out.backward(do.index_select(1, rows))
    report = ftd.last_report()
    # Collectives first, checks after: a check failing on one rank only must not leave the others in a collective.
    whole = ftd.unshard(ql.detach(), group=group, layout=layout)
    std = _single(q, k, v, do, kw)
    ref = _reference(q, k, v, do, kw)
    _check_all("dense", (out, lse, ql.grad, kl.grad, vl.grad), ref, std, rows, 1)
    assert report.strategy == case["strategy"], str(report)
    if case["strategy"] == "ring" and case["mask"] == "causal":
        if layout == "zigzag":  # every step one fused call, none skipped (docs/distributed.md)
            assert report.calls == w and report.steps_skipped == 0, str(report)
        else:                   # the blocks of later ranks are fully masked
            assert report.steps_skipped >= w - 1 - rank, str(report)
    assert torch.equal(whole, q)  # unshard of uneven runs too


def _single(q, k, v, do, kw, varlen=None):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    if varlen is None:
        out, lse = flashtile.flash_attn_func(q, k, v, return_lse=True, **kw)
    else:
        cu, n = varlen
        out, lse = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, n, n, return_lse=True, **kw)
    out.backward(do)
    return out, lse, q.grad, k.grad, v.grad


def _reference(q, k, v, do, kw, cu=None):
    """float64 out, lse, dq, dk, dv; dense (B, S, H, D) batch elements or the sequences of a packed batch."""
    q, k, v, do = (x.double().requires_grad_(True) for x in (q, k, v, do))
    kw = {("window" if key == "window_size" else key): val for key, val in kw.items()}
    items = [tuple(x[i] for x in (q, k, v)) for i in range(q.shape[0])] if cu is None else \
        [tuple(x[a:b] for x in (q, k, v)) for a, b in zip(cu[:-1], cu[1:])]
    outs, lses = zip(*(reference(*item, **kw) for item in items))
    out = torch.stack(outs) if cu is None else torch.cat(outs)
    lse = torch.stack(lses) if cu is None else torch.cat(lses, dim=-1)
    out.backward(do.detach())
    return out, lse, q.grad, k.grad, v.grad


def _varlen(case, gen, group, rank):
    w, layout = case["world"], case["layout"]
    hq, hkv = _heads(case, w)
    totals = [2 * w * n for n in (5, 1, 3)]  # zigzag: multiples of 2·world; contiguous cuts them unevenly
    cu = [0] + list(np.cumsum(totals))
    t, d = cu[-1], 32
    q, k, v, do = _randn(gen, t, hq, d), _randn(gen, t, hkv, d), _randn(gen, t, hkv, d), _randn(gen, t, hq, d)
    kw = MASKS[case["mask"]]
    lengths = _lengths(np.random.default_rng(int(gen.initial_seed()) % 2**32), layout, w, totals, len(totals))
    rows = _local_rows(layout, lengths, rank, cu[:-1])
    cu_local = torch.tensor([0] + list(np.cumsum(lengths[rank])), dtype=torch.int32)
    ql, kl, vl = (x.index_select(0, rows).requires_grad_(True) for x in (q, k, v))
    out, lse = ftd.ring_flash_attn_varlen_func(ql, kl, vl, cu_local, group=group, return_lse=True, layout=layout,
                                               strategy=case["strategy"], **kw)
    out.backward(do.index_select(0, rows))
    std = _single(q, k, v, do, kw, (torch.tensor(cu, dtype=torch.int32), max(totals)))
    ref = _reference(q, k, v, do, kw, cu)
    _check_all("varlen", (out, lse, ql.grad, kl.grad, vl.grad), ref, std, rows, 0)
    if layout == "zigzag":  # the helper gives the same shard
        x, c = ftd.shard_varlen(q, torch.tensor(cu, dtype=torch.int32), group=group, layout=layout)
        assert torch.equal(x, ql.detach()) and torch.equal(c, cu_local)


def _auto(case, gen, group, rank):
    w = case["world"]
    q = _randn(gen, 1, 8 * w, 4, 16)
    ftd.ring_flash_attn_func(q, q, q, group=group, causal=True, strategy="auto")
    report = ftd.last_report()
    zigzag = ftd.unshard(ftd.shard(q, group=group), group=group)
    contiguous = ftd.unshard(ftd.shard(q, group=group, layout="contiguous"), group=group, layout="contiguous")
    want = "all_to_all" if w in (2, 4) else "ring"  # Hq = Hkv = 4: the heads divide for 2 and 4 ranks
    assert report.strategy == want and report.reason.startswith("auto") or w == 1, str(report)
    assert zigzag.equal(q) and contiguous.equal(q)


_WANT = {"zigzag_uneven": (flashtile.InvalidArgumentError, "same even number of rows"),
         "all_to_all_heads": (flashtile.UnsupportedError, "multiples of the world size"),
         "device": (flashtile.DeviceError, "cannot travel through group backend 'gloo'"),
         "dtype_one_rank": (flashtile.DTypeError, "rank 1 of"),
         "options_differ": (flashtile.InvalidArgumentError, "causal differs between ranks"),
         "layout_name": (flashtile.InvalidArgumentError, "layout: expected one of"),
         "kv_rows": (flashtile.InvalidArgumentError, "rank 1 of .*k, v: the local shard"),
         "sm_margin_one_rank": (flashtile.InvalidArgumentError, "rank 1 of .*sm_margin: must be >= 0, got -1"),
         "step_raises": (RuntimeError, "injected: a step's attention failed")}


def _error(case, gen, group, rank):
    """The bad call must raise the expected error on every rank (a hang would hit the parent's timeout), and a good
    ring call right after must work: nothing was left posted."""
    import re

    err = case["error"]
    s = 16 if not (err == "zigzag_uneven" and rank == 1) else 12
    q = _randn(gen, 1, s, 3 if err == "all_to_all_heads" else 4, 16)
    k, kw = q, dict(group=group, causal=True)
    if err == "all_to_all_heads":
        kw["strategy"] = "all_to_all"
    if err == "device":
        q = k = q.to("meta")
    if err == "dtype_one_rank" and rank == 1:
        q = k = q.double()
    if err == "options_differ":
        kw["causal"] = rank == 0
    if err == "layout_name":
        kw["layout"] = "stripes"
    if err == "kv_rows" and rank == 1:
        k = q[:, :8]
    if err == "sm_margin_one_rank" and rank == 1:
        kw["sm_margin"] = -1
    if err == "step_raises":  # every rank's first block call fails with its K/V transfer in flight
        kw["strategy"] = "ring"
        saved = _ring.flash_attn_func

        def fail(*_args, **_kw):
            raise RuntimeError("injected: a step's attention failed")
        _ring.flash_attn_func = fail
    cls, pattern = _WANT[err]
    raised = None
    try:
        ftd.ring_flash_attn_func(q, k, k, **kw)
    except Exception as e:  # noqa: BLE001 (checked below, after the collective call that follows)
        raised = e.with_traceback(None)  # the failed call's frames go now, as in a caller that handles the error
    finally:
        if err == "step_raises":
            _ring.flash_attn_func = saved
    good = _randn(gen, 1, 16, 4, 16)
    ftd.ring_flash_attn_func(good, good, good, group=group, causal=True, strategy="ring")
    assert isinstance(raised, cls), f"expected {cls.__name__}, got {type(raised).__name__}: {raised}"
    assert re.search(pattern, str(raised)), f"{type(raised).__name__}: {raised} (expected /{pattern}/)"


def main(rank, init, seed, queue):
    """Sends (rank, case, None or the failure's text) per case as it finishes, then (rank, "<done>", None): a hang
    fails the cases not yet reported, not the whole run."""
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        torch.set_num_threads(1)  # 4 processes share the machine's cores
        groups = {w: dist.new_group(list(range(w))) for w in range(1, WORLD)}
        groups[WORLD] = dist.group.WORLD
        run = {"dense": _dense, "varlen": _varlen, "auto": _auto, "error": _error}
        try:  # a process outside the group is told so, alone (the group's members are not involved)
            ftd.ring_flash_attn_func(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8),
                                     group=groups[1])
            assert rank == 0, "no error outside the group"
        except flashtile.InvalidArgumentError as e:
            assert rank > 0 and "not a member" in str(e), str(e)
        for name, case in CASES.items():
            if rank >= case["world"]:
                continue
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
            try:
                run[case["kind"]](case, gen, groups[case["world"]], rank)
                queue.put((rank, name, None))
            except Exception as e:  # noqa: BLE001 (reported to the test, which fails)
                queue.put((rank, name, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, "<done>", None))
    except Exception:  # noqa: BLE001
        queue.put((rank, "<done>", traceback.format_exc()))
