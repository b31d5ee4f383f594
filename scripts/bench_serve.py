"""The reward server under RL-style load against offline scoring of the same rows.

``python scripts/bench_serve.py [--kind disrm|grm] [--model-path DIR | --preset tiny_qwen3] [--clients 64]
[--seconds 60]``

A DisRM (``--kind disrm``, the default):

1. Rows: ``--rows`` (prompt, response) pairs of about ``--tokens`` tokens each.
2. Offline peer: ``python -m longrm_jax.score`` on the rows once and on ``--repeat`` copies of them; the difference
   of the two wall times over the difference of rows is its steady throughput (load and compile cancel out).
3. The server: ``python -m longrm_jax.serve --is-disrm`` started on 127.0.0.1, each row posted once to warm it up,
   then ``--clients`` concurrent connections each post one sample per request to ``/score`` (the sequence
   ``score`` scores) for ``--seconds``, a bounded loop that stops by itself. Reported: requests, failures, rows/s,
   its share of the peer's rows/s, latency p50 / p99.

A generative judge (``--kind grm``): ``--rows`` pairwise Long-RewardBench rows of about ``--tokens`` tokens
(``data.synthetic.write_long_rewardbench``); the peer is ``python -m longrm_jax.evaluate`` on ``--repeat`` copies of
them (its steady samples/s: the samples over its judging seconds after the first calls of each shape, from its
timings.json), the server ``python -m longrm_jax.serve`` whose
clients each post one judge prompt per request to ``/v1/chat/completions`` (the evaluator's judge messages, greedy,
``max_tokens`` = ``--max-new-tokens``). A random-weights judge writes no stop token: every judgement, offline and
served, runs its whole budget.

The server and the peer run on this machine's default backend (``JAX_PLATFORMS`` picks it). Appends to
docs/benchmarks.md unless --no-record (--smoke: 4 clients for 5 s on a tiny model, recorded only with
--benchmarks-md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

import _bench


def _rows(count: int, tokens: int, seed: int = 0) -> list[dict]:
    """(prompt, response) rows of about ``tokens`` tokens: words of the bundled tokenizer's vocabulary."""
    import random

    words = ("door password blue quartz orchid window garden key river stone lamp paper chair table "
             "morning evening answer question document reads says").split()
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        prompt = " ".join(rng.choice(words) for _ in range(max(1, tokens - 16)))
        rows.append({"prompt": f"{i}: {prompt}?", "response": " ".join(rng.choice(words) for _ in range(12))})
    return rows


def _write(rows: list[dict], path: str, repeat: int = 1) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(repeat):
            for row in rows:
                handle.write(json.dumps(row) + "\n")
    return path


