"""docs/config.md is generated from the config dataclasses and the CLIs' parsers (longrm_jax.config_reference):
the checked-in file is current, names every key, and each range or choice it lists is one validate enforces."""

import re

import pytest

from longrm_jax import config_reference
from longrm_jax.training.config import ConfigError, load_config
from longrm_jax.config_rules import Choice, Range, declared_rules, leaf_fields
from longrm_jax.training.config_schema import TrainConfig

RULES = declared_rules(TrainConfig)


def test_checked_in_reference_is_current():
    assert config_reference.DOC.read_text(encoding="utf-8") == config_reference.reference(), (
        f"docs/config.md is stale: run `{config_reference.REGENERATE}` and commit the result")


def test_every_key_is_listed_with_a_meaning():
    text = config_reference.DOC.read_text(encoding="utf-8")
    rows = {row["key"]: row for prefix, cls in config_reference.config_sections()
            for row in config_reference.config_rows(prefix, cls)}
    for key, _, _ in leaf_fields(TrainConfig):
        assert f"| `{key}` |" in text, key
        assert rows[key]["meaning"], f"{key} has no comment in the source to take its meaning from"
    for prefix, cls in config_reference.config_sections():
        assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("), f"{cls.__name__} has no docstring"


def test_every_cli_flag_is_listed():
    text = config_reference.DOC.read_text(encoding="utf-8")
    for parser in config_reference.cli_parsers():
        assert f"## `{parser.prog}`" in text
        for _, rows in config_reference.flag_rows(parser):
            for row in rows:
                assert f"| `{row['flag']}` |" in text and row["meaning"], (parser.prog, row["flag"])


def test_help_and_check_run(capsys):
    with pytest.raises(SystemExit) as exit_:
        config_reference.main(["--help"])
    assert exit_.value.code == 0 and "docs/config.md" in capsys.readouterr().out
    assert config_reference.main(["--check"]) == 0


@pytest.mark.parametrize("text, first", [
    ("One. Two.", "One."),
    ("Named ModelConfig, e.g. \"tiny_qwen3\". More.", "Named ModelConfig, e.g. \"tiny_qwen3\"."),
    ("Size (0: whole rows. Or not). Next.", "Size (0: whole rows. Or not)."),
    ("no period at all", "no period at all"),
    ("seq_len / 2^k; 1.5 tokens", "seq_len / 2^k; 1.5 tokens"),
])
def test_first_sentence(text, first):
    assert config_reference.first_sentence(text) == first


def _outside(rule) -> list:
    """Values just outside ``rule``: below and above a range's bounds, or a name no choice has."""
    if isinstance(rule, Choice):
        return ["not_a_choice"]
    below = rule.lo - 1 if rule.lo_closed else rule.lo
    out = [below if below != rule.also else below - 1]
    if rule.hi is not None:
        out.append(rule.hi + 1 if rule.hi_closed else rule.hi)
    return [int(v) if float(v).is_integer() else v for v in out]


CASES = [(key, rule, value) for key, rule in RULES for value in _outside(rule)]


def test_rules_are_declared():
    assert len(RULES) >= 50 and all(isinstance(rule, (Range, Choice)) for _, rule in RULES)
    assert {"stage", "optim.lr", "mesh.seq", "lora.base_dtype", "checkpoint.on_corrupt"} <= dict(RULES).keys()


@pytest.mark.parametrize("key, rule, value", CASES, ids=[f"{k}={v}" for k, _, v in CASES])
def test_each_declared_rule_is_enforced(key, rule, value):
    with pytest.raises(ConfigError, match=rf"^config \+ --set: {re.escape(key)} must be {re.escape(rule.want)}; "
                                          r"got "):
        load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize("key, rule", RULES, ids=[k for k, _ in RULES])
def test_each_declared_bound_is_accepted(key, rule):
    """The values at a rule's closed ends (and a range's extra value, a nullable key's null) pass validate."""
    if isinstance(rule, Choice):
        inside = ["null" if v is None else f'"{v}"' for v in rule.values]  # quoted: YAML reads a bare on as true
    else:
        ends = (rule.lo if rule.lo_closed else None, rule.hi if rule.hi_closed else None, rule.also)
        inside = [int(v) if float(v).is_integer() else v for v in ends if v is not None]
    for value in inside:
        load_config(None, _compatible(key, value))


def _compatible(key: str, value) -> list[str]:
    """``key=value`` with what the rest of the default config needs for it to validate (cross-key checks)."""
    extra = {'model.head="causal_lm"': ["stage=sft"], "data.num_rejects=0": ["stage=sft"]}
    return [*extra.get(f"{key}={value}", []), f"{key}={value}"]
