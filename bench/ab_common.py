"""What bench/gpu_ab.py, bench/cpu_ab.py and bench/decode_ab.py share: torch's SDPA on one backend as the peer call,
the rounds that time every call in turn in an order drawn per round, so that no build keeps the slot after another's,
a call run under a forced CPU kernel set, and a timer that warms a call for a few milliseconds first."""
import os
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel


def sdpa_peer(backend, qt, kt, vt, dot, causal, direction):
    """A zero-argument call of torch's scaled_dot_product_attention on `backend` over (B, H, S, D) views: the
    forward, or (direction "bwd") the backward of one forward made here."""
    if direction == "fwd":
        def forward():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return forward
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (qt, kt, vt))
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True)


def shuffled_rounds(calls, rounds, timer, seed=0):
    """{name: [timer(call) per round]}; each round times every call once, in an order drawn at random per round. A
    rotation of one order keeps its cycle (in [a, b, c] rotated, b always follows a), so the state the preceding
    call leaves (clock, power, caches) would fall on each call from the same neighbour; drawn orders spread it."""
    rng = random.Random(seed)
    names = list(calls)
    times = {n: [] for n in names}
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for n in order:
            times[n].append(timer(calls[n]))
    return times


def with_env(fn, name, value):
    """fn with the environment variable `name` = value while it runs (value None: as the process has it). The
    library reads FLASHTILE_CPU_ISA and FLASHTILE_CPU_FORWARD on every call, so one process can time two of its
    choices in turn."""
    if value is None:
        return fn

    def call():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return call


def with_isa(fn, isa):
    """fn with FLASHTILE_CPU_ISA = isa while it runs (isa None: as the process has it)."""
    return with_env(fn, "FLASHTILE_CPU_ISA", isa)


def warm_median_s(fn, reps=5, warm_s=0.005):
    """Median of `reps` calls after calling fn for at least warm_s seconds (and at least twice). On the 2-vCPU VM a
    call that followed another library's (torch's OpenMP pool, or a sleep) ran 10-25 % slower for several calls of a
    fraction of a millisecond: the same build timed as two libraries read 0.77-0.98x of itself in the slot after
    torch's with one warm-up call (2026-12-05)."""
    t0, n = time.perf_counter(), 0
    while n < 2 or time.perf_counter() - t0 < warm_s:
        fn()
        n += 1
    times = []  # decode.py median_s's loop: this module cannot import decode.py (it imports gpu_bench, which imports this)
    for _ in range(reps):
        t1 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t1)
    return statistics.median(times)
