"""Ring attention: the key/value blocks travel around the ranks (rank r sends to r+1 and receives from r−1) while
each rank attends its local queries to the block in hand; partial (out, lse) are merged in float32 with the one merge
rule (flashtile.merge_attention_states). The backward recomputes each step from the FINAL out and lse (so the
per-step dq, dk, dv of the library's backward add up to the exact gradients).

The backward visits the blocks in the other direction and ends on the local one: it starts on the block the
forward received last (rank r+1's, kept from the forward), K/V then travel from r+1 to r, and each block's dK/dV
accumulator (float32) travels with them, so that it reaches the block's owner before the owner's own step. The
owner adds its part last: no transfer is left after the final step (ring-flash-attention's order ends with a hop
of every dK/dV, float32, with nothing to hide it under), and a world of w ranks needs w−2 K/V hops, not w−1.

Point-to-point transfers are posted with torch.distributed.batch_isend_irecv before the step's attention and waited
for after it. With NCCL they run on the process group's own communication stream, ordered after the work already
queued on torch's current stream, and wait() makes the current stream wait for them: the transfer overlaps the
step's kernels without a stream of ours. With gloo the sends run on gloo's threads while this one computes.
Tensors are 4-D here, (B, S, H, D); the varlen form passes (1, T, H, D) views.
"""

from __future__ import annotations

import contextlib
from typing import List

import torch
import torch.distributed as dist

from .._api import flash_attn_backward, flash_attn_func
from .._merge import merge_attention_states
from ._plan import Block, band, segments, step_blocks

# Tags keep gloo's per-peer matching of K, V, dK, dV apart (NCCL ignores them; its order is the posting order).
_TAG_K, _TAG_V, _TAG_DK, _TAG_DV = 11, 12, 13, 14


