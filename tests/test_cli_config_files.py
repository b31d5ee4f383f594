"""``--config FILE`` and ``--set KEY=VALUE`` for the evaluate and export CLIs, read by their schemas
(``longrm_jax.schema_flags``): a file of settings by name parses to what the same flags on the command line give,
the command line wins over ``--set``, which wins over the file, a bad key or value is refused naming the file and
the key, and a replica process gets its parent's settings as a file."""

import dataclasses

import pytest
import yaml

from longrm_jax.cli_support import InputError
from longrm_jax.evaluate import build_parser, read_config
from longrm_jax.evaluation.config import EvalConfig
from longrm_jax.evaluation.replicas import replica_config
from longrm_jax.evaluation.samples import EvalSample
from longrm_jax.export import build_parser as export_parser


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    return str(path)


def test_a_file_of_settings_means_the_same_flags(tmp_path):
    path = _write(tmp_path, "model_path: runs/grm_hf\ndata_path: data/lrb\nmax_new_tokens: 512\nboth_orders: true\n"
                            "is_disrm: false\nmesh: {fsdp: 2, seq: 2}\ntasks: [Cite, Code]\nprogress: false\n")
    from_file = read_config(["--config", path])
    by_hand = read_config(["--model-path", "runs/grm_hf", "--data-path", "data/lrb", "--max-new-tokens", "512",
                           "--both-orders", "--mesh", "fsdp=2,seq=2", "--tasks", "Cite", "Code", "--no-progress"])
    assert from_file == by_hand
    assert from_file.mesh == {"fsdp": 2, "seq": 2} and from_file.max_new_tokens == 512
    assert from_file.tasks == ["Cite", "Code"] and from_file.progress is False
    assert read_config(["--config", path, "--no-truncate"]).max_length is None


def test_a_word_on_the_command_line_means_that_word():
    """YAML reads `off`, `false` or `null` as something else: a flag's word for a text setting stays that word, a
    number's word is still a number."""
    cfg = read_config(["--model-path", "false", "--data-path", "null", "--compilation-cache", "off", "--replicas", "2",
                       "--max-new-tokens", "64"])
    assert (cfg.model_path, cfg.data_path, cfg.compilation_cache, cfg.replicas) == ("false", "null", "off", "2")
    assert cfg.max_new_tokens == 64
    from longrm_jax.data.inspect_data import InspectConfig, build_parser as inspect_parser
    from longrm_jax.schema_flags import config_from_args

    inspect = config_from_args(inspect_parser().parse_args(["--data", "d", "--tokenizer", "t", "--enable-thinking",
                                                            "false"]), InspectConfig)
    assert inspect.enable_thinking == "false"


def test_the_command_line_wins_over_set_which_wins_over_the_file(tmp_path):
    path = _write(tmp_path, "model_path: m\ndata_path: d\nmax_new_tokens: 512\nseed: 3\n")
    cfg = read_config(["--config", path, "--set", "seed=7", "--set", "max_new_tokens=64", "--max-new-tokens", "128"])
    assert (cfg.max_new_tokens, cfg.seed, cfg.model_path) == (128, 7, "m")
    only_set = read_config(["--set", "model_path=m", "--set", "data_path=d"])
    assert (only_set.model_path, only_set.data_path) == ("m", "d")


@pytest.mark.parametrize("text, message", [
    ("model_path: m\nmax_new_tokenz: 5\n", "unknown key 'max_new_tokenz'; valid keys: "),
    ("model_path: m\nmax_new_tokens: many\n", "max_new_tokens: expected an integer, got 'many'"),
    ("model_path: m\nboth_orders: 1\n", "both_orders: expected true/false, got 1"),
    ("model_path: m\ndata_path: d\nmesh: {fsdp: 2, pipe: 2}\n", "mesh: unknown axis 'pipe'"),
    ("model_path: m\ndata_path: d\nmax_length: 8\n", "max_length must be >= 16; got 8"),
    ("model_path: m\ndata_path: d\ntask_types: [PairWise, Pointwise]\n", "task_types must name PairWise or BestOfN"),
    ("- model_path\n", "top level must be a mapping"),
    ("model_path: [unclosed\n", "invalid YAML"),
])
def test_a_bad_key_or_value_is_refused_naming_the_file(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as e:
        read_config(["--config", path])
    assert path in str(e.value) and message in str(e.value)


def test_what_is_missing_or_does_not_go_together_is_refused():
    with pytest.raises(InputError, match=r"^--set 'seed': expected key=value"):
        read_config(["--model-path", "m", "--data-path", "d", "--set", "seed"])
    with pytest.raises(InputError, match=r"^model_path: required \(--model-path DIR"):
        read_config(["--data-path", "d"])
    with pytest.raises(InputError, match=r"^data_path: required"):
        read_config(["--model-path", "m"])
    with pytest.raises(InputError, match="^--compile-only and --topology go together"):
        read_config(["--model-path", "m", "--compile-only"])
    assert read_config(["--model-path", "qwen3_8b", "--compile-only", "--topology", "h100x8"]).data_path is None


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(InputError, match="cannot read config"):
        read_config(["--config", str(tmp_path / "missing.yaml")])


def test_export_reads_its_settings_from_a_file_by_its_schema(tmp_path):
    from longrm_jax.export import ExportConfig
    from longrm_jax.schema_flags import config_from_args

    path = _write(tmp_path, "checkpoint: runs/x\nout: runs/x_hf\ndtype: bfloat16\noverwrite: true\n")
    cfg = config_from_args(export_parser().parse_args(["--config", path]), ExportConfig)
    assert (cfg.checkpoint, cfg.out, cfg.dtype, cfg.overwrite) == ("runs/x", "runs/x_hf", "bfloat16", True)
    flags_win = config_from_args(export_parser().parse_args(["--config", path, "--out", "o", "--no-overwrite"]),
                                 ExportConfig)
    assert (flags_win.out, flags_win.overwrite) == ("o", False)
    with pytest.raises(InputError, match="float32, bfloat16 or float16"):
        config_from_args(export_parser().parse_args(["--config", path, "--set", "dtype=int8"]), ExportConfig)


def test_a_replica_reads_back_its_parents_settings_for_its_share(tmp_path):
    """A replica process is started with ``--config`` its settings: the parent's, read back as they were, with its
    own share, save path and one process."""
    path = _write(tmp_path, "model_path: m\ndata_path: d\nmax_new_tokens: 512\nmesh: fsdp=-1\n")
    parent = read_config(["--config", path, "--set", "seed=7", "--no-truncate", "--resume"])
    share = [EvalSample(id=i, task="Code", tasktype="PairWise", subtype="2", length="8k", answers=["a", "b"],
                        shown_order=[0, 1], file="Code.jsonl", row=i + 1, prompt_template=[], index=i)
             for i in range(3)]
    child = replica_config(parent, str(tmp_path / "r0"), share)
    written = tmp_path / "r0.yaml"
    written.write_text(yaml.safe_dump(child.to_dict(), sort_keys=False))
    again = read_config(["--config", str(written)])
    assert again == child
    assert again.only_samples == [s.where for s in share] and again.replicas == "1" and again.resume
    assert dataclasses.replace(again, save_path=parent.save_path, only_samples=None, replicas=parent.replicas,
                               progress=True, allow_no_verdicts=False) == parent
    assert (again.seed, again.max_new_tokens, again.max_length, again.mesh) == (7, 512, None, {"fsdp": -1})
    assert "only_samples" in EvalConfig.HIDDEN and "--only-samples" not in build_parser().format_help()
