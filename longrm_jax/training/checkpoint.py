"""Training checkpoints with orbax: state, data-iterator state, run config and model config per step.

Layout: ``<dir>/<step>/{state,data,config,model}`` written by ``orbax.checkpoint.CheckpointManager``
(asynchronous saves, keep the last K). orbax writes a step into a temporary directory and renames it only when
complete, so a process killed during a save leaves the previous step as the latest restorable one.

``load_trained_weights(dir)`` is the loader for other tools (``python -m longrm_jax.export --checkpoint DIR``
and ``model.init`` of a later stage): it reads the newest step's parameters on the host and merges LoRA.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from longrm_jax.models import ModelConfig

ITEMS = ("state", "data", "config", "model")


def _manager(directory: str, *, keep: int = 3, async_save: bool = True, read_only: bool = False):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options, item_names=ITEMS)


def model_config_dict(mcfg: ModelConfig) -> dict:
    d = dataclasses.asdict(mcfg)
    d["rope_scaling"] = mcfg.rope_scaling_dict
    return d


class Checkpointer:
    """Saves and restores a run's ``TrainState`` + iterator state + configs."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.manager = _manager(self.directory, keep=keep, async_save=async_save)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_state: dict, config: dict, mcfg: ModelConfig) -> None:
        """Start an (asynchronous) save; device buffers are copied before this returns, so the caller may
        donate ``state`` to the next step right away."""
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(_as_dict(state)),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
            model=ocp.args.JsonSave(model_config_dict(mcfg)),
        ), force=True)

    def restore(self, state_template, step: int | None = None):
        """(state, data_state, step) of ``step`` (default: latest), placed like ``state_template``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _as_dict(state_template))
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
        return type(state_template)(**out["state"]), out["data"], step

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _as_dict(state) -> dict:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


def is_training_checkpoint(path: str) -> bool:
    """True for a directory written by ``Checkpointer`` (step subdirectories holding ``state``)."""
    if not os.path.isdir(path):
        return False
    return any(os.path.isdir(os.path.join(path, d, "state")) for d in os.listdir(path) if d.isdigit())


def trained_model_config(directory: str, step: int | None = None) -> ModelConfig:
    """The ModelConfig recorded in a training checkpoint (no weights read)."""
    manager = _manager(directory, read_only=True)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{directory}: no complete training checkpoint step")
        meta = manager.restore(step, args=ocp.args.Composite(model=ocp.args.JsonRestore()))
    finally:
        manager.close()
    return ModelConfig(**meta["model"])


def load_trained_weights(directory: str, step: int | None = None) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """(ModelConfig, flat parameter dict as host numpy) of a training checkpoint, LoRA merged.

    Parameters come back in the checkpoint's master dtype; the model config records the trained head.
    """
    from longrm_jax.training.lora import merge

    manager = _manager(directory, read_only=True)
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{directory}: no complete training checkpoint step")
    meta = manager.restore(step, args=ocp.args.Composite(model=ocp.args.JsonRestore(),
                                                         config=ocp.args.JsonRestore()))
    mcfg = ModelConfig(**meta["model"])
    run_cfg = meta["config"]
    # Restore on the host as numpy, whatever devices / mesh the training used.
    item = os.path.join(os.path.abspath(directory), str(step), "state")
    ckptr = ocp.PyTreeCheckpointer()
    saved = ckptr.metadata(item).item_metadata.tree
    wanted = {k: saved[k] for k in ("params", "frozen") if k in saved}  # not the optimizer moments
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
    tree = ckptr.restore(item, args=ocp.args.PyTreeRestore(item=wanted, restore_args=as_numpy,
                                                            partial_restore=True))
    params, frozen = dict(tree["params"]), dict(tree.get("frozen") or {})
    if frozen:
        adapters = {k: v for k, v in params.items() if k.endswith(("/lora_a", "/lora_b"))}
        base = frozen | {k: v for k, v in params.items() if k not in adapters}
        lora_cfg = run_cfg["lora"]
        params = {k: np.asarray(v) for k, v in merge(base, adapters, alpha=lora_cfg["alpha"],
                                                     rank=lora_cfg["rank"]).items()}
    manager.close()
    return mcfg, params


def load_model_for_export(directory: str, step: int | None = None):
    """An NNX model (CausalLM or SequenceClassifier) with a training checkpoint's weights, LoRA merged, in
    float32 compute - ready for ``longrm_jax.hf.export.save_pretrained``."""
    import jax.numpy as jnp

    from longrm_jax.training.model_setup import codec_for

    mcfg, params = load_trained_weights(directory, step)
    mcfg = mcfg.replace(dtype="float32", remat="none")
    codec = codec_for(mcfg)
    values = {k: jnp.asarray(v) for k, v in params.items()}
    return codec.model(values)


def resolve_training_checkpoint(src: str):
    """Resolver for ``longrm_jax.export.CHECKPOINT_RESOLVERS``: a training checkpoint directory (the run's
    ``checkpoints`` dir, or a run's ``output_dir`` holding one) -> ``ResolvedCheckpoint`` with LoRA merged;
    None for anything else. Tokenizer files come from the run's ``data.tokenizer`` (the bundled tiny tokenizer
    when unset)."""
    from longrm_jax.export import ResolvedCheckpoint

    step = None
    name = os.path.basename(os.path.normpath(src))
    if name.isdigit() and os.path.isdir(os.path.join(src, "state")):  # one step folder: export that step
        src, step = os.path.dirname(os.path.normpath(src)), int(name)
    if not is_training_checkpoint(src) and is_training_checkpoint(os.path.join(src, "checkpoints")):
        src = os.path.join(src, "checkpoints")
    if not is_training_checkpoint(src):
        return None
    manager = _manager(src, read_only=True)
    if step is None:
        step = manager.latest_step()
    if step is None:
        manager.close()
        raise FileNotFoundError(f"{src}: no complete training checkpoint step (a run killed during its first save?)")
    run_cfg = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
    manager.close()
    tokenizer_dir = run_cfg.get("data", {}).get("tokenizer")
    if tokenizer_dir is None:
        from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR

        tokenizer_dir = TINY_TOKENIZER_DIR
    return ResolvedCheckpoint(model=load_model_for_export(src, step), tokenizer_dir=tokenizer_dir)
