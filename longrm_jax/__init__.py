"""longrm_jax: long-context reward models in JAX / Flax NNX.

The public Python API: :func:`load_pretrained` (a model), :class:`RewardModel` (score and compare answers with a
discriminative reward model) and :class:`Judge` (a generative judge's verdict), the last two from
:mod:`longrm_jax.api`, imported on first use so that ``import longrm_jax`` stays light.
"""

__version__ = "0.1.0"


def load_pretrained(path, **kwargs):
    """Load a local Hugging Face checkpoint directory; see :func:`longrm_jax.hf.load.load_pretrained`."""
    from longrm_jax.hf.load import load_pretrained as _load

    return _load(path, **kwargs)


_API_NAMES = ("RewardModel", "Judge", "Judgement", "Comparison")


def __getattr__(name):
    if name in _API_NAMES:
        from longrm_jax import api

        return getattr(api, name)
    raise AttributeError(f"module 'longrm_jax' has no attribute {name!r}")


__all__ = ["load_pretrained", "RewardModel", "Judge", "Judgement", "Comparison", "__version__"]
