"""Time the optimizer update alone over Qwen3-8B-shaped parameters (the stacked layout the trainer uses).

    python scripts/bench_optimizer.py            # GPU, bf16 parameters and moments (bench_train's default)
    python scripts/bench_optimizer.py --smoke    # tiny shapes on the CPU

Each variant is jitted with its state donated (as in the train step); the median of --iters calls after --warmup
untimed ones (the first compiles) is reported, and the tables are appended to docs/benchmarks.md. The floor is
the bytes an update must move (parameters, gradients and both moments read, parameters and moments written)
over the device's copy bandwidth, which the `copy` row measures.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import _bench


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16")
    _bench.add_common_flags(p, iters=5, warmup=1, iters_help="timed updates (the median is reported)",
                            smoke_help="tiny shapes on the CPU")
    return p.parse_args(argv)


def abstract_params(smoke: bool, dtype):
    from longrm_jax.training.config import load_config
    from flax import nnx

    from longrm_jax.training.model_setup import preset_config

    from longrm_jax.models.heads import build_model
    from longrm_jax.training.params import ParamCodec

    cfg = load_config(None, [f"model.preset={'tiny_qwen3' if smoke else 'qwen3_8b'}", "stage=bt"] +
                      (["model.overrides.vocab_size=1000"] if smoke else []))
    mcfg = preset_config(cfg).replace(head="classifier")
    codec = ParamCodec(nnx.eval_shape(lambda: build_model(mcfg, rngs=nnx.Rngs(0))))
    return {k: jax.ShapeDtypeStruct(v.shape, dtype) for k, v in codec.shapes().items()}


def median_update_seconds(fn, state: list, grads, args) -> float:
    """Median seconds of one donated update ``state = fn(*state, grads)``; ``state`` ([params, opt_state]) is
    updated in place (donation invalidates the old buffers, so every call takes the previous call's output)."""

    def update():
        state[:] = fn(state[0], state[1], grads)
        return state[0]

    return _bench.median_seconds(update, iters=args.iters, warmup=args.warmup)


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        jax.config.update("jax_platforms", "cpu")
    dtype = jnp.dtype(args.dtype)
    shapes = abstract_params(args.smoke, dtype)
    n = sum(int(np.prod(s.shape)) for s in shapes.values())
    params = {k: jnp.full(s.shape, 0.01, dtype) for k, s in shapes.items()}
    grads = {k: jnp.full(s.shape, 1e-3, dtype) for k, s in shapes.items()}
    item = dtype.itemsize
    variants = {
        "copy (p + g)": (optax.sgd(1e-6), 3 * n * item),
        "adamw": (optax.adamw(1e-6, b1=0.9, b2=0.95), 7 * n * item),
        "clip + adamw": (optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, b1=0.9, b2=0.95)),
                         8 * n * item),
    }
    print(f"{n / 1e9:.2f} B parameters, {dtype.name}, {_bench.device_name()}")
    lines = ["| variant | ms | GB/s at the floor bytes |", "|---|---:|---:|"]
    print("\n".join(lines))
    variants["clip + adamw + finite guard (train step)"] = (variants["clip + adamw"][0], 8 * n * item)
    for name, (tx, nbytes) in variants.items():
        def step(params, opt_state, grads, tx=tx, guard="guard" in name):
            updates, new_opt = tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            if not guard:
                return new_params, new_opt
            # As training.steps: a non-finite gradient leaves parameters and moments unchanged.
            ok = jnp.isfinite(optax.tree.norm(grads))
            return jax.tree.map(lambda a, b: jnp.where(ok, a, b), (new_params, new_opt), (params, opt_state))

        state = [params, tx.init(params)]
        dt = median_update_seconds(jax.jit(step, donate_argnums=(0, 1)), state, grads, args)
        params = state[0]
        lines.append(f"| {name} | {1e3 * dt:.1f} | {nbytes / dt / 1e9:.0f} |")
        print(lines[-1], flush=True)
        del state
    # Per parameter (adamw alone): which arrays are slow, if any.
    lines += ["", "| adamw, one array | ms | GB/s |", "|---|---:|---:|"]
    print("\n".join(lines[-2:]))
    tx = optax.adamw(1e-6, b1=0.9, b2=0.95)
    for k in sorted(shapes, key=lambda k: -int(np.prod(shapes[k].shape)))[:8]:
        def step(p, o, g):
            updates, o = tx.update(g, o, p)
            return optax.apply_updates(p, updates), o

        state = [params[k], tx.init(params[k])]
        dt = median_update_seconds(jax.jit(step, donate_argnums=(0, 1)), state, grads[k], args)
        size = int(np.prod(shapes[k].shape))
        lines.append(f"| {k} {shapes[k].shape} | {1e3 * dt:.2f} | {7 * size * item / dt / 1e9:.0f} |")
        print(lines[-1], flush=True)
        params[k] = state[0]
    path = _bench.record_path(args)
    if path:
        _bench.append_section(path, "optimizer update", command=_bench.command_line(argv),
                              device=_bench.devices_name(), details=f"{n / 1e9:.2f} B parameters, {dtype.name}",
                              table=lines)


if __name__ == "__main__":
    main()
