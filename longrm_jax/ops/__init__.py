"""Kernels that know no model: the attention entry point, its implementations and ring attention.

Inside the package the modules import one way: ``contract`` (names, errors, shape checks) <- ``kernel_vjp``
<- kernels (``xla_attention``, ``cudnn_flash``, ``splash``, ``flash`` with the registry ``get_kernel``)
<- ``dispatch`` (which kernel) <- ``ring`` <- ``attention``. ``decode_attention`` (one query per row over a
stacked KV cache, a Pallas Triton kernel) stands alone: the decoder's cached path calls it directly.
"""

from longrm_jax.ops.attention import attention, attention_with_lse, dense_reference
from longrm_jax.ops.contract import IMPLEMENTATIONS, AttentionNotSupportedError
from longrm_jax.ops.dispatch import resolve_impl
from longrm_jax.ops.ring import ring_attention

__all__ = [
    "IMPLEMENTATIONS",
    "AttentionNotSupportedError",
    "attention",
    "attention_with_lse",
    "dense_reference",
    "resolve_impl",
    "ring_attention",
]
