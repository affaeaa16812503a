"""Collective validation: every rank checks its own arguments, then one all_gather_object shares the verdicts and
the local shapes, so that a bad argument on any rank raises the same typed error on every rank before any
point-to-point call is posted (a rank that raised alone would leave its peers waiting on a receive forever)."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.distributed as dist

from .. import _core
from .._api import explain
from .._common import kind_name, window_pair

LAYOUTS = ("zigzag", "contiguous")
STRATEGIES = ("ring", "all_to_all", "auto")
_ERRORS = {c.__name__: c for c in (_core.InvalidArgumentError, _core.DTypeError, _core.DeviceError,
                                   _core.UnsupportedError, _core.BackendError, TypeError)}
# Devices each torch.distributed backend moves tensors of with send/recv.
_BACKEND_DEVICES = {"gloo": {"cpu"}, "nccl": {"cuda"}, "xccl": {"xpu"}, "mpi": {"cpu", "cuda"},
                    "ucc": {"cpu", "cuda"}}


@dataclass
class CPReport:
    """What a context-parallel call does and why: the strategy, the layout, and for the ring the steps computed
    and skipped (fully masked) on this rank. str(report) is a readable summary."""
    strategy: str
    reason: str
    world: int
    rank: int
    layout: str
    lengths: List[int] = field(default_factory=list)   # local rows per rank
    steps_computed: int = 0
    steps_skipped: int = 0
    calls: int = 0                                     # library calls of this rank's forward
    sm_margin: int = 0                                 # SMs left to the transfers by the steps with one in flight

    def __str__(self) -> str:
        lines = [f"context parallel: strategy={self.strategy} layout={self.layout} world={self.world} "
                 f"rank={self.rank} local rows per rank={self.lengths}", f"  why: {self.reason}"]
        if self.strategy == "ring":
            lines.append(f"  ring steps on this rank: {self.steps_computed} computed, {self.steps_skipped} fully "
                         f"masked (skipped; their K/V still pass on), {self.calls} attention calls")
            if self.sm_margin:
                lines.append(f"  sm_margin={self.sm_margin}: the steps with a transfer in flight leave that many SMs "
                             "to it (CUDA; see flash_attn_func)")
        return "\n".join(lines)


def group_devices(group) -> Optional[set]:
    """The device types the group's backend can send; None when unknown (then not checked)."""
    name = str(dist.get_backend(group)).lower()
    if ":" in name:  # "cpu:gloo,cuda:nccl"
        return {part.split(":")[0] for part in name.split(",") if ":" in part}
    return _BACKEND_DEVICES.get(name)


def _local_problem(q, k, v, varlen, cu_seqlens, group, layout, strategy, opts, needs_grad):
    """(error class name, message) for this rank's arguments, or None."""
    rank = 3 if varlen else 4
    layout_s = "(T, H, D)" if varlen else "(B, S, H, D)"
    if layout not in LAYOUTS:
        return "InvalidArgumentError", f"layout: expected one of {LAYOUTS}, got {layout!r}"
    if strategy not in STRATEGIES:
        return "InvalidArgumentError", f"strategy: expected one of {STRATEGIES}, got {strategy!r}"
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            return "TypeError", f"{name}: expected a torch.Tensor, got {kind_name(x)}"
        if x.dim() != rank:
            return "InvalidArgumentError", f"{name}: expected {rank} dims {layout_s}, got shape {tuple(x.shape)}"
    if k.shape[:-2] != q.shape[:-2] or v.shape[:-1] != k.shape[:-1]:
        return "InvalidArgumentError", (f"k, v: the local shard must hold the same rows as q's (self-attention "
                                        f"over one sharded sequence): q {tuple(q.shape)}, k {tuple(k.shape)}, "
                                        f"v {tuple(v.shape)}")
    devices = group_devices(group)
    if devices is not None and q.device.type not in devices:
        return "DeviceError", (f"q: tensors on {q.device} cannot travel through group backend "
                               f"'{dist.get_backend(group)}' (it sends {sorted(devices)} tensors)")
    if varlen:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
            return "InvalidArgumentError", f"cu_seqlens: expected a 1-D int32 tensor (B + 1), got {cu_seqlens!r}"
        cu = cu_seqlens.tolist()
        if cu[0] != 0 or cu[-1] != q.shape[0] or any(b < a for a, b in zip(cu, cu[1:])):
            return "InvalidArgumentError", (f"cu_seqlens: must start at 0, not decrease and end at q's {q.shape[0]} "
                                            f"rows, got {cu}")
    try:
        window_pair(opts["window_size"])
        kw = dict(softmax_scale=opts["softmax_scale"], causal=opts["causal"], window_size=opts["window_size"],
                  softcap=opts["softcap"], sm_margin=opts["sm_margin"])
        # The library's own checks (dtype, head dim, device, options) on the local shapes, reading no data.
        if varlen:
            kw.update(cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=q.shape[0],
                      max_seqlen_k=q.shape[0])
        for backward in ((False, True) if needs_grad else (False,)):
            explain(q.detach(), k.detach(), v.detach(), strict=False, backward=backward, **kw)
    except tuple(_ERRORS.values()) as e:
        return type(e).__name__, str(e)
    return None


