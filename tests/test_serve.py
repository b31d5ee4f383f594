"""``python -m longrm_jax.serve``: the reward server as RL frameworks call it, over HTTP on 127.0.0.1.

A DisRM server (a subprocess, as a user starts it) is checked against transformers' sequence classifier on the
same texts, against ``RewardModel.score``, in OpenRLHF's exact request shape from concurrent clients, on bad
requests and on SIGTERM. A judge server against ``Judge.judge``. The batcher's queue limit and the dropping of a
departed client's work run in process, on a model call that waits for the test."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import transformers

from longrm_jax import Judge, RewardModel
from longrm_jax.serving.app import build_app
from longrm_jax.serving.batcher import QueueFull, RequestBatcher
from longrm_jax.serving.config import ServeConfig
from helpers.tiny_checkpoint import make_tiny_model_dir
from test_training_multiprocess import reserved_port

TEXTS = ["<|im_start|>user\nWhat is the password?<|im_end|>\n<|im_start|>assistant\nquartz<|im_end|>",
         "a plain text of a few words", "x", "the same words the same words " * 12]


def _post(port, path, body, timeout=180, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def _get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except urllib.error.URLError:
        return None, ""


class Server:
    """``python -m longrm_jax.serve ARGS`` on a reserved port; ready once /health answers 200."""

    def __init__(self, tmp_path, *args):
        with reserved_port() as port:
            self.port = port
        self.log = open(tmp_path / f"serve_{port}.log", "w+")
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        self.proc = subprocess.Popen([sys.executable, "-m", "longrm_jax.serve", "--port", str(port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while _get(self.port, "/health")[0] != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.2)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.log.close()
        return code


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3"])
def disrm(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"rm_{request.param}")
    # Gemma 3: a sliding-window layer and a full one (the texts run past its window of 8)
    make_tiny_model_dir(path, request.param, "classifier", layers=2 if request.param == "gemma3" else 1)
    server = Server(path, "--model-path", str(path), "--is-disrm", "--set", "max_length=256",
                    "--max-delay-ms", "20")
    yield str(path), server
    assert server.stop() == 0


def test_get_reward_and_classify_equal_transformers_classifier(disrm):
    path, server = disrm
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    want = []
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            want.append(float(model(ids).logits[0, 0]))
    status, body, _ = _post(server.port, "/get_reward", {"query": TEXTS, "prompts": TEXTS, "labels": [""] * 4})
    assert status == 200 and body["extra_logs"]["truncated"] == [False] * 4
    np.testing.assert_allclose(body["rewards"], want, rtol=1e-4, atol=1e-6)
    assert body["scores"] == body["rewards"]
    for flag in ("activation", "use_activation"):
        status, raw, _ = _post(server.port, "/classify", {"model": "rm", "input": TEXTS[0], flag: False})
        assert status == 200 and raw["data"][-1]["probs"][-1] == pytest.approx(want[0], rel=1e-4, abs=1e-6)
    status, sig, _ = _post(server.port, "/classify", {"model": "rm", "input": TEXTS[:2]})  # vLLM's default: on
    assert status == 200 and [d["index"] for d in sig["data"]] == [0, 1]
    np.testing.assert_allclose([d["probs"][0] for d in sig["data"]], 1 / (1 + np.exp(-np.array(want[:2]))),
                               rtol=1e-4)


def test_score_equals_reward_model_score(disrm):
    path, server = disrm
    prompt = [{"role": "user", "content": "Which door is blue?"}]
    responses = ["The left one.", "The right one, past the hall."]
    want = RewardModel.from_pretrained(path, max_length=256).score(prompt, responses)
    status, body, _ = _post(server.port, "/score", {"prompt": prompt, "responses": responses})
    assert status == 200 and body["truncated"] == [False, False]
    np.testing.assert_allclose(body["rewards"], want, rtol=1e-5, atol=1e-6)


def test_openrlhf_clients_one_sample_per_post_concurrently(disrm):
    """OpenRLHF's remote reward: one POST per sample, query and prompts as one-element lists, a 180 s timeout,
    from 16 threads at once; every answer equals the sequential one."""
    _, server = disrm
    queries = [f"{TEXTS[i % 4]} {i}" for i in range(48)]
    sequential = [_post(server.port, "/get_reward", {"query": [q], "prompts": [""], "labels": [None]})[1]
                  for q in queries[:8]]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda q: _post(server.port, "/get_reward",
                                                {"query": [q], "prompts": [""], "labels": [None]}, timeout=180),
                                queries))
    assert all(status == 200 for status, _, _ in answers)
    for got, want in zip(answers[:8], sequential):
        assert got[1]["rewards"][0] == pytest.approx(want["rewards"][0], rel=1e-5, abs=1e-6)
    status, metrics = _get(server.port, "/metrics")
    assert status == 200 and 'longrm_requests_total{endpoint="/get_reward",status="200"}' in metrics


BAD = [  # (path, body or raw bytes, status, words in the error)
    ("/get_reward", b"{not json", 400, "not valid JSON"),
    ("/get_reward", b"[1, 2]", 400, "must be a JSON object"),
    ("/get_reward", {}, 400, "missing field 'query'"),
    ("/get_reward", {"query": 5}, 400, "field 'query' must be list or str"),
    ("/get_reward", {"query": []}, 400, "empty list"),
    ("/get_reward", {"query": ["a", 3]}, 400, "field 'query[1]' must be a string"),
    ("/get_reward", {"query": ["a", "b"], "prompts": ["a"]}, 400, "1 prompts for 2 queries"),
    ("/get_reward", {"query": ["word " * 600]}, 413, "over max_length 256"),
    ("/get_reward", {"query": ["p " * 100 + "r " * 300], "prompts": ["p " * 100]}, 413, "the response alone"),
    ("/classify", {"input": "a", "activation": "no"}, 400, "field 'activation' must be bool"),
    ("/classify", {"model": "m"}, 400, "missing field 'input'"),
    ("/score", {"prompt": "q"}, 400, "missing field 'responses'"),
    ("/score", {"prompt": "q", "responses": ["a", 1]}, 400, "field 'responses[1]' must be a string"),
    ("/score", {"prompt": [{"content": "q"}], "responses": ["a"]}, 400, "prompt[0].role"),
    ("/score", {"prompt": 7, "responses": ["a"]}, 400, "field 'prompt' must be str or list"),
    ("/score", {"prompts": ["a"], "responses": ["a", "b"]}, 400, "1 prompts for 2 responses"),
    ("/judge", {"question": "q", "answers": ["a", "b"]}, 404, "needs a generative judge"),
    ("/v1/chat/completions", {"messages": []}, 404, "needs a generative judge"),
    ("/nowhere", {}, 404, "Not Found"),
]


@pytest.mark.parametrize("path, body, status, words", BAD, ids=[f"{p}:{w}" for p, _, _, w in BAD])
def test_bad_requests_get_a_one_line_reason_and_the_server_goes_on(disrm, path, body, status, words):
    _, server = disrm
    raw = body if isinstance(body, bytes) else None
    got, answer, _ = _post(server.port, path, body, raw=raw)
    assert got == status and words in answer["error"] and "\n" not in answer["error"], answer
    assert _get(server.port, "/health")[0] == 200


def test_a_long_query_with_its_prompt_loses_the_middle_of_the_prompt(disrm):
    _, server = disrm
    prompt = "p " * 400
    status, body, _ = _post(server.port, "/get_reward", {"query": [prompt + "r r"], "prompts": [prompt]})
    assert status == 200 and body["extra_logs"]["truncated"] == [True]


def test_sigterm_finishes_the_requests_in_flight_and_exits_0(tmp_path):
    path = tmp_path / "rm"
    make_tiny_model_dir(path, "llama", "classifier", layers=1)
    server = Server(tmp_path, "--model-path", str(path), "--is-disrm", "--max-delay-ms", "1500")
    results = []
    thread = threading.Thread(target=lambda: results.append(_post(server.port, "/get_reward", {"query": ["hi"]})))
    thread.start()
    time.sleep(0.5)  # the request waits in the batcher (1.5 s) when the signal comes
    assert server.stop() == 0
    thread.join(30)
    assert results and results[0][0] == 200 and len(results[0][1]["rewards"]) == 1


def test_judge_server_equals_the_api_judge(tmp_path):
    path = tmp_path / "judge"
    make_tiny_model_dir(path, "llama", "causal_lm", layers=1)
    server = Server(tmp_path, "--model-path", str(path), "--dtype", "float32", "--set", "max_new_tokens=12")
    try:
        want = Judge.from_pretrained(str(path), dtype="float32").judge("The door is blue.", "Which colour?",
                                                                        ["blue", "red"], max_new_tokens=12)
        status, body, _ = _post(server.port, "/judge", {"context": "The door is blue.", "question": "Which colour?",
                                                        "answers": ["blue", "red"]})
        assert status == 200 and body["text"] == want.text and body["verdict"] == want.verdict
        # The judge prompt sent as chat messages: the completion is the judgement Judge.judge (and evaluate) decode.
        from longrm_jax.data.judge_prompts import judge_messages

        messages = judge_messages([{"role": "user", "content": "The door is blue.\n\nWhich colour?"}],
                                  ["blue", "red"], "pair")
        status, chat, _ = _post(server.port, "/v1/chat/completions", {"model": "judge", "messages": messages,
                                                                       "max_tokens": 12, "temperature": 0})
        assert status == 200 and chat["choices"][0]["message"]["content"] == want.text
        status, chat, _ = _post(server.port, "/v1/chat/completions",
                                {"model": "judge", "messages": [{"role": "user", "content": "Hello"}],
                                 "max_tokens": 5, "temperature": 0})
        assert status == 200 and chat["object"] == "chat.completion"
        assert chat["usage"]["completion_tokens"] <= 5 and isinstance(chat["choices"][0]["message"]["content"], str)
        import openai  # the test extra pins it: the client a verl GenRM reward function would use

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)
        completion = client.chat.completions.create(model="judge", max_tokens=5, temperature=0,
                                                    messages=[{"role": "user", "content": "Hello"}])
        assert completion.choices[0].message.content == chat["choices"][0]["message"]["content"]
        assert completion.choices[0].finish_reason in ("stop", "length")
        status, answer, _ = _post(server.port, "/judge", {"question": "q", "answers": ["only one"]})
        assert status == 400 and "at least 2 answers" in answer["error"]
        status, answer, _ = _post(server.port, "/get_reward", {"query": ["x"]})
        assert status == 404 and "needs a discriminative RM" in answer["error"]
    finally:
        assert server.stop() == 0


class _WaitingService:
    """A service whose model call waits until the test releases it: what is queued meanwhile stays queued."""

    kind = "disrm"

    def __init__(self, cfg):
        self.cfg, self.release, self.calls = cfg, threading.Event(), []
        self.batcher = RequestBatcher(self._compute, batch_size=1, max_batch_tokens=1 << 20, max_delay_ms=0,
                                      max_queue=cfg.max_queue)

    def _compute(self, payloads):
        self.calls.append(list(payloads))
        self.release.wait(30)
        return [0.5] * len(payloads)

    def query_ids(self, query, prompt):
        return np.arange(len(query), dtype=np.int32), False


def test_full_queue_answers_503_with_retry_after_and_a_departed_client_frees_its_work():
    from aiohttp.test_utils import TestClient, TestServer

    cfg = ServeConfig(model_path="fake", max_queue=2).validate()
    holder = {}

    def load(cfg):
        holder["service"] = _WaitingService(cfg)
        return holder["service"]

    async def scenario():
        async with TestClient(TestServer(build_app(cfg, load=load))) as client:
            for _ in range(100):
                if (await client.get("/health")).status == 200:
                    break
                await asyncio.sleep(0.05)
            service = holder["service"]
            first = asyncio.ensure_future(client.post("/get_reward", json={"query": ["aaaa"]}))
            while not service.calls:
                await asyncio.sleep(0.01)  # the first request is in the model call
            gone = asyncio.ensure_future(client.post("/get_reward", json={"query": ["bbbbbb"]}))
            await asyncio.sleep(0.2)
            full = await client.post("/get_reward", json={"query": ["c", "d"]})  # 1 waiting + 2 > max_queue 2
            assert full.status == 503 and full.headers["Retry-After"] == "1"
            assert "busy" in (await full.json())["error"]
            gone.cancel()  # its client goes away while it waits
            await asyncio.sleep(0.2)
            service.release.set()
            assert (await first).status == 200
            for _ in range(100):
                if service.batcher.stats.dropped:
                    break
                await asyncio.sleep(0.05)
            assert service.batcher.stats.dropped == 1 and len(service.calls) == 1

    asyncio.run(scenario())


def test_health_is_503_until_the_model_is_loaded():
    from aiohttp.test_utils import TestClient, TestServer

    loaded = threading.Event()

    def load(cfg):
        loaded.wait(30)
        return _WaitingService(cfg)

    async def scenario():
        async with TestClient(TestServer(build_app(ServeConfig(model_path="fake").validate(), load=load))) as client:
            assert (await client.get("/health")).status == 503
            response = await client.post("/get_reward", json={"query": ["a"]})
            assert response.status == 503 and "still loading" in (await response.json())["error"]
            loaded.set()
            for _ in range(100):
                if (await client.get("/health")).status == 200:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("/health never answered 200")

    asyncio.run(scenario())


def test_queue_full_is_refused_before_anything_queues():
    async def scenario():
        batcher = RequestBatcher(lambda items: items, batch_size=4, max_batch_tokens=100, max_delay_ms=0,
                                 max_queue=3)
        with pytest.raises(QueueFull):
            await batcher.submit([1, 2, 3, 4], [1, 1, 1, 1])
        assert batcher.pending == 0

    asyncio.run(scenario())


def test_settings_come_from_the_file_then_set_then_flags(tmp_path, capsys):
    from longrm_jax import serve
    from longrm_jax.schema_flags import config_from_args

    config = tmp_path / "serve.yaml"
    config.write_text("model_path: from_file\nport: 9001\nmax_delay_ms: 7\n")
    parser = serve.build_parser()
    cfg = config_from_args(parser.parse_args(["--config", str(config), "--set", "port=9002", "--port", "9003",
                                              "--is-disrm"]), ServeConfig)
    assert (cfg.model_path, cfg.port, cfg.max_delay_ms, cfg.is_disrm, cfg.host) == ("from_file", 9003, 7.0, True,
                                                                                     "127.0.0.1")
    assert serve.main(["--model-path", "x", "--port", "0"]) == 2
    assert "port must be in [1, 65535]; got 0" in capsys.readouterr().err
    assert serve.main(["--port", "8000"]) == 2
    assert "model_path: required" in capsys.readouterr().err
    assert serve.main(["--model-path", "x", "--set", "max_queue=-1"]) == 2
    assert "max_queue must be >= 1" in capsys.readouterr().err
