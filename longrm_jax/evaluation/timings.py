"""An evaluation run's phase seconds and counts (``timings.json``, and ``results.json``'s ``"timings"``).

Each part of a run returns its own :class:`Timings` with its results (the DisRM scorer's, a GRM generator call's,
the replicas' merged record), and the runner adds them up: nothing is accumulated on the run's config."""

from __future__ import annotations

from collections.abc import Mapping


class Timings:
    """Phase seconds and token counts, added up by :meth:`add`: ``max_*`` keys keep the largest value, dict values
    (the slot plan) merge, the others sum."""

    def __init__(self, values: Mapping | None = None):
        self._values: dict = {}
        if values:
            self.add(values)

    def add(self, other: Mapping | Timings) -> Timings:
        """Add ``other``'s phases to these; returns self."""
        for key, value in (other.as_dict() if isinstance(other, Timings) else other).items():
            if isinstance(value, Mapping):
                self._values[key] = {**self._values.get(key, {}), **value}
            elif key.startswith("max_"):
                self._values[key] = max(self._values.get(key, 0), value)
            else:
                self._values[key] = self._values.get(key, 0) + value
        return self

    def set(self, **values) -> Timings:
        """Record values as they are (totals, a nested run's record, the device name); returns self."""
        self._values.update({k: v.as_dict() if isinstance(v, Timings) else v for k, v in values.items()})
        return self

    def get(self, key: str, default=None):
        return self._values.get(key, default)

    def __getitem__(self, key: str):
        return self._values[key]

    def as_dict(self) -> dict:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"Timings({self._values!r})"