def _signature(q, k, v, opts):
    return dict(dtype=str(q.dtype), device=q.device.type, batch=tuple(q.shape[:-3]), hq=q.shape[-2],
                hkv=k.shape[-2], d=q.shape[-1], dv=v.shape[-1], **opts)


def _comm_device(group):
    """Where the group's collectives take tensors: the current CUDA device for NCCL, else the CPU."""
    if str(dist.get_backend(group)).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _digest(obj) -> int:
    text = repr(obj).encode()
    return (zlib.crc32(text) << 31) ^ zlib.adler32(text)  # < 2**63: fits an int64


def _gather_ints(values, group, device):
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return torch.stack(every).tolist()


def validate(q, k, v, group, layout, strategy, opts, varlen=False, cu_seqlens=None):
    """Checks on every rank, then together; returns (world, rank, lengths) with lengths[r][b] the rows of sequence
    b on rank r (one sequence for the dense form). Raises the same error on every rank.

    The common case costs one all_gather of a few integers per rank (a verdict, a digest of shapes and options,
    the local lengths); only when some rank reports a problem or the digests differ do the ranks exchange their
    messages and signatures (all_gather_object) to name the argument and the values."""
    group = group if group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:  # not a member: no collective of the group involves this process, so raising alone is right
        raise _core.InvalidArgumentError(f"group: this process (global rank {dist.get_rank()}) is not a member of "
                                         "the group")
    needs_grad = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v))
    problem = _local_problem(q, k, v, varlen, cu_seqlens, group, layout, strategy, opts, needs_grad)
    lengths, sig = [], None
    if problem is None:
        if varlen:
            cu = cu_seqlens.tolist()
            lengths = [b - a for a, b in zip(cu, cu[1:])]
        else:
            lengths = [q.shape[1]]
        sig = _signature(q, k, v, opts)
    device = _comm_device(group)
    # The same number of integers on every rank, whatever went wrong where (a collective of unequal sizes hangs).
    head = _gather_ints([problem is not None, _digest(sig), len(lengths), 0 if varlen or problem else lengths[0]],
                        group, device)
    if any(h[0] for h in head) or any(h[1:3] != head[0][1:3] for h in head):
        _explain_failure(problem, sig, lengths, group, world)
    if varlen:
        every = _gather_ints(lengths, group, device) if lengths else [[] for _ in range(world)]
    else:
        every = [h[3:] for h in head]  # the dense form: one sequence
    if layout == "zigzag":
        for b in range(len(every[0])):
            per_rank = [x[b] for x in every]
            if any(n != per_rank[0] for n in per_rank) or per_rank[0] % 2:
                what = "q" if not varlen else f"cu_seqlens (sequence {b})"
                raise _core.InvalidArgumentError(
                    f"{what}: layout='zigzag' needs every rank to hold the same even number of rows (2 chunks of "
                    f"the sequence cut into 2*world = {2 * world}); got {per_rank} rows per rank. Use "
                    "flashtile.distributed.shard(..., layout='zigzag') or layout='contiguous' for uneven shards")
    return world, rank, every


def _explain_failure(problem, sig, lengths, group, world):
    """Every rank gets here together: share the messages and signatures and raise the same error everywhere."""
    every = [None] * world
    dist.all_gather_object(every, dict(problem=problem, sig=sig, n=len(lengths)), group=group)
    for r, got in enumerate(every):
        if got["problem"] is not None:
            cls, msg = got["problem"]
            raise _ERRORS[cls](f"rank {r} of {world}: {msg}" if world > 1 else msg)
    for key in every[0]["sig"]:
        values = [got["sig"][key] for got in every]
        if any(x != values[0] for x in values):
            arg = {"batch": "q", "hq": "q", "hkv": "k", "d": "q", "dv": "v", "dtype": "q", "device": "q"}.get(key, key)
            raise _core.InvalidArgumentError(f"{arg}: {key} differs between ranks: {values} (every rank must pass "
                                             "the same shapes and options)")
    raise _core.InvalidArgumentError(f"cu_seqlens: ranks hold different numbers of sequences: "
                                     f"{[got['n'] for got in every]}")


def choose(strategy: str, world: int, hq: int, hkv: int) -> tuple:
    """(strategy, reason) for strategy = "ring" | "all_to_all" | "auto"; raises UnsupportedError on every rank
    (the inputs are the same everywhere after validate) when all_to_all cannot split the heads."""
    split = hq % world == 0 and hkv % world == 0
    heads = f"Hq={hq}, Hkv={hkv}, world={world}"
    if strategy == "all_to_all":
        if not split:
            raise _core.UnsupportedError(f"strategy: 'all_to_all' splits the heads across the ranks, so Hq and Hkv "
                                         f"must be multiples of the world size; got {heads}. Use strategy='ring'")
        return "all_to_all", f"requested; {heads}"
    if strategy == "ring":
        return "ring", f"requested; {heads}"
    if world == 1:
        return "ring", "one rank: a single local call (no communication)"
    if split:
        return "all_to_all", (f"auto: {heads} divide by the world size; all-to-all moves each of q, k, v, out "
                              "once (about 4/world of the local tensors per rank) instead of K/V world-1 times")
    return "ring", f"auto: {heads} do not divide by the world size, so the heads cannot be split"


def scale_of(softmax_scale, d):
    return 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
