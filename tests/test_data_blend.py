"""`data.sources`: datasets blended by ratios or counts (seeded, without replacement, provenance kept)."""

import pytest

from longrm_jax.data import synthetic
from longrm_jax.data.blend import BlendSource, blend
from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training.config import load_config
from longrm_jax.training.data_source import train_records


def test_blend_ratios_and_counts():
    data = {"a": list(range(10)), "b": list(range(100, 120)), "c": list(range(200, 203))}
    sources = [BlendSource("a", ratio=0.5), BlendSource("b", count=4), BlendSource("c", count=99)]
    out = blend(sources, data.__getitem__, seed=1)
    a, b, c = out[:5], out[5:9], out[9:]
    assert len(out) == 12 and len(set(a)) == 5 and set(a) <= set(data["a"]) and a == sorted(a)
    assert set(b) <= set(data["b"]) and c == data["c"]  # a count above the size takes everything
    assert blend(sources, data.__getitem__, seed=1) == out and blend(sources, data.__getitem__, seed=2) != out


@pytest.mark.parametrize("entry, message", [
    ({"ratio": 0.5}, "mapping with 'path'"), ({"path": "x", "ratio": 1.5}, r"ratio must be in \(0, 1\]"),
    ({"path": "x", "ratio": 0.5, "count": 3}, "not both"), ({"path": "x", "weight": 2}, "unknown keys"),
    ({"path": "x", "count": -1}, "non-negative integer")])
def test_bad_entries_name_the_entry(entry, message):
    with pytest.raises(ValueError, match=message):
        BlendSource.parse(entry, "data.sources[1]")


def test_training_reads_blended_sources(tmp_path):
    one = synthetic.write_training_files(str(tmp_path / "one"), 8, 2, seed=0, lengths=(20,))
    two = synthetic.write_training_files(str(tmp_path / "two"), 6, 2, seed=1, lengths=(20,))
    cfg = load_config(None, ["stage=simpo", f"data.sources=[{{path: {one['train']}, ratio: 0.5}}, "
                             f"{{path: {two['train']}, count: 2}}]"], base=DEFAULT_CONFIG)
    records = train_records(cfg)
    assert len(records) == 6
    assert [r.provenance.source for r in records] == [one["train"]] * 4 + [two["train"]] * 2
