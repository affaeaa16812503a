"""flashtile.distributed (issue 15) on CPU processes: one spawned group of 4 gloo processes runs every case
(tests/python/_dist_worker.py), world sizes 1-4 on subgroups; each case is one test here. Outputs, lse and gradients
of both strategies (ring, all_to_all), both layouts (zigzag, contiguous with uneven shards), full / causal / window /
causal+window+softcap masks, GQA and MQA, the varlen form, and bad inputs that must raise the same error on every
rank. A hang fails the run (the worker's collectives time out after 60 s, the parent waits at most 240 s) instead of
blocking CI."""

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
    got, done, deadline = {r: {} for r in range(len(procs))}, {}, time.monotonic() + TIMEOUT_S
    try:
        while len(done) < len(procs):
            try:
                rank, name, res = q.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue_mod.Empty:
                break
            if name == "<done>":
                done[rank] = res
            else:
                got[rank][name] = res
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return got, done


@pytest.mark.parametrize("name", list(_dist_worker.CASES))
def test_case(results, name):
    got, done = results
    case = _dist_worker.CASES[name]
    failures = []
    for r in range(case["world"]):
        if name not in got[r]:
            why = done.get(r) or ("finished without it" if r in done else f"no answer within {TIMEOUT_S} s (a hang?)")
            failures.append(f"rank {r}: not reported: {why}")
        elif got[r][name] is not None:
            failures.append(f"rank {r}: {got[r][name]}")
    assert not failures, f"FLASHTILE_TEST_SEED={SEED}\n" + "\n".join(failures)
