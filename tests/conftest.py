"""Test session setup: 8 fake CPU devices so distributed code is tested against single-device results."""

import os

# Must happen before jax is imported anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The real upstream sample rows: shared/ lies beside the repository (the CI clone has it there too);
# LONGRM_UPSTREAM_DATA overrides.
UPSTREAM_DATA = os.environ.get("LONGRM_UPSTREAM_DATA") or os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "longrm_upstream"))
