"""Context parallelism: exact attention over a sequence whose rows are sharded across the ranks of a
torch.distributed process group (NCCL for CUDA tensors, gloo for CPU tensors), forward and backward.

    import flashtile.distributed as ftd
    q_local = ftd.shard(q, group)                       # zigzag: chunks r and 2*world-1-r of the sequence
    out = ftd.ring_flash_attn_func(q_local, k_local, v_local, group=group, causal=True)
    print(ftd.last_report())                            # which strategy ran, and why

Two strategies (docs/distributed.md): "ring" (K/V blocks travel around the ranks, overlapped with the local
attention; fully masked steps skipped; dK/dV travel back in the backward) and "all_to_all" (Ulysses: sequence-
sharded to head-sharded and back; needs Hq and Hkv divisible by the world size). "auto" picks all_to_all when the
heads divide, else ring. Arguments are checked on every rank and then together (one all_gather_object) before any
transfer: a bad argument on any rank raises the same flashtile error on every rank, so none is left waiting.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import _core
from . import _ring, _ulysses
from ._check import CPReport, choose, scale_of, validate
from ._plan import segments

__all__ = ["ring_flash_attn_func", "ring_flash_attn_varlen_func", "shard", "unshard", "shard_varlen",
           "last_report", "CPReport"]

_last: Optional[CPReport] = None


def last_report() -> Optional[CPReport]:
    """The CPReport of this process's last context-parallel call (None before the first)."""
    return _last


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, scale, softcap):
        k, v = k.contiguous(), v.contiguous()  # they are sent as they are
        out, lse, calls, kv_last = _ring.forward(ring, q, k, v, scale, softcap)
        # The backward starts on the block the forward ended with (ring.world > 1): one K/V block more kept.
        ctx.save_for_backward(q, k, v, out, lse, *(kv_last if ring.world > 1 else ()))
        ctx.ring, ctx.scale, ctx.softcap = ring, scale, softcap
        ctx.mark_non_differentiable(lse)  # as flashtile.flash_attn_func: the backward takes no lse gradient
        ctx.set_materialize_grads(False)
        ctx.calls = calls
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            # Every rank must still take part in the ring: another rank's loss may use its out.
            dout = torch.zeros_like(ctx.saved_tensors[3])
        q, k, v, out, lse, *kv_first = ctx.saved_tensors
        dq, dk, dv = _ring.backward(ctx.ring, q, k, v, tuple(kv_first), out, dout.contiguous(), lse, ctx.scale,
                                    ctx.softcap)
        return dq, dk, dv, None, None, None


def _run(q, k, v, group, causal, softmax_scale, window_size, softcap, layout, strategy, varlen, cu_seqlens,
         sm_margin):
    global _last
    opts = dict(causal=bool(causal), softmax_scale=softmax_scale, window_size=tuple(window_size),
                softcap=float(softcap), sm_margin=sm_margin)
    world, rank, lengths = validate(q, k, v, group, layout, strategy, opts, varlen, cu_seqlens)
    chosen, reason = choose(strategy, world, q.shape[-2], k.shape[-2])
    if varlen:  # (T, H, D) -> (1, T, H, D): one code path, the sequences told apart by the segments
        q, k, v = q[None], k[None], v[None]
    rows = [sum(x) for x in lengths]
    report = CPReport(chosen, reason, world, rank, layout, rows)
    scale = scale_of(softmax_scale, q.shape[-1])
    if chosen == "all_to_all":
        kw = dict(softmax_scale=scale, causal=opts["causal"], window_size=opts["window_size"], softcap=opts["softcap"])
        out, lse = _ulysses.attention(q, k, v, group, world, rank, lengths, layout, varlen, kw)
    else:
        ring = _ring.Ring(group, world, rank, lengths, layout, opts["causal"], opts["window_size"], sm_margin)
        out, lse = _RingAttention.apply(q, k, v, ring, scale, opts["softcap"])
        report.steps_computed = sum(1 for _, blocks in ring.steps if blocks)
        report.steps_skipped = world - report.steps_computed
        report.calls = sum(len(blocks) for _, blocks in ring.steps)
        report.sm_margin = sm_margin
    _last = report
    if varlen:
        out, lse = out[0], lse[0]
    return out, lse


