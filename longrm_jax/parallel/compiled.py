"""What a compiled program says about itself: hand-written kernels and collectives in its HLO, FLOPs from XLA's
cost analysis. Used by the ``--compile-only`` reports of training and evaluation (programs compiled for a
topology, ``parallel.topology``), and by the tests that check a TPU program kept its splash kernels."""

from __future__ import annotations

import re

# Custom-call targets that are hand-written kernels: Mosaic TPU (splash), Mosaic GPU and Triton (tokamax), cuDNN.
KERNEL_TARGETS = {"tpu_custom_call": "Mosaic TPU", "mosaic_gpu": "Mosaic GPU", "__gpu$xla.gpu.triton": "Triton",
                  "__cudnn$fmha": "cuDNN"}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
# FP8 matmuls (model.matmul_dtype: fp8): a cuBLASLt FP8 gemm custom call, or a gemm fusion (XLA's Triton gemm)
# whose computation takes float8 operands.
FP8_MATMUL = "FP8 matmul"
_F8_GEMM_FUSION = re.compile(r"^%\S*gemm\S* \([^)]*f8e[45]m", re.M)
_COLLECTIVE = re.compile(r"=\s*[^=\n]*?\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def hlo_op_counts(hlo_text: str) -> dict:
    """Kernel custom calls by kind and collectives by op in a compiled program's HLO text. Each op counts once
    (an async ``-start``/``-done`` pair as one; an op inside a loop body once per body, not per iteration)."""
    counts: dict = {}
    for target in _CUSTOM_CALL.findall(hlo_text):
        kind = next((v for k, v in KERNEL_TARGETS.items() if target.startswith(k)), None)
        if kind:
            counts[kind] = counts.get(kind, 0) + 1
        if target.startswith("__cublas$lt$matmul$f8"):
            counts[FP8_MATMUL] = counts.get(FP8_MATMUL, 0) + 1
    fused = len(_F8_GEMM_FUSION.findall(hlo_text))
    if fused:
        counts[FP8_MATMUL] = counts.get(FP8_MATMUL, 0) + fused
    for op in _COLLECTIVE.findall(hlo_text):
        counts[op] = counts.get(op, 0) + 1
    return counts


def describe_counts(counts: dict) -> str:
    kernels = ", ".join(f"{v} {k}" for k, v in counts.items() if k not in COLLECTIVES) or "none"
    colls = ", ".join(f"{v} {k}" for k, v in counts.items() if k in COLLECTIVES) or "none"
    return f"kernels {kernels}; collectives {colls}"


def cost_flops(compiled) -> float | None:
    """FLOPs of one run of ``compiled`` per device, from XLA's cost analysis (None where not reported)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def flop_text(flops: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= scale:
            return f"{flops / scale:.2f} {unit}"
    return f"{flops / 1e6:.2f} MFLOP"
