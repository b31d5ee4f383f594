"""Several training datasets blended into one, by ratios or counts (upstream's blended datasets).

Each source is a dataset path with either a `ratio` in (0, 1] (that fraction of its rows, rounded) or a `count`
(that many rows, at most all of them); neither means all rows. The rows are drawn without replacement, seeded,
kept in their file order within a source, and the sources are concatenated in the order given (the training
pipeline shuffles afterwards). Records keep their own provenance (file and row), so errors still name them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class BlendSource:
    path: str
    ratio: float | None = None
    count: int | None = None

    @classmethod
    def parse(cls, entry: Any, where: str) -> BlendSource:
        """From a config entry: a path string or a mapping {path, ratio | count}; errors name `where`."""
        if isinstance(entry, str):
            return cls(entry)
        if not isinstance(entry, dict) or "path" not in entry:
            raise ValueError(f"{where}: expected a path or a mapping with 'path' (and 'ratio' or 'count'), "
                             f"got {entry!r}")
        unknown = set(entry) - {"path", "ratio", "count"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; valid: path, ratio, count")
        ratio, count = entry.get("ratio"), entry.get("count")
        if ratio is not None and count is not None:
            raise ValueError(f"{where}: give 'ratio' or 'count', not both")
        if ratio is not None and not (isinstance(ratio, (int, float)) and 0 < ratio <= 1):
            raise ValueError(f"{where}: ratio must be in (0, 1], got {ratio!r}")
        if count is not None and not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
            raise ValueError(f"{where}: count must be a non-negative integer, got {count!r}")
        return cls(str(entry["path"]), None if ratio is None else float(ratio), count)

    def take(self, available: int) -> int:
        if self.ratio is not None:
            return int(round(available * self.ratio))
        if self.count is not None:
            return min(available, self.count)
        return available


def blend(sources: Sequence[BlendSource], records_of, seed: int = 0) -> list:
    """Concatenated sampled records of every source; `records_of(path)` returns a source's records (a list)."""
    out = []
    for i, source in enumerate(sources):
        records = records_of(source.path)
        n = source.take(len(records))
        if n == len(records):
            out.extend(records)
            continue
        picked = np.sort(np.random.default_rng([seed, i]).choice(len(records), n, replace=False))
        out.extend(records[int(j)] for j in picked)
    return out
