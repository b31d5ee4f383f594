"""A CLI's flags from a YAML file and ``--set KEY=VALUE``: the config format of ``train`` for ``evaluate`` and
``export``, whose settings are their flags.

``--config FILE`` names a YAML mapping of flag names (``max_new_tokens: 512`` or ``max-new-tokens: 512``);
``--set KEY=VALUE`` (repeatable, the value parsed as YAML) adds to or replaces its keys. Flags given on the command
line win over both. Every key must be one of the parser's flags (an unknown key is refused naming the file and
listing the valid keys), and every value passes the flag's own type check, so a value in a file means exactly
what the same flag on the command line means. A ``true`` switch is the flag given, ``false`` the flag left out.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from longrm_jax.cli_support import InputError

CONFIG_DEST, SET_DEST = "config_file", "config_sets"


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--set KEY=VALUE`` on ``parser`` (read by :func:`parse_with_config`)."""
    parser.add_argument("--config", dest=CONFIG_DEST, default=None, metavar="FILE",
                        help="YAML file of this command's flags by name (e.g. max_new_tokens: 512); flags on the "
                             "command line win over it")
    parser.add_argument("--set", dest=SET_DEST, action="append", default=[], metavar="KEY=VALUE",
                        help="one flag's value by name, as in --config's file (value parsed as YAML); repeatable")


def parse_with_config(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with the flags of ``--config`` / ``--set`` placed before the command line's."""
    # A parser of these two flags alone reads them first: the command's own may require flags the file gives.
    pre = argparse.ArgumentParser(add_help=False)
    add_config_flags(pre)
    first, _ = pre.parse_known_args(argv)
    settings, source = _settings(getattr(first, CONFIG_DEST), getattr(first, SET_DEST))
    if not settings:
        return parser.parse_args(argv)
    return parser.parse_args([*_as_flags(parser, settings, source), *(argv if argv is not None else [])])


def yaml_error_line(path: str | Path, error: Exception) -> str:
    """A YAML parse error as one line naming the file, line and column (PyYAML's own text spans several lines
    and quotes the source)."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    return f"{where}: invalid YAML: {problem}" + (f" ({context})" if context else "")


def _settings(path: str | None, sets: Sequence[str]) -> tuple[dict, str]:
    """(flag name -> value, where they come from) of the file and the ``--set`` assignments, in that order."""
    settings: dict[str, Any] = {}
    source = "--set"
    if path:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise InputError(f"--config {path}: cannot read it: {e}") from None
        except yaml.YAMLError as e:
            raise InputError(yaml_error_line(path, e)) from None
        if not isinstance(loaded, dict):
            raise InputError(f"{path}: the top level must be a mapping of flag names to values")
        settings.update(loaded)
        source += " + --set" if sets else ""
    for assignment in sets:
        key, eq, raw = assignment.partition("=")
        if not eq or not key.strip():
            raise InputError(f"--set {assignment!r}: expected KEY=VALUE")
        settings[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
    return settings, source


def _flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's settable flags by name (``dest``), help and the config flags themselves left out."""
    skip = {"help", CONFIG_DEST, SET_DEST}
    return {a.dest: a for a in parser._actions  # noqa: SLF001 - argparse lists its actions only here
            if a.option_strings and a.dest not in skip and a.help != argparse.SUPPRESS}


def _as_flags(parser: argparse.ArgumentParser, settings: dict, source: str) -> list[str]:
    """The command-line words that say what ``settings`` says, each value checked by its flag's type."""
    actions = _flag_actions(parser)
    words: list[str] = []
    for key, value in settings.items():
        action = actions.get(str(key).replace("-", "_"))
        if action is None:
            raise InputError(f"{source}: unknown key {key!r}; valid keys: {', '.join(sorted(actions))}")
        flag = next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
        words += _words(action, flag, value, f"{source}: {key}")
    return words


def _words(action: argparse.Action, flag: str, value: Any, where: str) -> list[str]:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # noqa: SLF001
        if not isinstance(value, bool):
            raise InputError(f"{where}: expected true or false, got {value!r}")
        return [flag] if value == isinstance(action, argparse._StoreTrueAction) else []  # noqa: SLF001
    if value is None:
        return []
    if isinstance(value, dict):  # a mesh: {fsdp: 4, seq: 2} -> fsdp=4,seq=2
        value = ",".join(f"{k}={v}" for k, v in value.items())
    values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if isinstance(value, list) and action.nargs in (None, "?"):
        raise InputError(f"{where}: expected one value, got a list {value!r}")
    for text in values:
        try:
            checked = action.type(text) if callable(action.type) else text
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise InputError(f"{where}: {text!r} is not a valid value ({e or 'wrong type'})") from None
        if action.choices is not None and checked not in action.choices:
            raise InputError(f"{where}: {text!r} is not one of {', '.join(map(str, action.choices))}")
    return [flag, *values]
