"""Stub: tokamax 0.0.17 imports xprof.cli.tools at import time (tokamax/_src/benchmarking.py) but the training
step never calls it. xprof (32 MB wheel + google-cloud-storage, duckdb, ...) is not carried; this stands in."""


def get_kernel_stats_tool(*args, **kwargs):
    raise RuntimeError("xprof is stubbed on the lent GPU (.gpu/stubs); tokamax benchmarking is unavailable")
