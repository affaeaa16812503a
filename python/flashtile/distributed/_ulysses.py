"""All-to-all (Ulysses) context parallelism: one all-to-all turns sequence-sharded q, k, v (every head, the local
rows) into head-sharded ones (Hq/world heads, every row of the sequence), each rank runs the library's ordinary
single-process attention on its heads, and one all-to-all turns the output back. The all-to-alls are autograd
functions whose backward is the opposite all-to-all, so the backward is the library's own on the gathered tensors.

Rows arrive in rank-major order (rank 0's rows, then rank 1's, ...); a permutation puts them in sequence order
(zigzag chunks, or the sequences of a varlen batch whose shards lie on several ranks) and its inverse puts the output
back. Ranks may hold different numbers of rows (layout="contiguous").
"""

from __future__ import annotations

import functools
from typing import List

import torch
import torch.distributed as dist

from .._api import flash_attn_func, flash_attn_varlen_func
from ._plan import segments


def _all_to_all(send: List[torch.Tensor], recv_like: List[tuple], group) -> List[torch.Tensor]:
    """send[j] goes to rank j; returns what each rank j sent here, with shapes recv_like[j]. One all_to_all_single
    on flat buffers, so that the pieces may differ in size."""
    dtype, device = send[0].dtype, send[0].device
    flat_in = torch.cat([x.reshape(-1) for x in send])
    sizes_out = [int(torch.Size(s).numel()) for s in recv_like]
    flat_out = torch.empty(sum(sizes_out), dtype=dtype, device=device)
    dist.all_to_all_single(flat_out, flat_in, sizes_out, [x.numel() for x in send], group=group)
    return [piece.view(shape) for piece, shape in zip(flat_out.split(sizes_out), recv_like)]


def seq_to_head(x, rows: List[int], group):
    """(B, rows[me], H, D) -> (B, sum(rows), H/world, D): rank j's rows for this rank's heads, in rank order."""
    world = len(rows)
    b, _, h, d = x.shape
    hw = h // world
    send = [x[:, :, j * hw:(j + 1) * hw].contiguous() for j in range(world)]
    got = _all_to_all(send, [(b, n, hw, d) for n in rows], group)
    return torch.cat(got, dim=1)


def head_to_seq(x, rows: List[int], me: int, group):
    """The inverse of seq_to_head: (B, sum(rows), H/world, D) -> (B, rows[me], H, D)."""
    world = len(rows)
    b, _, hw, d = x.shape
    send = list(x.split(rows, dim=1))
    send = [s.contiguous() for s in send]
    got = _all_to_all(send, [(b, rows[me], hw, d)] * world, group)
    return torch.cat(got, dim=2)


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows, me, group):
        ctx.rows, ctx.me, ctx.group = rows, me, group
        return seq_to_head(x, rows, group)

    @staticmethod
    def backward(ctx, g):
        return head_to_seq(g.contiguous(), ctx.rows, ctx.me, ctx.group), None, None, None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows, me, group):
        ctx.rows, ctx.me, ctx.group = rows, me, group
        return head_to_seq(x, rows, me, group)

    @staticmethod
    def backward(ctx, g):
        return seq_to_head(g.contiguous(), ctx.rows, ctx.group), None, None, None


def order(layout: str, lengths: List[List[int]], device):
    """(perm, inv, cu_seqlens, max_len): natural = gathered.index_select(1, perm) puts the rank-major rows in sequence
    order and inv undoes it; cu_seqlens (int32) delimits the sequences of a varlen batch in that order. perm and inv
    are None when the rank order is already the sequence order. Built once per (layout, lengths, device): a step
    repeats its shapes, and a Python loop over every row cost more than the attention at 32k tokens."""
    return _order(layout, tuple(tuple(x) for x in lengths), device)


@functools.lru_cache(maxsize=64)
def _order(layout, lengths, device):
    segs = segments(layout, [list(x) for x in lengths])
    nseq = len(lengths[0])
    seq_len = [sum(x[b] for x in lengths) for b in range(nseq)]
    seq_off = [sum(seq_len[:b]) for b in range(nseq)]
    base = [sum(sum(x) for x in lengths[:r]) for r in range(len(lengths))]  # first gathered row of rank r
    src = torch.empty(sum(seq_len), dtype=torch.long)
    for r, rank_segs in enumerate(segs):  # a few segments per rank: one slice each
        for s in rank_segs:
            dst = seq_off[s.seq] + s.start
            src[dst:dst + s.length] = torch.arange(base[r] + s.row, base[r] + s.row + s.length)
    cu = torch.tensor([0] + [seq_off[b] + seq_len[b] for b in range(nseq)], dtype=torch.int32, device=device)
    if torch.equal(src, torch.arange(src.numel())):
        return None, None, cu, max(seq_len, default=0)
    inv = torch.empty_like(src)
    inv[src] = torch.arange(src.numel())
    return src.to(device), inv.to(device), cu, max(seq_len, default=0)


def attention(q, k, v, group, world, rank, lengths, layout, varlen, kw):
    """out (B, rows, Hq, Dv) and lse (B, Hq, rows) for the local rows; the varlen form passes (1, T, H, D)."""
    rows = [sum(x) for x in lengths]
    qh, kh, vh = (_SeqToHead.apply(x, rows, rank, group) for x in (q, k, v))
    perm, inv, cu, max_len = order(layout, lengths, q.device)
    if perm is not None:
        qh, kh, vh = (x.index_select(1, perm) for x in (qh, kh, vh))
    if varlen:
        out, lse = flash_attn_varlen_func(qh[0], kh[0], vh[0], cu, cu, max_len, max_len, return_lse=True, **kw)
        out, lse = out[None], lse[None]
    else:
        out, lse = flash_attn_func(qh, kh, vh, return_lse=True, **kw)
    lse = lse.transpose(1, 2).unsqueeze(-1)         # (B, S, Hq/world, 1): rows on dim 1 like out
    if inv is not None:
        out, lse = out.index_select(1, inv), lse.index_select(1, inv)
    out = _HeadToSeq.apply(out, rows, rank, group)
    with torch.no_grad():
        lse = head_to_seq(lse.contiguous(), rows, rank, group)[..., 0].transpose(1, 2)
    return out, lse
