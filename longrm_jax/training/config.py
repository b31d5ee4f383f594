"""Training configuration: the tree of dataclasses of ``training.config_schema`` loaded from YAML, with
``--set dotted.key=value`` overrides.

Every key is checked: an unknown key raises ``ConfigError`` naming the file (or override) and listing the
valid keys at that level. Values are parsed as YAML and coerced to the field's declared type.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from longrm_jax.training.config_schema import (  # noqa: F401 - the schema's names, where load_config's users look
    ON_CORRUPT, CheckpointSection, ConfigError, DataSection, DistributedSection, LoraSection, LossSection, ModelSection,
    OptimSection, ProfileSection, TrainConfig)
from longrm_jax.training.mesh_config import MESH_BY_HAND, MeshSection, spelled_out


MAX_INT = 2**31 - 1  # the largest integer a setting may hold


def yaml_error_line(path: str | Path, error: Exception) -> str:
    """A YAML parse error as one line naming the file, line and column (PyYAML's own text spans several lines
    and quotes the source)."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    return f"{where}: invalid YAML: {problem}" + (f" ({context})" if context else "")


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML-parsed ``value`` to the declared type ``tp`` or raise naming ``where``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: cannot be {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_INT:  # counts reach jitted programs as 32-bit integers
                raise ConfigError(f"{where}: {value} is out of range (at most {MAX_INT:,} in size)")
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "2e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        quote = (" (YAML reads a bare on/off/yes/no as true/false: quote the word, e.g. \"on\")"
                 if isinstance(value, bool) else "")
        raise ConfigError(f"{where}: expected a string, got {value!r}{quote}")
    if tp in (list, dict) or origin in (list, dict):
        want = origin or tp
        if isinstance(value, want):
            return value
        if want is list and isinstance(value, str):
            return [s.strip() for s in value.split(",") if s.strip()]
        raise ConfigError(f"{where}: expected a {want.__name__}, got {value!r}")
    raise ConfigError(f"{where}: unsupported type {tp}")


def _build(cls, data: dict, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    types_ = _field_types(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in types_:
            raise ConfigError(
                f"{where}: unknown key {key!r}; valid keys: {', '.join(sorted(types_))}"
            )
        tp = types_[key]
        sub = f"{where}.{key}" if where else key
        if tp is MeshSection:  # `mesh: auto`
            value = spelled_out(value)
        kwargs[key] = _build(tp, value or {}, sub) if dataclasses.is_dataclass(tp) else _coerce(value, tp, sub)
    return cls(**kwargs)


def from_dict(data: dict, *, source: str = "config", schema: type = TrainConfig):
    """Build and validate a config of ``schema`` (a dataclass tree with a ``validate`` method) from a nested
    mapping; errors name ``source`` and the dotted key."""
    try:
        return _build(schema, data or {}, "").validate()
    except ConfigError as e:
        raise ConfigError(f"{source}: {str(e).lstrip(': ')}") from None


def apply_override(data: dict, assignment: str, schema: type = TrainConfig) -> None:
    """Apply ``dotted.key=value`` to a nested dict in place (value parsed as YAML), checking the key exists in
    ``schema``."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    value = yaml.safe_load(raw) if raw.strip() else ""
    cls: Any = schema
    node = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if cls is dict:  # free-form mapping (e.g. model.overrides): any key
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
            continue
        types_ = _field_types(cls)
        if part not in types_:
            at = ".".join(parts[:i]) or "top level"
            raise ConfigError(f"--set {key}: unknown key {part!r} at {at}; valid keys: {', '.join(sorted(types_))}")
        tp = types_[part]
        if last:
            node[part] = value
        else:
            if node.get(part) == "auto" and tp is MeshSection:  # `mesh: auto` then `--set mesh.seq=4`: by hand
                node[part] = dict(MESH_BY_HAND)
            node = node.setdefault(part, {})
            cls = tp if dataclasses.is_dataclass(tp) else (dict if tp is dict else None)
            if cls is None:
                raise ConfigError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a section")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *, base: dict | None = None,
                schema: type = TrainConfig):
    """Load ``path`` (YAML; None: ``base`` or the defaults), apply ``--set`` overrides, validate: a training
    config, or one of another ``schema`` built the same way (``longrm_jax.serving.config.ServeConfig``)."""
    data: dict = {} if base is None else yaml.safe_load(yaml.safe_dump(base))
    source = "config"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{yaml_error_line(path, e)}") from None
        if loaded is None and schema is TrainConfig:
            raise ConfigError(f"{path}: the file holds no settings (empty or only comments): it would train with "
                              "the built-in defaults, which are not the packaged default run. Run without --config "
                              "for the packaged run, or start from a file in configs/")
        loaded = {} if loaded is None else loaded
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        data = _merge(data, loaded)
    for assignment in overrides or []:
        apply_override(data, assignment, schema)
    if overrides:
        source += " + --set"
    return from_dict(data, source=source, schema=schema)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def to_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
