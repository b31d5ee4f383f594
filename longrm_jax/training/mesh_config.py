"""The training config's ``mesh`` section: ``MeshSection`` (its keys and defaults), ``MESH_BY_HAND`` (what
``--set mesh.<key>=...`` over ``mesh: auto`` starts from) and the checks that concern the mesh. The loader and the
other sections live in ``training.config``, which raises these checks' problems as its ``ConfigError``."""

from __future__ import annotations

from dataclasses import dataclass, field

from longrm_jax.config_rules import ranged

# The mesh's axes, by name (parallel.mesh.make_mesh's).
MESH_AXES = ("data", "fsdp", "seq", "tensor")
# An axis size: -1 takes the devices the other axes leave over.
AXIS_SIZE = ">= 1, or -1 (the devices left over)"


@dataclass
class MeshSection:
    """The device mesh: how many devices each axis spans (their product: every device), or `mesh: auto`."""

    # `mesh: auto` (YAML) or `--set mesh=auto`: the trainer chooses data, fsdp or seq over every device, the one
    # that fits and moves the fewest bytes per step (training.mesh_plan, parallel.mesh_choice). A later
    # `--set mesh.<key>=...` sets the mesh by hand instead, starting from MESH_BY_HAND.
    auto: bool = False
    data: int = ranged(1, AXIS_SIZE)  # pure data parallelism (the parameters replicated over it)
    fsdp: int = ranged(-1, AXIS_SIZE)  # data parallelism with parameters and optimizer state sharded (ZeRO-3)
    seq: int = ranged(1, AXIS_SIZE)  # sequence parallelism: a row's tokens split over devices, ring attention
    tensor: int = ranged(1, AXIS_SIZE)  # tensor parallelism over attention heads / MLP hidden units
    # Mesh axes the parameters' model dimension (and so optimizer state) is sharded over. ["fsdp", "seq"]
    # shards them over the sequence-parallel devices too (ZeRO over every device, as upstream's ZeRO + SP).
    param_axes: list = field(default_factory=lambda: ["fsdp"])
    # Mesh axes the optimizer moments' model dimension is sharded over; null: param_axes. ["data"] with the
    # weights replicated is ZeRO-1 (what auto's data-parallel choice sets).
    optimizer_axes: list | None = None


# What `--set mesh.<key>=...` over `mesh: auto` starts from: one device, weights sharded over fsdp and seq (the
# shipped GPU configs' explicit mesh before auto), so `--set mesh.seq=4` is the ring over 4 devices as it was.
MESH_BY_HAND = {"data": 1, "fsdp": 1, "seq": 1, "tensor": 1, "param_axes": ["fsdp", "seq"]}


def spelled_out(value):
    """The mesh section as YAML gave it, with ``mesh: auto`` written as the mapping it stands for."""
    return {"auto": True} if value == "auto" else value


def mesh_problem(mesh: MeshSection, seq_len: int) -> str | None:
    """The first thing wrong with ``mesh`` for rows of ``seq_len`` tokens (``data.seq_len``), else None."""
    if mesh.seq > 1 and seq_len % (2 * mesh.seq):
        return (f"data.seq_len ({seq_len}) must be a multiple of 2 x mesh.seq "
                f"({2 * mesh.seq}) for zigzag ring attention")
    for key in ("param_axes", "optimizer_axes"):
        bad_axes = set(getattr(mesh, key) or ()) - set(MESH_AXES)
        if bad_axes:
            return f"mesh.{key}: unknown mesh axes {sorted(bad_axes)}; valid: data, fsdp, seq, tensor"
    sized = [k for k in MESH_AXES if getattr(mesh, k) != getattr(MeshSection, k)]
    if mesh.auto and sized:
        return f"mesh.auto chooses the axis sizes itself; drop mesh.{', mesh.'.join(sized)} (or auto)"
    return None