def ring_flash_attn_func(q, k, v, group=None, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                         return_lse=False, layout="zigzag", strategy="auto", sm_margin=0):
    """flashtile.flash_attn_func over a sequence sharded across the ranks of `group` (default: the world).

    Args:
        q, k, v: this rank's rows, (B, S_local, Hq, D), (B, S_local, Hkv, D), (B, S_local, Hkv, Dv); same dtype
            and device on every rank, a device the group's backend sends (CUDA with NCCL, CPU with gloo).
        layout: which rows of the sequence a rank holds. "zigzag": the sequence cut into 2*world equal chunks,
            rank r holding chunks r and 2*world-1-r (balances the causal work; every rank the same even S_local;
            see shard()). "contiguous": rank r holds the r-th run of rows; runs may differ in length.
        causal, window_size, softcap, softmax_scale: as flashtile.flash_attn_func on the whole sequence (query
            and key positions are the same, so causal is the usual lower triangle).
        strategy: "ring", "all_to_all" (Hq and Hkv multiples of the world size) or "auto"; last_report() says
            which ran and why.
        return_lse: also return lse (B, Hq, S_local) float32 over the whole sequence.
        sm_margin: CUDA, ring only: SMs the attention of a step leaves to the NCCL kernels while a transfer is in
            flight (flashtile.flash_attn_func's sm_margin): cuda-sm90's persistent forward otherwise waits for SMs
            that a transfer holds (bench/results/h200x2-cp.md). 0 = all SMs.

    Returns out (B, S_local, Hq, Dv) for this rank's rows (and lse), differentiable in q, k, v. Every rank of the
    group must make the call (it is collective), also in the backward.
    """
    out, lse = _run(q, k, v, group, causal, softmax_scale, window_size, softcap, layout, strategy, False, None,
                    sm_margin)
    return (out, lse) if return_lse else out


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, group=None, causal=False, softmax_scale=None,
                                window_size=(-1, -1), softcap=0.0, return_lse=False, layout="zigzag",
                                strategy="auto", sm_margin=0):
    """ring_flash_attn_func for a packed batch of sequences, each sharded across the ranks.

    q (T_local, Hq, D), k, v (T_local, Hkv, D / Dv); cu_seqlens (B + 1) int32: THIS rank's rows of each sequence,
    sequence b at local rows cu_seqlens[b] .. cu_seqlens[b+1]-1. Sequence b of the batch is rank 0's rows of it,
    then rank 1's, ... (layout="contiguous", any lengths, 0 allowed), or, with layout="zigzag", chunks r and
    2*world-1-r of it on rank r (every rank the same even count; see shard_varlen()). Every rank has the same B.
    sm_margin as in ring_flash_attn_func. Returns out (T_local, Hq, Dv) and with return_lse lse (Hq, T_local).
    """
    out, lse = _run(q, k, v, group, causal, softmax_scale, window_size, softcap, layout, strategy, True, cu_seqlens,
                    sm_margin)
    return (out, lse) if return_lse else out


def _world(group, rank, world_size):
    if rank is None or world_size is None:
        g = group if group is not None else dist.group.WORLD
        rank = dist.get_rank(g) if rank is None else rank
        world_size = dist.get_world_size(g) if world_size is None else world_size
    return rank, world_size


def _rows(segs, offsets, device):
    """The rows of segments `segs`, each s.length rows from offsets[s.seq] + s.start: one arange per segment (a
    Python loop over every row cost tens of ms per call at 32k rows)."""
    if not segs:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.cat([torch.arange(offsets[s.seq] + s.start, offsets[s.seq] + s.start + s.length, device=device)
                      for s in segs])


def _index(layout, lengths, rank, device):
    return _rows(segments(layout, lengths)[rank], [0] * len(lengths[0]), device)


def _split(n, world, layout, what):
    if layout == "zigzag":
        if n % (2 * world):
            raise _core.InvalidArgumentError(f"{what}: layout='zigzag' cuts the sequence into 2*world = {2 * world} "
                                             f"equal chunks; {n} rows do not divide")
        return [n // world] * world
    if layout == "contiguous":
        return [n // world + (1 if r < n % world else 0) for r in range(world)]
    raise _core.InvalidArgumentError(f"layout: expected 'zigzag' or 'contiguous', got {layout!r}")


def shard(x, group=None, layout="zigzag", dim=1, rank=None, world_size=None):
    """This rank's rows of a whole sequence x (the same tensor on every rank), along `dim` (1 for (B, S, H, D)).
    contiguous: the r-th of world near-equal runs (the first S % world ranks one row longer). No communication."""
    rank, world = _world(group, rank, world_size)
    lengths = [[n] for n in _split(x.shape[dim], world, layout, "x")]
    return x.index_select(dim, _index(layout, lengths, rank, x.device))


def unshard(x, group=None, layout="zigzag", dim=1):
    """The whole sequence from every rank's shard x (an all_gather; the inverse of shard on every rank)."""
    g = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(g)
    every = [None] * world
    dist.all_gather_object(every, x.shape[dim], group=g)
    pad = max(every)
    xp = torch.nn.functional.pad(x.movedim(dim, 0), (0, 0) * (x.dim() - 1) + (0, pad - x.shape[dim]))
    got = [torch.empty_like(xp) for _ in range(world)]
    dist.all_gather(got, xp.contiguous(), group=g)
    whole = torch.cat([p[:n] for p, n in zip(got, every)]).movedim(0, dim)
    lengths = [[n] for n in every]
    if layout == "contiguous":
        return whole
    order = torch.cat([_index(layout, lengths, r, x.device) for r in range(world)])
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    return whole.index_select(dim, inv)


def shard_varlen(x, cu_seqlens, group=None, layout="zigzag", rank=None, world_size=None):
    """This rank's rows of a packed batch x (T, ...) with cu_seqlens (B + 1) of the whole sequences: returns
    (x_local, cu_seqlens_local int32) for ring_flash_attn_varlen_func. zigzag needs each length a multiple of
    2*world; contiguous splits each sequence in near-equal runs."""
    rank, world = _world(group, rank, world_size)
    cu = [int(c) for c in cu_seqlens.tolist()]
    per_seq = [_split(b - a, world, layout, f"cu_seqlens (sequence {i})") for i, (a, b) in enumerate(zip(cu, cu[1:]))]
    lengths = [[per_seq[b][r] for b in range(len(per_seq))] for r in range(world)]
    local = x.index_select(0, _rows(segments(layout, lengths)[rank], cu, x.device))
    cu_local = torch.tensor([0] + [sum(lengths[rank][:b + 1]) for b in range(len(cu) - 1)], dtype=torch.int32,
                            device=cu_seqlens.device)
    return local, cu_local
