"""Which rows of the local queries attend to which rows of a key/value block, and under which mask, derived from
global positions only (one rule for the forward and the backward, for every layout and for the varlen form).

A rank holds, of each sequence, a few contiguous runs of positions (Segments): one run with layout="contiguous",
chunks r and 2·world−1−r with layout="zigzag". The visibility rule is the library's window (docs/semantics.md) on
global positions, with Sq = Sk (self-attention over the whole sequence): key position gj is visible to query
position gi iff lo <= gj − gi <= hi, lo = −left (or unbounded), hi = 0 when causal, else right (or unbounded).

Each (query run, key run) pair becomes one library call on sub-blocks, or nothing when no query sees any key. The
library's window is anchored at the block's bottom-right corner (i + Sk − Sq) and takes no negative sizes, so a pair
is first trimmed to the rows that see some key and the keys some row sees: after that trim the bottom-right corner
is always inside the band (see _pair), and the band becomes a window with sizes >= 0.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple


class Segment(NamedTuple):
    seq: int     # which sequence of the batch (always 0 for the dense form)
    start: int   # first global position within that sequence
    length: int
    row: int     # first local row (of the rank's tensor) holding it


class Block(NamedTuple):
    """One library call: query rows [q0, q0 + nq) with key rows [k0, k0 + nk) under window (left, right);
    causal=True stands for the window (-1, 0)."""
    q0: int
    nq: int
    k0: int
    nk: int
    left: int
    right: int
    causal: bool


def band(causal: bool, window_size) -> Tuple[Optional[int], Optional[int]]:
    """(lo, hi) bounds on gj − gi; None = unbounded."""
    left, right = window_size
    lo = -left if left >= 0 else None
    hi = 0 if causal else (right if right >= 0 else None)
    return lo, hi


def segments(layout: str, lengths: List[List[int]]) -> List[List[Segment]]:
    """lengths[r][b]: how many rows of sequence b rank r holds. Returns each rank's segments, in local row order.
    zigzag: every rank holds the same even number of rows of a sequence, split into its chunks r and 2w−1−r."""
    world = len(lengths)
    out: List[List[Segment]] = []
    for r in range(world):
        segs, row = [], 0
        for b, n in enumerate(lengths[r]):
            if layout == "zigzag":
                c = n // 2
                segs += [Segment(b, r * c, c, row), Segment(b, (2 * world - 1 - r) * c, c, row + c)]
            else:
                segs.append(Segment(b, sum(lengths[p][b] for p in range(r)), n, row))
            row += n
        out.append([s for s in segs if s.length > 0])
    return out


def _pair(qs: Segment, ks: Segment, lo, hi) -> Optional[Block]:
    delta = ks.start - qs.start                      # gj − gi = delta + (j − i)
    a = None if lo is None else lo - delta           # band on local j − i
    b = None if hi is None else hi - delta
    lq, lk = qs.length, ks.length
    i0 = 0 if b is None else max(0, -b)              # rows that see some key: −b <= i <= lk − 1 − a
    i1 = lq - 1 if a is None else min(lq - 1, lk - 1 - a)
    j0 = 0 if a is None else max(0, a)               # keys some row sees: a <= j <= lq − 1 + b
    j1 = lk - 1 if b is None else min(lk - 1, lq - 1 + b)
    if i0 > i1 or j0 > j1:
        return None
    shift = j0 - i0
    a = None if a is None else a - shift
    b = None if b is None else b - shift
    nq, nk = i1 - i0 + 1, j1 - j0 + 1
    off = nk - nq                                    # the library's diagonal: j − i = off
    # A side that no row of the trimmed box reaches is left unbounded (the library then skips its element masks).
    left = -1 if a is None or -(nq - 1) >= a else off - a
    right = -1 if b is None or nk - 1 <= b else b - off
    assert left >= -1 and right >= -1, (qs, ks, lo, hi)  # the corner is inside the band (module docstring)
    causal = left == -1 and right == 0
    return Block(qs.row + i0, nq, ks.row + j0, nk, left, -1 if causal else right, causal)


def _whole(blk: Block, qs: Segment, ks: Segment) -> bool:
    return (blk.left == -1 and blk.right == -1 and not blk.causal and blk.q0 == qs.row and blk.nq == qs.length
            and blk.k0 == ks.row and blk.nk == ks.length)


def _adjacent(segs: List[Segment]) -> bool:
    return all(x.row + x.length == y.row for x, y in zip(segs, segs[1:]))


def step_blocks(qsegs: List[Segment], ksegs: List[Segment], lo, hi, same_rank: bool) -> List[Block]:
    """The calls for local queries qsegs against a key block ksegs; [] when the step is fully masked.
    Pairs are fused into one call where that is exact: the diagonal step of a purely causal mask (query and key
    positions are the same ascending list, so the local causal mask is the global one), and a set of fully
    visible pairs that covers adjacent query runs times adjacent key runs."""
    out: List[Block] = []
    for b in sorted({s.seq for s in qsegs} & {s.seq for s in ksegs}):
        qb = [s for s in qsegs if s.seq == b]
        kb = [s for s in ksegs if s.seq == b]
        if same_rank and lo is None and hi == 0 and _adjacent(qb):
            n = sum(s.length for s in qb)
            out.append(Block(qb[0].row, n, qb[0].row, n, -1, -1, True))
            continue
        pairs = [(qs, ks, _pair(qs, ks, lo, hi)) for qs in qb for ks in kb]
        live = [(qs, ks, blk) for qs, ks, blk in pairs if blk is not None]
        if not live:
            continue
        qset = sorted({qs for qs, _, _ in live}, key=lambda s: s.row)
        kset = sorted({ks for _, ks, _ in live}, key=lambda s: s.row)
        if (len(live) > 1 and len(live) == len(qset) * len(kset) and all(_whole(blk, qs, ks) for qs, ks, blk in live)
                and _adjacent(qset) and _adjacent(kset)):
            out.append(Block(qset[0].row, sum(s.length for s in qset), kset[0].row, sum(s.length for s in kset),
                             -1, -1, False))
            continue
        out += [blk for _, _, blk in live]
    return out
