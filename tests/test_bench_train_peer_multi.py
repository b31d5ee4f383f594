"""scripts/bench_train.py's PyTorch peer on several GPUs (issue 40 item 7), run on the CPU: two processes started
by the script's own launcher (gloo), the tiny Qwen3 shapes, FSDP2 fully_shard per decoder layer and at the root.
One step of the two ranks, each on its own pair, must be one process's step on both pairs at the mean loss:
each rank's first loss is the single-process peer's loss on its pair, the gradients FSDP reduce-scatters are
that process's mean-loss gradients, and the second losses are that process's after its AdamW step."""

import os
import sys
import time

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTH = 128


@pytest.mark.slow
def test_two_rank_fsdp2_peer_step_equals_one_process_on_both_pairs(tmp_path, monkeypatch):
    import _torch_peer
    import bench_train

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    dump = tmp_path / "grads.pt"
    flags = ["--smoke", "--models", "qwen3_8b", "--stages", "simpo", "--full-params", "--steps", "1",
             "--warmup", "0"]
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "bench_train.py"), *flags, "--peer-dump", str(dump),
           "--one", f"qwen3_8b,simpo,{LENGTH},2"]
    t0 = time.perf_counter()
    res = _torch_peer.run_peer_ranks(cmd, 2, timeout=240)
    launched_s = time.perf_counter() - t0
    assert "skipped" not in res, res
    # The node's figures: two pairs a step, the slowest rank's step time, a row label saying what ran.
    assert res["devices"] == 2 and res["tokens_per_s"] == pytest.approx(2 * res["tokens_per_s_per_gpu"])
    assert res["tokens_per_s_per_gpu"] == pytest.approx(2 * LENGTH / res["step_s"])
    assert "FSDP2 over 2 GPUs (2 layers + root)" in res["trains"], res["trains"]
    got = torch.load(dump)
    assert [len(x) for x in got["losses"]] == [2, 2]

    # One process, the same weights (seed 0), both ranks' pairs (seeds 0 and 1), the peer's own functions.
    args = bench_train.parse_args(flags)
    peer = _torch_peer.build_peer("qwen3_8b", "simpo", args, "cpu")
    net, head = peer["net"], peer["head"]
    opt = _torch_peer.make_optimizer(net)
    pairs = [_torch_peer.pair_tensors(LENGTH, peer["mcfg"].vocab_size, "cpu", seed=r) for r in range(2)]
    first = [_torch_peer.peer_loss(net, head, *p) for p in pairs]
    ((first[0] + first[1]) / 2).backward()
    want = {k: p.grad.detach().clone() for k, p in net.named_parameters() if p.grad is not None}
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    with torch.no_grad():
        second = [float(_torch_peer.peer_loss(net, head, *p)) for p in pairs]

    for r in range(2):
        np.testing.assert_allclose(got["losses"][r], [first[r].item(), second[r]], rtol=2e-6, err_msg=f"rank {r}")
    # The ranks' pairs differ, and the step moved the losses by far more than the tolerance.
    assert abs(got["losses"][0][0] - got["losses"][1][0]) > 1e-3
    assert all(abs(x[1] - x[0]) > 1e-5 for x in got["losses"])
    assert sorted(got["grads"]) == sorted(want), (sorted(got["grads"]), sorted(want))
    for k, g in want.items():
        np.testing.assert_allclose(got["grads"][k].numpy(), g.numpy(), rtol=1e-4, atol=1e-7, err_msg=k)

    # The one-process peer of the script (bench_torch, pair seed 0) starts from rank 0's first loss.
    single = bench_train.bench_torch("qwen3_8b", "simpo", LENGTH, args)
    assert single["losses"][0] == pytest.approx(got["losses"][0][0], rel=2e-6)
    print(f"2-rank peer: {launched_s:.1f} s")


def test_table_sets_ours_against_the_peer_per_gpu():
    import bench_train

    rows = [{"side": "jax", "model": "M", "stage": "simpo", "length": 8, "devices": 1, "tokens_per_s_per_gpu": 130.0},
            {"side": "jax", "model": "M", "stage": "simpo", "length": 8, "devices": 4, "mesh": "fsdp",
             "tokens_per_s_per_gpu": 120.0},
            {"side": "jax", "model": "M", "stage": "simpo", "length": 8, "devices": 4, "mesh": "seq",
             "tokens_per_s_per_gpu": 90.0},
            {"side": "pytorch", "model": "M", "stage": "simpo", "length": 8, "devices": 1, "tokens_per_s_per_gpu": 100.0},
            {"side": "pytorch", "model": "M", "stage": "simpo", "length": 8, "devices": 4, "tokens_per_s_per_gpu": 80.0}]
    assert bench_train.peer_ratios(rows) == [1.3, 1.5, None, None, None]
    # A JAX run of --mesh fsdp trains a pair per device: n pairs a step over mesh.fsdp=n.
    args = bench_train.parse_args(["--mesh", "fsdp"])
    cmd = " ".join(bench_train.train_command("qwen3_8b", "simpo", 32768, 4, args, "/tmp/x"))
    assert "mesh.fsdp=4" in cmd and "mesh.seq=1" in cmd and "data.batch_rows=8" in cmd
    seq = " ".join(bench_train.train_command("qwen3_8b", "simpo", 32768, 4, bench_train.parse_args([]), "/tmp/x"))
    assert "mesh.fsdp=1" in seq and "mesh.seq=4" in seq and "data.batch_rows=2" in seq


def test_a_failed_rank_stops_the_others():
    """A rank that fails (an out-of-memory error) exits at once with its RESULT; the launcher stops the ranks still
    waiting in a collective and returns the failed rank's reason, well before their own end."""
    import _torch_peer

    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '1':\n"
            "    print('RESULT {\"skipped\": \"OutOfMemoryError: CUDA out of memory\"}', flush=True)\n"
            "    sys.exit(1)\n"
            "time.sleep(60)\n")
    t0 = time.perf_counter()
    res = _torch_peer.run_peer_ranks([sys.executable, "-c", code], 3)
    assert res == {"skipped": "OutOfMemoryError: CUDA out of memory"}
    assert time.perf_counter() - t0 < 20
    res = _torch_peer.run_peer_ranks([sys.executable, "-c", "import time; time.sleep(60)"], 2, timeout=1)
    assert res["skipped"].startswith("peer rank 0 of 2 timed out after 1 s"), res
