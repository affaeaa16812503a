"""merge_attention_states: the results of attention over disjoint parts of the keys, merged into the result over
all of them (split-KV decoding, context parallelism, a KV cache kept in pieces). The rule (include/flashtile/merge.h):

    lse = log Σ_i exp(lse_i),    out = Σ_i exp(lse_i − lse) · out_i

A part whose lse is −inf (it saw no key) contributes nothing; a row where every part is −inf gets out = 0 and
lse = −inf, as a row without keys. numpy arrays merge in the C++ library; torch tensors merge in torch operations,
so they run on any device and autograd differentiates the merge in out_i and lse_i. Note that flash_attn_func's lse
is a constant for autograd (the library's backward takes no lse gradient), so a loss on a merge of its results
gets the gradient through out_i only: right for v, not the whole gradient for q and k. Merging for inference needs
no gradient; training through a split of the keys needs the lse gradient in the backward (not built yet).
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._common import InvalidArgumentError, kind_name


def _parts(args):
    if len(args) == 4:
        return [args[0], args[2]], [args[1], args[3]]
    if len(args) == 2 and isinstance(args[0], (list, tuple)) and isinstance(args[1], (list, tuple)):
        return list(args[0]), list(args[1])
    raise TypeError("merge_attention_states(out_a, lse_a, out_b, lse_b) or merge_attention_states(outs, lses), "
                    f"got {len(args)} positional arguments")


def _torch_merge(outs, lses):
    import torch

    for i, (o, l) in enumerate(zip(outs, lses)):
        if o.dim() not in (3, 4):
            raise InvalidArgumentError(f"merge_attention_states: outs[{i}]: expected [B, S, H, Dv] or [T, H, Dv], "
                                       f"got shape {tuple(o.shape)}")
        want = (o.shape[0], o.shape[2], o.shape[1]) if o.dim() == 4 else (o.shape[1], o.shape[0])
        if tuple(l.shape) != want or o.shape != outs[0].shape:
            raise InvalidArgumentError(f"merge_attention_states: lses[{i}] shape {tuple(l.shape)} / outs[{i}] shape "
                                       f"{tuple(o.shape)} do not match (expected lse {want}, out "
                                       f"{tuple(outs[0].shape)})")
        if l.dtype != torch.float32:
            raise InvalidArgumentError(f"merge_attention_states: lses[{i}]: dtype {l.dtype}, expected torch.float32")
    stacked = torch.stack(lses)                          # (n, B, H, S) or (n, H, T)
    lse = torch.logsumexp(stacked, dim=0)                # every part -inf: -inf
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    weights = torch.exp(stacked - safe)                  # -inf parts: 0
    # To the rows of out: (n, B, S, H, 1) or (n, T, H, 1).
    weights = (weights.transpose(2, 3) if outs[0].dim() == 4 else weights.transpose(1, 2)).unsqueeze(-1)
    out = sum(w * o.float() for w, o in zip(weights, outs))
    return out.to(outs[0].dtype), lse


def merge_attention_states(*args):
    """merge_attention_states(out_a, lse_a, out_b, lse_b) -> (out, lse), or merge_attention_states(outs, lses).

    out_i: (B, S, H, Dv) or packed (T, H, Dv); lse_i: (B, H, S) or (H, T) float32 — as flash_attn_func /
    flash_attn_varlen_func return them with return_lse=True. All parts numpy arrays or all torch tensors."""
    outs, lses = _parts(args)
    if not outs:
        raise InvalidArgumentError("merge_attention_states: outs: at least one part is needed, got 0")
    if len(outs) != len(lses):
        raise InvalidArgumentError(f"merge_attention_states: lses: {len(lses)} tensors for {len(outs)} outs "
                                   "(one lse per part)")
    if all(isinstance(x, np.ndarray) for x in outs + lses):
        out = np.empty(outs[0].shape, dtype=outs[0].dtype)
        lse = np.empty(lses[0].shape, dtype=np.float32)
        bits = lambda x: x.view(np.uint16) if x.dtype.name == "bfloat16" else x  # noqa: E731 (see _numpy._bits)
        _core.merge_states([bits(o) for o in outs], list(lses), bits(out), lse, bf16_bits=True)
        return out, lse
    if all(type(x).__module__.startswith("torch") for x in outs + lses):
        return _torch_merge(outs, lses)
    kinds = sorted({kind_name(x) for x in outs + lses})
    raise TypeError(f"merge_attention_states: all parts must be numpy arrays or all torch tensors, got {kinds}")
