"""The persistent XLA compilation cache of the commands that load a model to run it (``evaluate``, ``score``,
``serve``; ``train`` when its ``compilation_cache`` is set): a second run on the same shapes reads its compiled
programs from disk instead of compiling them again.

The setting is one word or a directory:
- ``auto`` (the default): ``$JAX_COMPILATION_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/longrm_jax/xla``
  (``~/.cache/longrm_jax/xla`` without it). A home that cannot hold it only costs the speed-up: a warning, no error.
- ``off``: no cache.
- a directory: that one (it must be writable).

XLA keys each entry by the program, its compile options (the XLA flags among them), the devices it was compiled
for and the jax/jaxlib version, so an entry is only ever read back for the very program it holds: a hit changes
how fast a run starts, never what it computes. JAX stores only programs that took at least
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` (1 s by default) to compile.
"""

from __future__ import annotations

import logging
import os

AUTO, OFF = "auto", "off"
HELP = ("persistent XLA compilation cache: auto ($JAX_COMPILATION_CACHE_DIR if set, else "
        "$XDG_CACHE_HOME/longrm_jax/xla, i.e. ~/.cache/longrm_jax/xla), off, or a directory")

log = logging.getLogger(__name__)


def cache_dir(setting: str | None) -> str | None:
    """The directory ``setting`` names (None: no cache)."""
    if setting is None or setting == OFF:
        return None
    if setting == AUTO:
        if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            return os.environ["JAX_COMPILATION_CACHE_DIR"]
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "longrm_jax", "xla")
    return os.path.expanduser(setting)


def enable_compilation_cache(setting: str | None) -> str | None:
    """Point JAX at the cache ``setting`` names before anything compiles; the directory used, or None."""
    import jax  # noqa: PLC0415 - the CLIs' --help answers without jax

    path = cache_dir(setting)
    if path is None:
        if setting == OFF:
            jax.config.update("jax_enable_compilation_cache", False)
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        if setting != AUTO:
            raise
        log.warning("no compilation cache (%s): every program compiles; set compilation_cache to a writable "
                    "directory, or off", error)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    return path
