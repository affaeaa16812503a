"""flashtile.distributed (issue 15) on CPU processes: one spawned group of 4 gloo processes runs every case
(tests/python/_dist_worker.py), world sizes 1-4 on subgroups; each case is one test here. Outputs, lse and gradients
of both strategies (ring, all_to_all), both layouts (zigzag, contiguous with uneven shards), full / causal / window /
causal+window+softcap masks, GQA and MQA, the varlen form, and bad inputs that must raise the same error on every
rank. A hang fails the run (the worker's collectives time out after 60 s, the parent waits at most 240 s) instead of
blocking CI."""

import os
import queue as queue_mod
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

import _dist_worker  # noqa: E402
from conftest import SEED  # noqa: E402

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    init = "file://" + str(tmp_path_factory.mktemp("dist") / "store")  # a file store: no port to race for
    procs = [ctx.Process(target=_dist_worker.main, args=(r, init, SEED, q), daemon=True)
             for r in range(_dist_worker.WORLD)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + TIMEOUT_S
    try:
        while len(got) < len(procs):
            try:
                rank, res = q.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue_mod.Empty:
                break
            got[rank] = res
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    missing = sorted(set(range(len(procs))) - set(got))
    return got, missing


@pytest.mark.parametrize("name", list(_dist_worker.CASES))
def test_case(results, name):
    got, missing = results
    assert not missing, f"ranks {missing} sent no results within {TIMEOUT_S} s (a hang?); FLASHTILE_TEST_SEED={SEED}"
    for rank in sorted(got):
        assert "<worker>" not in got[rank], f"rank {rank}: {got[rank]['<worker>']}"
    case = _dist_worker.CASES[name]
    failures = [f"rank {r}: {got[r][name]}" for r in range(case["world"]) if got[r].get(name, "not run") is not None]
    assert not failures, f"FLASHTILE_TEST_SEED={SEED}\n" + "\n".join(failures)