def _score_seconds(model_path: str, rows_file: str, out_dir: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "longrm_jax.score", "--model-path", model_path, "--input", rows_file,
                    "--output", os.path.join(out_dir, "scored.jsonl"), "--no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _judge_rows(count: int, tokens: int, work: str, repeat: int) -> tuple[list[dict], str, str]:
    """(the chat-completion bodies of ``count`` pairwise judge prompts, a benchmark directory of them, one of
    ``repeat`` copies of them): synthetic Long-RewardBench rows of about ``tokens`` tokens."""
    from longrm_jax.data.judge_prompts import judge_messages
    from longrm_jax.data.synthetic import write_long_rewardbench

    once, many = os.path.join(work, "bench_x1"), os.path.join(work, "bench_many")
    path = write_long_rewardbench(once, per_task=count, lengths=(tokens,), tasks=("LongQA",), bon_fraction=0.0)
    with open(path["LongQA"], encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    os.makedirs(many, exist_ok=True)
    _write(rows, os.path.join(many, "LongQA.jsonl"), repeat)
    bodies = [{"model": "judge", "temperature": 0,
               "messages": judge_messages(row["prompt_template"], [row["chosen"], row["rejected"]], "pair")}
              for row in rows]
    return bodies, once, many


def _evaluate_seconds(model_path: str, data: str, out_dir: str, max_new_tokens: int) -> tuple[float, float]:
    """(wall seconds, judging seconds after the first calls of each shape) of ``evaluate`` on ``data``."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "longrm_jax.evaluate", "--model-path", model_path, "--data-path", data,
                    "--save-path", out_dir, "--overwrite", "--no-progress", "--allow-no-verdicts",
                    "--max-new-tokens", str(max_new_tokens), "--replicas", "1"], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "timings.json"), encoding="utf-8") as handle:
        timings = json.load(handle)
    return time.perf_counter() - started, timings["judging_s"] - timings.get("compile_s", 0.0)


async def _load(port: int, rows: list[dict], clients: int, seconds: float,
                path: str = "/score") -> tuple[list[float], int, int]:
    """(latencies of answered requests, answered, failed) of ``clients`` connections posting one body each: a
    row's ``{prompt, responses}`` to ``/score``, or a ready request body (``"messages"``) to ``path``; for
    ``seconds``, or (``seconds`` 0) each row once."""
    url = f"http://127.0.0.1:{port}{path}"
    latencies, failed = [], 0
    deadline = time.monotonic() + seconds

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        nonlocal failed
        i = index
        while time.monotonic() < deadline if seconds else i < len(rows):
            row = rows[i % len(rows)]
            i += clients
            started = time.perf_counter()
            try:
                body = row if "messages" in row else {"prompt": row["prompt"], "responses": [row["response"]]}
                async with session.post(url, json=body,
                                        timeout=aiohttp.ClientTimeout(total=180)) as response:
                    await response.read()
                    if response.status == 200:
                        latencies.append(time.perf_counter() - started)
                    else:
                        failed += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                failed += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    return latencies, len(latencies), failed


def _wait_ready(port: int, proc: subprocess.Popen, limit_s: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server was not ready in time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("disrm", "grm"), default="disrm",
                        help="a DisRM scoring /score, or a generative judge answering /v1/chat/completions")
    parser.add_argument("--model-path", default=None,
                        help="an HF directory of that kind (default: a random --preset one)")
    parser.add_argument("--preset", default="tiny_qwen3", help="the random model's preset without --model-path")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="--kind grm: each judgement's budget")
    parser.add_argument("--clients", type=int, default=64, help="concurrent connections")
    parser.add_argument("--seconds", type=float, default=60, help="how long the clients post")
    parser.add_argument("--rows", type=int, default=256, help="distinct (prompt, response) rows")
    parser.add_argument("--tokens", type=int, default=256, help="about this many tokens per row")
    parser.add_argument("--repeat", type=int, default=8, help="copies of the rows in the peer's longer run")
    parser.add_argument("--serve-args", default="", help="more `serve` flags, e.g. '--max-delay-ms 10'")
    _bench.add_common_flags(parser, iters=None, warmup=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.seconds, args.rows, args.tokens, args.repeat = 4, 5, 16, 64, 2
        args.max_new_tokens = min(args.max_new_tokens, 8)
    grm = args.kind == "grm"
    work = tempfile.mkdtemp(prefix="bench_serve_")
    model_path = args.model_path
    if model_path is None:
        model_path = os.path.join(work, "model")
        _bench.write_random_hf(args.preset, "causal_lm" if grm else "classifier", model_path)
    if grm:
        rows, _, bench_many = _judge_rows(args.rows, args.tokens, work, args.repeat)
        for row in rows:
            row["max_tokens"] = args.max_new_tokens
        many, judging = _evaluate_seconds(model_path, bench_many, os.path.join(work, "eval_many"),
                                          args.max_new_tokens)
        peer_rows_s = args.repeat * len(rows) / max(judging, 1e-9)
        peer_note = (f"peer: `python -m longrm_jax.evaluate` on x{args.repeat} copies of the rows ({many:.1f} s), its "
                     f"steady samples/s over its judging seconds after first calls ({judging:.1f} s, timings.json)")
    else:
        rows = _rows(args.rows, args.tokens)
        once = _score_seconds(model_path, _write(rows, os.path.join(work, "rows.jsonl")), work)
        many = _score_seconds(model_path, _write(rows, os.path.join(work, "rows_many.jsonl"), args.repeat), work)
        peer_rows_s = (args.repeat - 1) * len(rows) / max(many - once, 1e-9)
        peer_note = (f"peer: `python -m longrm_jax.score` on the rows x1 ({once:.1f} s) and x{args.repeat} "
                     f"({many:.1f} s), its steady rows/s from the difference")

    port = _free_port()
    log = open(os.path.join(work, "serve.log"), "w")
    kind_flags = ["--set", f"max_new_tokens={args.max_new_tokens}"] if grm else ["--is-disrm"]
    server = subprocess.Popen([sys.executable, "-m", "longrm_jax.serve", "--model-path", model_path, *kind_flags,
                               "--port", str(port), *args.serve_args.split()], stdout=log, stderr=subprocess.STDOUT)
    path = "/v1/chat/completions" if grm else "/score"
    try:
        _wait_ready(port, server)
        asyncio.run(_load(port, rows, min(args.clients, len(rows)), 0, path))  # compile: every row once
        started = time.perf_counter()
        latencies, answered, failed = asyncio.run(_load(port, rows, args.clients, args.seconds, path))
        elapsed = time.perf_counter() - started
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
        log.close()
    rows_s = answered / elapsed
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    unit, peer = ("samples/s", "peer `evaluate` samples/s") if grm else ("rows/s", "peer `score` rows/s")
    table = _bench.markdown_table(
        ["clients", "seconds", "requests", "failed", unit, peer, "share", "p50 ms", "p99 ms"],
        [[args.clients, f"{elapsed:.0f}", answered, failed, f"{rows_s:.1f}", f"{peer_rows_s:.1f}",
          f"{100 * rows_s / peer_rows_s:.0f}%", f"{1000 * cuts[49]:.0f}", f"{1000 * cuts[98]:.0f}"]], "rrrrrrrrr")
    print("\n".join(table))
    path = _bench.record_path(args)
    if path:
        _bench.append_section(path, "Reward server under one-sample requests (scripts/bench_serve.py)",
                              command=_bench.command_line(argv), device=_bench.device_name(),
                              details=f"model {args.model_path or f'random {args.preset} {args.kind}'}, "
                                      f"{len(rows)} rows of about {args.tokens} tokens"
                                      + (f", judgements of {args.max_new_tokens} tokens via /v1/chat/completions"
                                         if grm else ""),
                              table=table,
                              notes=[peer_note])
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
