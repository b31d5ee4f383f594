"""Train state (trainable params, frozen params, optax state, step), the optimizer and its sharding.

Full fine-tuning: ``params`` holds every model parameter, ``frozen`` is empty. LoRA: ``params`` holds the
adapters (``.../lora_a``, ``.../lora_b``; the score head too when it is a LoRA target, as upstream's DisRM) and
the fully trained modules (``lora.train_modules``, e.g. a new score head), ``frozen`` the base weights.
``lora.effective_params`` gives the weights the model runs with in both cases.

Master weights and optimizer state live in ``model.param_dtype`` (fp32 by default); the model casts weights to
its compute dtype inside each layer, so gradients arrive in the master dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import PartitionSpec as P

from longrm_jax.parallel.mesh import DEFAULT_RULES
from longrm_jax.training import lora
from longrm_jax.training.config_schema import LoraSection, OptimSection, TrainConfig
from longrm_jax.training.params import ParamCodec, cast, shardings


@struct.dataclass
class TrainState:
    step: jax.Array
    params: dict
    frozen: dict
    opt_state: optax.OptState


def lr_schedule(optim: OptimSection, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 over ceil(warmup_ratio * steps), then cosine to min_lr_ratio * lr."""
    warmup = min(math.ceil(optim.warmup_ratio * total_steps), max(total_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup else optim.lr,
        peak_value=optim.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=optim.lr * optim.min_lr_ratio,
    )


def make_optimizer(optim: OptimSection, total_steps: int) -> optax.GradientTransformation:
    parts = []
    if optim.grad_clip and optim.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(optim.grad_clip))
    parts.append(optax.adamw(lr_schedule(optim, total_steps), b1=optim.b1, b2=optim.b2, eps=optim.eps,
                             weight_decay=optim.weight_decay))
    return optax.chain(*parts)


def frozen_dtype(cfg: TrainConfig):
    """dtype of the frozen base weights of a LoRA run (``lora.base_dtype``, default ``model.param_dtype``)."""
    return jnp.dtype(cfg.base_weights_dtype)


def split_trainable(lora_cfg: LoraSection, codec: ParamCodec, values: dict, key) -> tuple[dict, dict]:
    """(trainable, frozen) flat dicts for full fine-tuning or LoRA (``lora_cfg``: the run's ``lora`` section)."""
    if lora_cfg.rank <= 0:
        return dict(values), {}
    targets = lora.select_targets(values.keys(), lora_cfg.targets)
    full = set(lora.select_train_modules(values.keys(), lora_cfg.train_modules))
    names = {k: codec.logical_names(k) for k in targets}
    adapters = lora.init_adapters({k: values[k].shape for k in targets}, names, targets, lora_cfg.rank, key)
    trainable = {k: values[k] for k in full} | adapters
    frozen = {k: v for k, v in values.items() if k not in full}
    return trainable, frozen


def param_sharding_rules(param_axes) -> dict:
    """Logical -> mesh axis rules for parameters: the defaults with ``embed`` over ``param_axes``
    (``mesh.param_axes``)."""
    axes = tuple(param_axes)
    return DEFAULT_RULES | {"embed": axes[0] if len(axes) == 1 else (axes or None)}


def state_specs(cfg: TrainConfig, codec: ParamCodec, tx, trainable: dict, frozen: dict, mesh) -> TrainState:
    """PartitionSpecs for every leaf of the train state: parameters fsdp-style from their logical names,
    adapters replicated, optimizer moments like their parameters, scalars replicated."""
    base = codec.specs(mesh, param_sharding_rules(cfg.mesh.param_axes))
    param_specs = {k: base.get(k, P()) for k in trainable}
    # mesh.optimizer_axes: the moments sharded apart from their parameters (ZeRO-1: weights replicated over data)
    opt_base = base if cfg.mesh.optimizer_axes is None else codec.specs(
        mesh, param_sharding_rules(cfg.mesh.optimizer_axes))
    abstract = jax.eval_shape(tx.init, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), trainable))
    opt_specs = optax.tree_map_params(
        tx, lambda _, spec: spec, abstract, {k: opt_base.get(k, P()) for k in trainable},
        transform_non_params=lambda _: P(),
        is_leaf=lambda x: isinstance(x, P),
    )
    return TrainState(step=P(), params=param_specs, frozen={k: base[k] for k in frozen}, opt_state=opt_specs)


HOST_MEMORY = "pinned_host"


def offload_optimizer_state(cfg: TrainConfig, sh: TrainState) -> TrainState:
    """The state's shardings with the optimizer state in pinned host memory when ``optim.offload_state``."""
    if not cfg.optim.offload_state:
        return sh
    return sh.replace(opt_state=jax.tree.map(lambda s: s.with_memory_kind(HOST_MEMORY), sh.opt_state))


def on_host(x) -> bool:
    """Whether an array (or ShapeDtypeStruct) with a sharding lives in host memory."""
    sharding = getattr(x, "sharding", None)
    return getattr(sharding, "memory_kind", None) in (HOST_MEMORY, "unpinned_host")


def create_state(cfg: TrainConfig, codec: ParamCodec, values: dict, tx, mesh, key) -> tuple[TrainState, TrainState]:
    """Place the initial state on ``mesh`` (sharded) and return it with its sharding tree."""
    trainable, frozen = split_trainable(cfg.lora, codec, values, key)
    trainable, frozen = cast(trainable, cfg.model.param_dtype), cast(frozen, frozen_dtype(cfg))
    specs = state_specs(cfg, codec, tx, trainable, frozen, mesh)
    sh = offload_optimizer_state(cfg, shardings(specs, mesh))
    trainable = jax.device_put(trainable, sh.params)
    frozen = jax.device_put(frozen, sh.frozen)
    init = jax.jit(lambda p: TrainState(jnp.zeros((), jnp.int32), p, {}, tx.init(p)),
                   out_shardings=TrainState(sh.step, sh.params, {}, sh.opt_state))
    state = init(trainable).replace(frozen=frozen)
    return state, sh


def abstract_state(cfg: TrainConfig, codec: ParamCodec, tx, mesh, key) -> tuple[TrainState, TrainState]:
    """What ``create_state`` would place, as ``jax.ShapeDtypeStruct`` leaves with their shardings (nothing is
    allocated): for compiling the step before any weights are loaded."""
    def build(values):
        trainable, frozen = split_trainable(cfg.lora, codec, values, key)
        trainable, frozen = cast(trainable, cfg.model.param_dtype), cast(frozen, frozen_dtype(cfg))
        return TrainState(jnp.zeros((), jnp.int32), trainable, frozen, tx.init(trainable))

    shapes = jax.eval_shape(build, codec.shapes())
    sh = offload_optimizer_state(cfg, shardings(state_specs(cfg, codec, tx, shapes.params, shapes.frozen, mesh), mesh))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, sh), sh
