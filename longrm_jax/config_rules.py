"""The training config's ranges and choices, declared beside each field and checked by ``TrainConfig.validate``.

A field declares its rule where it is defined, in the words of the error message that refuses a value outside it:

    steps: int = ranged(0, ">= 0 (0: train for `epochs`)")
    layout: str = choice("packed", ("packed", "rows"))

``out_of_range`` reads these declarations (``dataclasses.field`` metadata) to validate a config, and
``longrm_jax.config_reference`` to write docs/config.md, so each rule is written once. A field whose type allows
None (``int | None``) accepts None besides its range.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from longrm_jax.cli_support import InputError


class ConfigError(InputError):
    """A configuration file or override that does not fit the schema."""


RULE = "rule"  # the dataclasses.field metadata key of a field's Range or Choice

# ">= 1", "> 0", "in [0, 1)", then optionally ", or -1" (one more value) and a note: ">= 1 or null".
_RANGE = re.compile(r"(?:(?P<op>>=|>) (?P<lo>-?[\d.e-]+)|in (?P<left>[\[(])(?P<a>-?[\d.e-]+), (?P<b>-?[\d.e-]+)"
                    r"(?P<right>[\])]))(?:, or (?P<also>-?\d+))?(?: (?P<note>.+))?")


@dataclass(frozen=True)
class Range:
    """Numbers between bounds, written as the error message says them: ``">= 1"``, ``"> 0 (or unset)"``,
    ``"in [0, 0.5)"``, ``">= 1, or -1 (the devices left over)"`` (one value outside the bounds also accepted)."""

    want: str
    lo: float = field(init=False)
    lo_closed: bool = field(init=False)
    hi: float | None = field(init=False)
    hi_closed: bool = field(init=False)
    also: int | None = field(init=False)

    def __post_init__(self):
        match = _RANGE.fullmatch(self.want)
        if match is None:
            raise ValueError(f"unreadable range {self.want!r}: write it as '>= 1', '> 0' or 'in [0, 1)', "
                             "then optionally ', or -1' and a note")
        g = match.groupdict()
        bounds = ((float(g["lo"]), g["op"] == ">=", None, False) if g["op"] else
                  (float(g["a"]), g["left"] == "[", float(g["b"]), g["right"] == "]"))
        for name, value in zip(("lo", "lo_closed", "hi", "hi_closed"), bounds):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "also", None if g["also"] is None else int(g["also"]))

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.also is not None and value == self.also:
            return True
        above = value >= self.lo if self.lo_closed else value > self.lo
        below = self.hi is None or (value <= self.hi if self.hi_closed else value < self.hi)
        return above and below


@dataclass(frozen=True)
class Choice:
    """One of ``values`` (None among them reads "null"). The message lists them as "a, b or c", or with
    ``one_of`` as "one of a, b, c"; ``note`` follows the list."""

    values: tuple
    one_of: bool = False
    note: str = ""

    @property
    def want(self) -> str:
        names = ["null" if v is None else str(v) for v in self.values]
        listed = f"one of {', '.join(names)}" if self.one_of else f"{', '.join(names[:-1])} or {names[-1]}"
        return f"{listed} {self.note}" if self.note else listed

    def ok(self, value: Any) -> bool:
        return value in self.values


def ranged(default: Any, want: str) -> Any:
    """A dataclass field defaulting to ``default`` whose values must be in the range ``want`` (see ``Range``)."""
    return field(default=default, metadata={RULE: Range(want)})


def choice(default: Any, values: tuple, *, one_of: bool = False, note: str = "") -> Any:
    """A dataclass field defaulting to ``default`` whose value must be one of ``values`` (see ``Choice``)."""
    return field(default=default, metadata={RULE: Choice(tuple(values), one_of=one_of, note=note)})


def leaf_fields(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, declared type) of every key of the config dataclass ``cls``, its sections' walked in
    field order: ``stage``, ..., ``model.init``, ..."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from leaf_fields(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, tp


def nullable(tp: Any) -> bool:
    """Whether the declared type ``tp`` allows None (``int | None``)."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def declared_rules(cls: type) -> list[tuple[str, Range | Choice]]:
    """(dotted key, rule) of each key of ``cls`` that declares a range or choices, in field order."""
    return [(key, f.metadata[RULE]) for key, f, _ in leaf_fields(cls) if RULE in f.metadata]


def out_of_range(config: Any) -> str | None:
    """The first key of ``config`` (field order) whose value its declared rule refuses, as "KEY must be WANT; got
    VALUE"; None when every value fits."""
    for key, f, tp in leaf_fields(type(config)):
        rule = f.metadata.get(RULE)
        value = operator.attrgetter(key)(config)
        if rule is None or (value is None and nullable(tp)):
            continue
        if not rule.ok(value):
            return f"{key} must be {rule.want}; got {value!r}"
    return None


def check_flat(cfg, required: dict[str, str]) -> None:
    """The check of a CLI's flat schema (``ServeConfig``, ``ScoreConfig``, ``ExportConfig``): every declared rule,
    then each required key set; ``required`` maps a key to what its flag takes (``"DIR, a checkpoint"``)."""
    problem = out_of_range(cfg)
    if problem:
        raise ConfigError(problem)
    for key, what in required.items():
        if not getattr(cfg, key):
            raise ConfigError(f"{key}: required (--{key.replace('_', '-')} {what})")

