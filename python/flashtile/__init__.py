"""FlashTile: exact FlashAttention (tiled forward with online softmax, backward by recomputation).

    import flashtile
    out = flashtile.flash_attn_func(q, k, v, causal=True)      # q (B, Sq, Hq, D), numpy or torch
    print(flashtile.last_dispatch())                           # which kernel ran, and why not others

Tensors cross into the C++ library without copies (numpy through DLPack, torch tensors through their
attributes). Eager torch calls use the op flashtile_ext::attention of the compiled extension flashtile._torch_ext
(C++ autograd node), or a Python autograd.Function where that extension is absent (torch_extension() says which);
under torch.compile they become the custom ops flashtile::fwd / flashtile::bwd. flash_attn_with_kvcache attends
to a KV cache after appending to it in place (inference). torch is optional.
"""

from ._core import (
    BackendError,
    DeviceError,
    DispatchReport,
    DTypeError,
    FlashTileError,
    InvalidArgumentError,
    KernelInfo,
    Refusal,
    UnsupportedError,
    __version__,
    backend_names,
)
from ._api import (
    explain,
    flash_attn_backward,
    flash_attn_func,
    flash_attn_varlen_backward,
    flash_attn_varlen_func,
    last_dispatch,
    scaled_dot_product_attention,
    torch_extension,
)
from ._kvcache import explain_kvcache, flash_attn_with_kvcache
from ._merge import merge_attention_states

__all__ = [
    "flash_attn_func",
    "flash_attn_backward",
    "flash_attn_varlen_func",
    "flash_attn_varlen_backward",
    "flash_attn_with_kvcache",
    "explain_kvcache",
    "merge_attention_states",
    "scaled_dot_product_attention",
    "explain",
    "last_dispatch",
    "torch_extension",
    "backend_names",
    "DispatchReport",
    "KernelInfo",
    "Refusal",
    "FlashTileError",
    "InvalidArgumentError",
    "DTypeError",
    "DeviceError",
    "UnsupportedError",
    "BackendError",
    "__version__",
]
