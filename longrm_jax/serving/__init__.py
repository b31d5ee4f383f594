"""The reward server behind ``python -m longrm_jax.serve``: its settings (``config``), the batcher that scores
concurrent requests together (``batcher``) and the HTTP routes in the shapes RL frameworks send (``app``)."""
