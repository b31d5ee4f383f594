"""``--config FILE`` and ``--set KEY=VALUE`` for the evaluate and export CLIs (longrm_jax.flag_files): a file of
flags by name parses to what the same flags on the command line give, the command line wins, and a bad key or
value is refused naming the file and the key."""

import pytest

from longrm_jax.cli_support import InputError
from longrm_jax.evaluation.cli_args import build_parser as evaluate_parser
from longrm_jax.evaluation.cli_args import replica_argv
from longrm_jax.export import build_parser as export_parser
from longrm_jax.flag_files import CONFIG_DEST, SET_DEST, parse_with_config


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    return str(path)


def _without_config(ns) -> dict:
    return {k: v for k, v in vars(ns).items() if k not in (CONFIG_DEST, SET_DEST)}


def test_a_file_of_flags_means_the_same_flags(tmp_path):
    path = _write(tmp_path, "model_path: runs/grm_hf\ndata-path: data/lrb\nmax_new_tokens: 512\nboth_orders: true\n"
                            "is_disrm: false\nmesh: {fsdp: 2, seq: 2}\ntasks: [Cite, Code]\n")
    from_file = parse_with_config(evaluate_parser(), ["--config", path])
    by_hand = evaluate_parser().parse_args(["--model-path", "runs/grm_hf", "--data-path", "data/lrb",
                                            "--max-new-tokens", "512", "--both-orders", "--mesh", "fsdp=2,seq=2",
                                            "--tasks", "Cite", "Code"])
    assert _without_config(from_file) == _without_config(by_hand)
    assert from_file.mesh == {"fsdp": 2, "seq": 2} and from_file.max_new_tokens == 512


def test_the_command_line_wins_over_set_which_wins_over_the_file(tmp_path):
    path = _write(tmp_path, "model_path: m\ndata_path: d\nmax_new_tokens: 512\nseed: 3\n")
    args = parse_with_config(evaluate_parser(), ["--config", path, "--set", "seed=7", "--set", "max_new_tokens=64",
                                                 "--max-new-tokens", "128"])
    assert (args.max_new_tokens, args.seed, args.model_path) == (128, 7, "m")
    only_set = parse_with_config(evaluate_parser(), ["--set", "model_path=m", "--set", "data_path=d"])
    assert (only_set.model_path, only_set.data_path) == ("m", "d")


@pytest.mark.parametrize("text, message", [
    ("model_path: m\nmax_new_tokenz: 5\n", "unknown key 'max_new_tokenz'; valid keys: "),
    ("model_path: m\nmax_new_tokens: many\n", "max_new_tokens: 'many' is not a valid value"),
    ("model_path: m\nboth_orders: 1\n", "both_orders: expected true or false"),
    ("model_path: m\nmesh: {fsdp: 2, pipe: 2}\n", "mesh: 'fsdp=2,pipe=2' is not a valid value"),
    ("- model_path\n", "the top level must be a mapping"),
    ("model_path: [unclosed\n", "invalid YAML"),
])
def test_a_bad_key_or_value_is_refused_naming_the_file(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as e:
        parse_with_config(evaluate_parser(), ["--config", path])
    assert path in str(e.value) and message in str(e.value)


def test_a_set_without_a_value_and_a_missing_file_are_refused(tmp_path):
    with pytest.raises(InputError, match="expected KEY=VALUE"):
        parse_with_config(evaluate_parser(), ["--set", "seed"])
    with pytest.raises(InputError, match="cannot read it"):
        parse_with_config(evaluate_parser(), ["--config", str(tmp_path / "missing.yaml")])


def test_export_reads_its_settings_from_a_file_by_its_schema(tmp_path):
    from longrm_jax.cli_support import InputError as Refused
    from longrm_jax.export import ExportConfig
    from longrm_jax.schema_flags import config_from_args

    path = _write(tmp_path, "checkpoint: runs/x\nout: runs/x_hf\ndtype: bfloat16\noverwrite: true\n")
    cfg = config_from_args(export_parser().parse_args(["--config", path]), ExportConfig)
    assert (cfg.checkpoint, cfg.out, cfg.dtype, cfg.overwrite) == ("runs/x", "runs/x_hf", "bfloat16", True)
    flags_win = config_from_args(export_parser().parse_args(["--config", path, "--out", "o", "--no-overwrite"]),
                                 ExportConfig)
    assert (flags_win.out, flags_win.overwrite) == ("o", False)
    with pytest.raises(Refused, match="float32, bfloat16 or float16"):
        config_from_args(export_parser().parse_args(["--config", path, "--set", "dtype=int8"]), ExportConfig)


def test_replicas_get_the_flags_not_the_file(tmp_path):
    """A replica process is started with the parent's flags as read, not with --config / --set again."""
    path = _write(tmp_path, "model_path: m\ndata_path: d\nmax_new_tokens: 512\n")
    parser = evaluate_parser()
    args = parse_with_config(parser, ["--config", path, "--set", "seed=7"])
    argv = replica_argv(parser, args)("/tmp/r0", "/tmp/r0/samples.jsonl")
    assert "--config" not in argv and "--set" not in argv
    assert argv[argv.index("--max-new-tokens") + 1] == "512" and argv[argv.index("--seed") + 1] == "7"
