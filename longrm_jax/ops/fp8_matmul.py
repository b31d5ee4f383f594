"""FP8 matmuls for the dense projections (``ModelConfig.matmul_dtype = "fp8"``), through qwix's quantized
training op.

The rule: each operand is quantized to float8_e4m3fn with *current* scaling (the absolute maximum of this call's
values, per row of the activation and per output channel of the weight, so no scale history is carried between
steps); the product runs as an FP8 x FP8 dot with a float32 accumulator, and the scales multiply its output. In the
backward the incoming gradient is quantized to float8_e5m2 (its wider range) the same way, and both gradient dots
run in FP8 against the forward's quantized operands ("fp8_forward": the forward alone). On a Hopper GPU XLA
compiles these dots to FP8 gemms (cuBLASLt's, or its own Triton gemm fusions); a CPU runs them in a wider type
with the same rounding of the inputs.

What stays in the compute dtype: norms, RoPE, attention (its two matmuls and the softmax), the LoRA branch, the
heads, the loss and the optimizer. Only the weights' projections (q/k/v/o and the MLP) change.

qwix is pinned (pyproject): ``dot_general_qt`` is its QAT dot, which its ``QtProvider`` calls when it intercepts
a matmul; called here directly, so that the choice does not depend on module paths.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from qwix._src.core import dot_general_qt as qwix_qt

# By ModelConfig.matmul_dtype: "fp8", both passes as above; "fp8_forward", the forward's dot in FP8 and the two
# gradient dots in the compute dtype against the unquantized operands (a third of the FP8 matmuls, none of the
# gradient rounding).
_CONFIGS = {
    "fp8": qwix_qt.DotGeneralQtConfig(lhs_qtype=jnp.float8_e4m3fn, rhs_qtype=jnp.float8_e4m3fn,
                                      dlhs_grad_qtype=jnp.float8_e5m2, drhs_grad_qtype=jnp.float8_e5m2),
    "fp8_forward": qwix_qt.DotGeneralQtConfig(lhs_qtype=jnp.float8_e4m3fn, rhs_qtype=jnp.float8_e4m3fn,
                                              use_original_residuals=True),
}


def fp8_projection(x: jax.Array, w: jax.Array, in_axes: int, mode: str = "fp8") -> jax.Array:
    """``x`` contracted with ``w`` over ``x``'s last ``in_axes`` axes and ``w``'s first ones (the output: ``x``'s
    leading axes, then ``w``'s others), in FP8 as the module docstring says (``mode``: "fp8" or "fp8_forward");
    the output in ``x``'s dtype."""
    dims = ((tuple(range(x.ndim - in_axes, x.ndim)), tuple(range(in_axes))), ((), ()))
    return qwix_qt.dot_general_qt(x, w.astype(x.dtype), dims, _CONFIGS[mode]).astype(x.dtype)
