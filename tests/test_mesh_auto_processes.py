"""mesh: auto in a multi-process run: each process plans on its own, and they must agree before the first
collective (training.mesh_plan.same_choice_everywhere). The gather is faked here; tests/test_training_multiprocess
runs real processes."""

import numpy as np
import pytest

from longrm_jax.cli_support import InputError
from longrm_jax.training import mesh_plan


def _fake_processes(monkeypatch, rows):
    from jax.experimental import multihost_utils

    monkeypatch.setattr(mesh_plan.jax, "process_count", lambda: len(rows))
    monkeypatch.setattr(multihost_utils, "process_allgather", lambda mine: np.array(rows, np.int32))


def test_one_process_has_nothing_to_agree_on():
    mesh_plan.same_choice_everywhere({"seq": 4})


def test_processes_that_agree_go_on(monkeypatch):
    _fake_processes(monkeypatch, [[1, 1, 4, 1]] * 2)
    mesh_plan.same_choice_everywhere({"data": 1, "fsdp": 1, "seq": 4, "tensor": 1})


def test_processes_that_disagree_all_stop_with_both_choices(monkeypatch):
    _fake_processes(monkeypatch, [[1, 1, 4, 1], [1, 4, 1, 1]])
    with pytest.raises(InputError, match=r"2 processes chose different meshes \(fsdp=4; seq=4\)"):
        mesh_plan.same_choice_everywhere({"data": 1, "fsdp": 1, "seq": 4, "tensor": 1})