class Ring:
    """The schedule of one call: who sends to whom, each step's blocks, and the sizes of the blocks received."""

    def __init__(self, group, world, rank, lengths, layout, causal, window_size, sm_margin=0):
        self.group, self.world, self.rank = group, world, rank
        self.sm_margin = sm_margin  # for the steps with a transfer in flight
        self.rows = [sum(x) for x in lengths]
        segs = segments(layout, lengths)
        lo, hi = band(causal, window_size)
        g = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(g, (rank + 1) % world)
        self.prev = dist.get_global_rank(g, (rank - 1) % world)
        # steps[t]: (source rank of the K/V block in hand, its blocks) in the forward's order; t = 0 is the local
        # block. The backward takes them in the order back_order().
        self.steps = []
        for t in range(world):
            src = (rank - t) % world
            self.steps.append((src, step_blocks(segs[rank], segs[src], lo, hi, src == rank)))

    def back_order(self):
        """The backward's steps: the blocks of ranks r+1, r+2, ..., r−1 and then r's own."""
        return [((self.rank + 1 + s) % self.world, self.steps[(-1 - s) % self.world][1]) for s in range(self.world)]

    def exchange(self, send: List[torch.Tensor], recv_rows: int, tags, like: List[torch.Tensor], back=False):
        """Posts sends of `send` to the next rank and receives of tensors shaped like `like` with recv_rows rows
        from the previous one (back=True: sends to the previous rank, receives from the next); returns (received
        tensors, requests)."""
        to, frm = (self.prev, self.next) if back else (self.next, self.prev)
        recv = [torch.empty((x.shape[0], recv_rows) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
                for x in like]
        ops = []
        for x, tag in zip(send, tags):
            if x.numel():
                ops.append(dist.P2POp(dist.isend, x, to, self.group, tag))
        for x, tag in zip(recv, tags):
            if x.numel():
                ops.append(dist.P2POp(dist.irecv, x, frm, self.group, tag))
        return recv, (dist.batch_isend_irecv(ops) if ops else [])


def _wait(reqs):
    for req in reqs:
        req.wait()


@contextlib.contextmanager
def _completing(reqs):
    """A step's attention with its transfers in flight: if it raises (the same error on every rank: a refusal or
    a bug that validation did not foresee), the posted sends and receives are completed first, since every rank
    posted its pair. Left pending they would meet the next collective of the group (the next call's validation)
    and hang it."""
    try:
        yield
    except BaseException:
        _wait(reqs)
        raise


def _rows(x, q0, n):
    return x[:, q0:q0 + n]


def _window(blk: Block):
    return dict(causal=blk.causal, window_size=(blk.left, blk.right))


def forward(ring: Ring, q, k, v, scale, softcap):
    """out (q's dtype) and lse (B, Hq, S) float32 over the whole sequence, for the local queries; the number of
    library calls made; and the K/V block in hand at the end (rank r+1's, where the backward starts)."""
    b, s, hq, _ = q.shape
    out = torch.zeros((b, s, hq, v.shape[-1]), dtype=torch.float32, device=q.device)
    lse = torch.full((b, hq, s), -float("inf"), dtype=torch.float32, device=q.device)
    kv, calls = (k, v), 0
    for t, (src, blocks) in enumerate(ring.steps):
        reqs = []
        if t + 1 < ring.world:  # the next block, in flight during this step's attention
            nxt, reqs = ring.exchange(list(kv), ring.rows[(src - 1) % ring.world], (_TAG_K, _TAG_V), list(kv))
        margin = ring.sm_margin if reqs else 0
        with _completing(reqs):
            for blk in blocks:
                o, l = flash_attn_func(_rows(q, blk.q0, blk.nq), _rows(kv[0], blk.k0, blk.nk),
                                       _rows(kv[1], blk.k0, blk.nk), softmax_scale=scale, softcap=softcap,
                                       return_lse=True, sm_margin=margin, **_window(blk))
                rows = slice(blk.q0, blk.q0 + blk.nq)
                if calls == 0 and blk.nq == s:  # the first part of every row (the usual diagonal step): no merge
                    out.copy_(o)
                    lse.copy_(l)
                else:
                    out[:, rows], lse[:, :, rows] = merge_attention_states(out[:, rows], lse[:, :, rows], o, l)
                calls += 1
        if reqs:
            _wait(reqs)
            kv = tuple(nxt)
    return out.to(q.dtype), lse, calls, kv


def backward(ring: Ring, q, k, v, kv_first, out, dout, lse, scale, softcap):
    """(dq, dk, dv) of the local shards, in the order of Ring.back_order(); kv_first is rank r+1's block (the
    forward's last). Each step's dK/dV, plus what the ranks before added, goes to the previous rank with the
    block, while that rank's next step computes."""
    world = ring.world
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = kv_first if world > 1 else (k, v)
    acc_reqs, acc = [], None              # the dK/dV of this step's block so far, arriving from the next rank
    sent = None                           # kept alive until its send completes
    for s, (src, blocks) in enumerate(ring.back_order()):
        if s == world - 1:
            kv = (k, v)
        kv_reqs = []
        if s + 2 < world:                 # the next step's block is remote: it comes from the next rank now
            nxt, kv_reqs = ring.exchange(list(kv), ring.rows[(src + 1) % world], (_TAG_K, _TAG_V), list(kv),
                                         back=True)
        dk = torch.zeros(kv[0].shape, dtype=torch.float32, device=q.device)
        dv = torch.zeros(kv[1].shape, dtype=torch.float32, device=q.device)
        margin = ring.sm_margin if kv_reqs or acc_reqs else 0  # K/V for the next step, or dK/dV arriving
        with _completing(kv_reqs + acc_reqs):
            for blk in blocks:
                qr = slice(blk.q0, blk.q0 + blk.nq)
                kr = slice(blk.k0, blk.k0 + blk.nk)
                g = flash_attn_backward(q[:, qr], kv[0][:, kr], kv[1][:, kr], out[:, qr], dout[:, qr],
                                        lse[:, :, qr].contiguous(), softmax_scale=scale, softcap=softcap,
                                        sm_margin=margin, **_window(blk))
                dq[:, qr] += g[0]
                dk[:, kr] += g[1]
                dv[:, kr] += g[2]
        if s > 0:                          # what the ranks after this one contributed to this block
            _wait(acc_reqs)
            dk += acc[0]
            dv += acc[1]
        if s + 1 < world:                  # pass the block's dK/dV on; receive the next step's
            sent = (dk, dv)
            acc, acc_reqs = ring.exchange([dk, dv], ring.rows[(src + 1) % world], (_TAG_DK, _TAG_DV), [dk, dv],
                                          back=True)
        if kv_reqs:
            _wait(kv_reqs)
            kv = tuple(nxt)
    del sent
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
