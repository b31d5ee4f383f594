"""Command-line flags generated from a config schema (a dataclass of the kind of ``training.config_schema``):
one ``--key`` per field (``--model-path`` for ``model_path``; booleans also ``--no-key``), its help the field's
comment, beside ``--config FILE`` (YAML) and ``--set KEY=VALUE``. All three are read by one loader
(``training.config.load_config``): the file first, then each ``--set``, then the flags given, so the command line
wins; every value passes the field's declared type, range and choices, and an error names the key."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import io
import re
import textwrap
import tokenize
import typing

from longrm_jax.training.config import ConfigError, load_config
from longrm_jax.config_rules import RULE

# Words whose period ends no sentence.
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def first_sentence(text: str) -> str:
    """``text`` up to the end of its first sentence: a period followed by a space, outside parentheses and
    brackets, that ends no abbreviation (e.g., i.e.)."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if char == "." and depth <= 0 and text[i + 1:i + 2] == " " and not text[:i + 1].endswith(_ABBREVIATIONS):
            return text[:i + 1]
    return text


def field_comments(cls: type) -> dict[str, str]:
    """Each field of the dataclass ``cls`` and its comment in the source, its lines joined: the block of comment
    lines right above the field, else the comment at the end of its line(s)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {}  # line number -> (text, whether the comment is the whole line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            comments[row] = (token.string.lstrip("#").strip(), not lines[row - 1][:col].strip())
    out = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        block, row = [], node.lineno - 1
        while comments.get(row, ("", False))[1]:
            block.insert(0, comments[row][0])
            row -= 1
        beside = [comments[r][0] for r in range(node.lineno, node.end_lineno + 1)
                  if r in comments and not comments[r][1]]
        out[node.target.id] = " ".join(block or beside)
    return out


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


class _Given(argparse.Action):
    """Stores the value and notes that the flag was given (its default only shows in --help)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.__dict__.setdefault("given_flags", set()).add(self.dest)


class _GivenSwitch(argparse.BooleanOptionalAction):
    """``--key`` / ``--no-key``, noting that it was given."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.__dict__.setdefault("given_flags", set()).add(self.dest)


def add_schema_flags(parser: argparse.ArgumentParser, schema: type) -> None:
    """``--config``, ``--set`` and one flag per field of the flat dataclass ``schema``: its help the field's
    comment, its default shown. A list field takes one or more values (``--tasks Cite Code``); a bool field is
    ``--key`` / ``--no-key``. The schema may group its flags (``FLAG_GROUPS``: a group's title -> the field that
    opens it, in field order), hide some from ``--help`` (``HIDDEN``: settings a parent process passes) and name
    what a flag takes (``METAVARS``: field -> e.g. ``DIR``)."""
    parser.add_argument("--config", metavar="FILE", help="a YAML file of settings (keys: the flags' names with _)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="one setting, as in the YAML file (repeatable); the flags below win over both")
    comments = field_comments(schema)
    hints = typing.get_type_hints(schema)
    openers = {field: title for title, field in getattr(schema, "FLAG_GROUPS", {}).items()}
    hidden = set(getattr(schema, "HIDDEN", ()))
    metavars = getattr(schema, "METAVARS", {})
    target = parser
    for f in dataclasses.fields(schema):
        if f.name in openers:
            target = parser.add_argument_group(openers[f.name])
        tp = hints[f.name]
        rule = f.metadata.get(RULE)
        help_text = comments.get(f.name, "") or f.name
        words = getattr(rule, "values", None)
        words = tuple(v for v in words if v is not None) if words else None
        words = words if words and all(isinstance(v, str) for v in words) else None
        if rule is not None and words is None:
            help_text += f" ({rule.want})"
        help_text = argparse.SUPPRESS if f.name in hidden else help_text.replace("%", "%%")
        default = f.default if f.default is not dataclasses.MISSING else None
        if tp is bool:
            target.add_argument(flag_name(f.name), dest=f.name, action=_GivenSwitch, default=default, help=help_text)
            continue
        listed = list in (typing.get_origin(tp), *map(typing.get_origin, typing.get_args(tp)))
        numeric = tp in (int, float) or typing.get_args(tp)[:1] in ((int,), (float,))
        # A choice of words is argparse's own on the command line (its usage line lists them).
        target.add_argument(flag_name(f.name), dest=f.name, action=_Given, default=default, choices=words,
                            nargs="+" if listed else None, help=help_text,
                            metavar=None if words else metavars.get(f.name, "N" if numeric else "VALUE"))


def _as_yaml(value, declared) -> str:
    """A flag's value as the YAML that means it: a word for a field that takes a string stays that string (quoted:
    YAML would read `false`, `off` or `null` as something else), a number's word is read as YAML, a list or a
    switch as JSON."""
    if not isinstance(value, str):
        return json.dumps(value)
    takes_text = declared is str or str in typing.get_args(declared)
    return json.dumps(value) if takes_text else value


def config_from_args(args: argparse.Namespace, schema: type):
    """The validated config of ``schema``: ``--config``, then ``--set``, then the flags given (a number read as
    YAML, as ``--set`` reads it; a word for a text setting as that text)."""
    given = getattr(args, "given_flags", set())
    hints = typing.get_type_hints(schema)
    flags = [f"{f.name}={_as_yaml(getattr(args, f.name), hints[f.name])}" for f in dataclasses.fields(schema)
             if f.name in given]
    try:
        return load_config(args.config, list(args.overrides) + flags, schema=schema)
    except ConfigError as error:  # a value the command line gave is named by its flag
        message = str(error)
        for name in given:  # "SOURCE: key must be ..." -> "--key must be ..."
            found = re.search(rf"(?:^|: ){name}(?=[ :])", message)
            if found:
                raise ConfigError(flag_name(name) + message[found.end():]) from None
        if args.config is None:  # no file: the loader's name for the settings ("config + --set") names nothing given
            raise ConfigError(re.sub(r"^config( \+ --set)?: ", "", message)) from None
        raise
