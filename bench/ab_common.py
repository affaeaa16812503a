"""What bench/gpu_ab.py and bench/cpu_ab.py share: torch's SDPA on one backend as the peer call, and the rounds
that time every call in turn with the order rotated, so that no build keeps the slot after another's."""
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


def rotated_rounds(calls, rounds, timer):
    """{name: [timer(call) per round]}; round i starts at the i-th name."""
    names = list(calls)
    times = {n: [] for n in names}
    for i in range(rounds):
        for n in names[i % len(names):] + names[:i % len(names)]:
            times[n].append(timer(calls[n]))
    return times
