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
    """``--config``, ``--set`` and one flag per field of the flat dataclass ``schema`` (its default shown)."""
    parser.add_argument("--config", metavar="FILE", help="a YAML file of settings (keys: the flags' names with _)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="one setting, as in the YAML file (repeatable); the flags below win over both")
    comments = field_comments(schema)
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        rule = f.metadata.get(RULE)
        help_text = first_sentence(comments.get(f.name, "")) or f.name
        if rule is not None:
            help_text += f" ({rule.want})"
        default = f.default if f.default is not dataclasses.MISSING else None
        if tp is bool:
            parser.add_argument(flag_name(f.name), dest=f.name, action=_GivenSwitch, default=default, help=help_text)
        else:
            numeric = tp in (int, float) or typing.get_args(tp)[:1] in ((int,), (float,))
            # A choice of words is argparse's own on the command line (its usage line lists them).
            words = getattr(rule, "values", None)
            words = tuple(v for v in words if v is not None) if words else None
            if words and all(isinstance(v, str) for v in words):
                parser.add_argument(flag_name(f.name), dest=f.name, action=_Given, default=default, choices=words,
                                    help=first_sentence(comments.get(f.name, "")) or f.name)
                continue
            parser.add_argument(flag_name(f.name), dest=f.name, action=_Given, default=default,
                                metavar="N" if numeric else "VALUE", help=help_text)


def config_from_args(args: argparse.Namespace, schema: type):
    """The validated config of ``schema``: ``--config``, then ``--set``, then the flags given (read as YAML
    values the way ``--set`` reads them)."""
    given = getattr(args, "given_flags", set())
    flags = [f"{f.name}={getattr(args, f.name)}" for f in dataclasses.fields(schema) if f.name in given]
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
