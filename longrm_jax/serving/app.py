"""The reward server's HTTP routes, in the shapes RL frameworks send (docs/serving.md).

A DisRM answers ``POST /get_reward`` (OpenRLHF's ``--reward.remote_url``), ``POST /classify`` (vLLM's, as
verl's reward loop posts it) and ``POST /score`` (ours: a prompt and its responses, the chat template applied as
``RewardModel.score`` applies it). A generative judge answers ``POST /judge`` (as ``Judge.judge``) and ``POST
/v1/chat/completions`` (OpenAI's shapes, greedy decoding). Both answer ``GET /health`` (200 once the model is
loaded, 503 before) and ``GET /metrics`` (Prometheus text).

Requests are tokenized in worker threads, so the event loop goes on accepting meanwhile. Every request is checked
before it queues: malformed JSON, a missing or mistyped field or an empty list gets a 4xx with a one-line
``{"error": ...}``; a full queue 503 with ``Retry-After``; a query too long to cut 413 with its lengths. An error
inside a model call answers 500 with one line (the traceback goes to the server's log) and the server goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid

import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from longrm_jax.data.records import chat_messages_problem
from longrm_jax.serving.batcher import LiveBatcher, QueueFull, RequestBatcher
from longrm_jax.serving.config import ServeConfig

logger = logging.getLogger(__name__)

# The server's state: "service" (the loaded model's, None until it is ready) and "loader" (the loading task).
STATE = web.AppKey("state", dict)
METRICS = web.AppKey("metrics", object)
RETRY_AFTER_S = 1


class RequestError(Exception):
    """A request the server refuses: its HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _field(body: dict, name: str, kind: type | tuple, *, required: bool = True):
    """``body[name]`` checked to be of ``kind`` (a 400 naming the field otherwise)."""
    if name not in body:
        if required:
            raise RequestError(400, f"missing field '{name}'")
        return None
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # JSON true is no int
        raise RequestError(400, f"field '{name}' must be {' or '.join(k.__name__ for k in kinds)}, got "
                                f"{type(value).__name__}")
    return value


def _strings(body: dict, name: str, *, required: bool = True, one_or_list: bool = False) -> list[str] | None:
    """A non-empty list of strings (or, with ``one_or_list``, one string) under ``name``."""
    value = _field(body, name, (list, str) if one_or_list else list, required=required)
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not value:
        raise RequestError(400, f"field '{name}' is an empty list")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RequestError(400, f"field '{name}[{i}]' must be a string, got {type(item).__name__}")
    return value


def _messages(value, name: str) -> list[dict]:
    """Chat messages: a non-empty list of {role, content} with string values."""
    problem = chat_messages_problem(value)
    if problem:
        i, key, what = problem
        where = name + ("" if i is None else f"[{i}]") + ("" if key is None else f".{key}")
        raise RequestError(400, f"field '{where}' {what}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _max_tokens(body: dict, name: str, limit: int) -> int:
    value = _field(body, name, int, required=False)
    if value is None:
        return limit
    if value < 1:
        raise RequestError(400, f"field '{name}' must be >= 1, got {value}")
    return min(value, limit)


class Metrics:
    """The Prometheus metrics of one server (its own registry)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("longrm_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=self.registry)
        self.latency = Histogram("longrm_request_seconds", "request latency by endpoint", ["endpoint"],
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180))
        self.tokens = Counter("longrm_tokens", "tokens scored or generated", ["kind"], registry=self.registry)
        self.truncated = Counter("longrm_truncated", "sequences whose prompt was cut in the middle",
                                 registry=self.registry)
        self.queue = Gauge("longrm_queue_length", "items waiting for a model call", registry=self.registry)
        self.busy = Gauge("longrm_model_busy_seconds", "seconds spent in model calls", registry=self.registry)


class DisRMService:
    """A sequence classifier's scores, computed by a :class:`RequestBatcher` across requests."""

    kind = "disrm"

    def __init__(self, cfg: ServeConfig):
        from longrm_jax.api import RewardModel  # noqa: PLC0415 - jax and the model load in the server's thread
        from longrm_jax.evaluation.scoring import DisRMScorer  # noqa: PLC0415 - likewise

        self.cfg = cfg
        self.rm = RewardModel.from_pretrained(cfg.model_path, dtype=None if cfg.dtype == "auto" else cfg.dtype,
                                              max_length=cfg.max_length)
        self.tokenizer = self.rm.tokenizer
        pad_id = self.rm.model.config.pad_token_id
        self.scorer = DisRMScorer(self.rm.model, self.tokenizer.pad_id if pad_id is None else pad_id,
                                  batch_size=cfg.batch_size, max_batch_tokens=cfg.max_batch_tokens)
        self.batcher = RequestBatcher(lambda seqs: self.scorer.score(seqs, progress=False),
                                      batch_size=cfg.batch_size, max_batch_tokens=cfg.max_batch_tokens,
                                      max_delay_ms=cfg.max_delay_ms, max_queue=cfg.max_queue)

    def query_ids(self, query: str, prompt: str | None) -> tuple[np.ndarray, bool]:
        """A query's tokens as given (no template applied again, no special token added) and whether its prompt
        was cut: over ``max_length``, the middle of the prompt goes when ``prompt`` is where the query starts (the
        response is never cut); with no such boundary the query is refused (413)."""
        ids = self.tokenizer.encode(query)
        limit = self.cfg.max_length
        if len(ids) <= limit:
            return ids, False
        if prompt is None or not prompt or not query.startswith(prompt):
            raise RequestError(413, f"query of {len(ids)} tokens is over max_length {limit}, and no prompt that "
                                    "starts it marks what may be cut (send 'prompts')")
        head, tail = self.tokenizer.encode(prompt), self.tokenizer.encode(query[len(prompt):])
        keep = limit - len(tail)
        if keep < 16:
            raise RequestError(413, f"the response alone is {len(tail)} tokens, over what max_length {limit} leaves "
                                    "for a prompt (16 tokens at least); the response is never cut")
        if len(head) <= keep:  # tokenized apart, prompt and response fit (their boundary tokenizes differently)
            return np.concatenate([head, tail]), False
        first = keep // 2  # the prompt's first and last halves of what fits, as evaluate cuts its middle
        return np.concatenate([head[:first], head[len(head) - (keep - first):], tail]), True

    def score_sequences(self, prompts, responses) -> tuple[list[np.ndarray], list[bool]]:
        """``RewardModel.score``'s sequences of (prompt, response) pairs, and whether each was cut."""
        pairs = self.rm.sequences(prompts, responses)
        return [ids for ids, _ in pairs], [cut for _, cut in pairs]


# The most answers one judgement may rank: the verdict letters A-Z the generator reads log-probs of.
MAX_ANSWERS = 26


class JudgeService:
    """A generative judge: ``Judge.judge`` and greedy chat completions. On one device every request's prompt
    joins the running decode as soon as a slot frees up (``LiveBatcher``, continuous batching across requests);
    on a mesh of several devices concurrent requests are decoded together in static batches."""

    kind = "grm"

    def __init__(self, cfg: ServeConfig):
        from longrm_jax.api import Judge  # noqa: PLC0415 - jax and the model load in the server's thread
        from longrm_jax.evaluation.encoding import verdict_letter_token_ids  # noqa: PLC0415

        self.cfg = cfg
        self.judge = Judge.from_pretrained(cfg.model_path, dtype=None if cfg.dtype == "auto" else cfg.dtype,
                                           max_length=cfg.max_length)
        self.tokenizer = self.judge.tokenizer
        self.letters = verdict_letter_token_ids(self.tokenizer, MAX_ANSWERS)
        self.generator = self._generator(cfg.max_new_tokens)
        if self.generator.continuous:
            self.batcher = LiveBatcher(self._serve_live, max_queue=cfg.max_queue)
        else:
            self.batcher = RequestBatcher(self._compute, batch_size=cfg.batch_size, max_batch_tokens=1 << 62,
                                          max_delay_ms=cfg.max_delay_ms, max_queue=cfg.max_queue)

    def _generator(self, max_new_tokens: int):
        import dataclasses  # noqa: PLC0415

        from longrm_jax.evaluation.grm.generator import make_generator  # noqa: PLC0415

        cfg = dataclasses.replace(self.judge.cfg, max_new_tokens=int(max_new_tokens))
        return make_generator(cfg, self.judge.model, self.tokenizer, self.judge.mesh, self.letters)

    def _serve_live(self, source) -> None:
        """The worker thread: every request's prompt decoded as a slot of the running pool."""
        started = [time.perf_counter()]

        def pool_done(timings) -> None:
            self.batcher.record_pool(time.perf_counter() - started[0], int(timings.get("max_slots") or 0))
            started[0] = time.perf_counter()

        self.generator.generate_live(source, self.cfg.max_length, max_slots=self.cfg.batch_size, on_pool=pool_done)

    def _compute(self, payloads: list) -> list:
        """Generations of a batch of (prompt ids, budget), each budget's prompts decoded together (static)."""
        out: list = [None] * len(payloads)
        for budget in sorted({budget for _, budget in payloads}):
            group = [i for i, (_, b) in enumerate(payloads) if b == budget]
            generations = self._generator(budget).generate([payloads[i][0] for i in group], progress=False)
            for i, generation in zip(group, generations):
                out[i] = generation
        return out

    def encode_judgement(self, prompt: str, answers: list[str]):
        """(sample, prompt ids, cut) of a judgement request, as ``Judge.judge`` encodes it."""
        return self.judge.encode(prompt, answers)

    def completion(self, generation) -> tuple[str, int, bool]:
        """(text, generated tokens, stopped) of a chat completion's generation."""
        return (self.tokenizer.hf.decode(generation.tokens.tolist(), skip_special_tokens=True),
                int(len(generation.tokens)), bool(generation.stopped))

    def chat_ids(self, messages: list[dict]) -> tuple[np.ndarray, bool]:
        """The prompt of a chat completion: the messages in the model's chat template with the generation
        prompt, the middle cut over max_length as evaluate cuts a judge prompt."""
        from longrm_jax.evaluation.encoding import maybe_truncate  # noqa: PLC0415

        text = self.tokenizer.render(messages, add_generation_prompt=True)
        return maybe_truncate(np.asarray(self.tokenizer.encode(text), dtype=np.int32), self.cfg.max_length)


def _service(request: web.Request, kind: str | None = None):
    service = request.app[STATE]["service"]
    if service is None:
        raise RequestError(503, "the model is still loading (GET /health answers 200 once it is ready)")
    if kind is not None and service.kind != kind:
        what = "a discriminative RM (--is-disrm)" if kind == "disrm" else "a generative judge"
        raise RequestError(404, f"{request.path} needs {what}; this server holds "
                                f"{'a DisRM' if service.kind == 'disrm' else 'a generative judge'}")
    return service


async def _body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(400, f"the body is not valid JSON ({error})") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(body).__name__}")
    return body


async def _submit(request: web.Request, service, payloads: list, tokens: list[int]) -> list:
    metrics: Metrics = request.app[METRICS]
    try:
        results = await service.batcher.submit(payloads, tokens)
    except QueueFull as error:
        raise RequestError(503, f"the server is busy: {error}; retry later") from None
    metrics.queue.set(service.batcher.pending)
    metrics.busy.set(service.batcher.stats.busy_s)
    return results


async def get_reward(request: web.Request) -> web.Response:
    """OpenRLHF: ``{"query": [text], "prompts": [text]?, "labels": [...]?}`` -> ``{"rewards", "scores",
    "extra_logs"}``; each query scored as the text it is."""
    service = _service(request, "disrm")
    body = await _body(request)
    queries = _strings(body, "query", one_or_list=True)
    prompts = _strings(body, "prompts", required=False, one_or_list=True)
    if prompts is not None and len(prompts) != len(queries):
        raise RequestError(400, f"{len(prompts)} prompts for {len(queries)} queries: send one prompt per query")
    encoded = await asyncio.to_thread(
        lambda: [service.query_ids(q, prompts[i] if prompts else None) for i, q in enumerate(queries)])
    scores = await _submit(request, service, [ids for ids, _ in encoded], [len(ids) for ids, _ in encoded])
    _count_tokens(request, encoded)
    rewards = [float(s) for s in scores]
    return web.json_response({"rewards": rewards, "scores": rewards,
                              "extra_logs": {"truncated": [cut for _, cut in encoded]}})


async def classify(request: web.Request) -> web.Response:
    """vLLM: ``{"model", "input": text | [text], "activation" | "use_activation": bool}`` -> ``{"data": [{"index",
    "probs": [score], "num_classes": 1, ...}], ...}``; the raw score unless the activation (a sigmoid) is asked."""
    service = _service(request, "disrm")
    body = await _body(request)
    texts = _strings(body, "input", one_or_list=True)
    activation = True
    for name in ("use_activation", "activation"):
        value = _field(body, name, bool, required=False)
        if value is not None:
            activation = value
    encoded = await asyncio.to_thread(lambda: [service.query_ids(text, None) for text in texts])
    scores = await _submit(request, service, [ids for ids, _ in encoded], [len(ids) for ids, _ in encoded])
    _count_tokens(request, encoded)
    tokens = sum(len(ids) for ids, _ in encoded)
    data = []
    for index, score in enumerate(scores):
        value = 1 / (1 + math.exp(-score)) if activation else float(score)
        data.append({"index": index, "label": "LABEL_0", "probs": [value], "num_classes": 1})
    return web.json_response({"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                              "model": body.get("model") or service.cfg.model_path, "data": data,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def score(request: web.Request) -> web.Response:
    """Ours: ``{"prompt": text | messages, "responses": [text]}`` (or ``"prompts"``, one per response) ->
    ``{"rewards", "truncated"}``, the chat template applied as ``RewardModel.score`` applies it."""
    service = _service(request, "disrm")
    body = await _body(request)
    responses = _strings(body, "responses")
    if "prompts" in body:
        raw = _field(body, "prompts", list)
        if len(raw) != len(responses):
            raise RequestError(400, f"{len(raw)} prompts for {len(responses)} responses: one each, or one 'prompt'")
    else:
        raw = [_field(body, "prompt", (str, list))] * len(responses)
    prompts = [p if isinstance(p, str) else _messages(p, "prompt") for p in raw]
    sequences, cut = await asyncio.to_thread(service.score_sequences, prompts, responses)
    scores = await _submit(request, service, sequences, [len(ids) for ids in sequences])
    _count_tokens(request, list(zip(sequences, cut)))
    return web.json_response({"rewards": [float(s) for s in scores], "truncated": cut})


async def judge(request: web.Request) -> web.Response:
    """``{"context"?, "question", "answers": [text, ...], "max_new_tokens"?}`` -> ``{"verdict", "best",
    "ranking", "text", "parsed", "truncated"}``, as ``Judge.judge``."""
    service = _service(request, "grm")
    body = await _body(request)
    context = _field(body, "context", str, required=False)
    question = _field(body, "question", str)
    answers = _strings(body, "answers")
    if len(answers) < 2:
        raise RequestError(400, f"field 'answers' needs at least 2 answers, got {len(answers)}")
    if len(answers) > MAX_ANSWERS:
        raise RequestError(400, f"field 'answers' holds {len(answers)} answers; at most {MAX_ANSWERS} are judged")
    budget = _max_tokens(body, "max_new_tokens", service.cfg.max_new_tokens)
    prompt = "\n\n".join(part for part in (context, question) if part)
    sample, ids, cut = await asyncio.to_thread(service.encode_judgement, prompt, answers)
    (generation,) = await _submit(request, service, [(ids, budget)], [len(ids)])
    judgement = service.judge.judgement(sample, generation, ids, cut)
    request.app[METRICS].tokens.labels("generated").inc(judgement.generated_tokens)
    if judgement.truncated:
        request.app[METRICS].truncated.inc()
    return web.json_response({"verdict": judgement.verdict, "best": judgement.best, "ranking": judgement.ranking,
                              "text": judgement.text, "parsed": judgement.parsed,
                              "truncated": judgement.truncated})


async def chat_completions(request: web.Request) -> web.Response:
    """OpenAI: ``{"model", "messages", "max_tokens" | "max_completion_tokens"?}`` -> a ``chat.completion``,
    decoded greedily (temperature and sampling settings are accepted and not used)."""
    service = _service(request, "grm")
    body = await _body(request)
    messages = _messages(body.get("messages"), "messages")
    if body.get("n", 1) != 1:
        raise RequestError(400, "field 'n' must be 1: greedy decoding gives one completion")
    if body.get("stream"):
        raise RequestError(400, "field 'stream' must be false: streaming is not served")
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    budget = _max_tokens(body, name, service.cfg.max_new_tokens)
    ids, cut = await asyncio.to_thread(service.chat_ids, messages)
    (generation,) = await _submit(request, service, [(ids, budget)], [len(ids)])
    text, generated, stopped = service.completion(generation)
    request.app[METRICS].tokens.labels("generated").inc(generated)
    if cut:
        request.app[METRICS].truncated.inc()
    return web.json_response({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model") or service.cfg.model_path,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop" if stopped else "length"}],
        "usage": {"prompt_tokens": int(len(ids)), "completion_tokens": generated,
                  "total_tokens": int(len(ids)) + generated},
        "truncated": cut,
    })


def _count_tokens(request: web.Request, encoded) -> None:
    metrics: Metrics = request.app[METRICS]
    metrics.tokens.labels("scored").inc(sum(len(ids) for ids, _ in encoded))
    metrics.truncated.inc(sum(bool(cut) for _, cut in encoded))


async def health(request: web.Request) -> web.Response:
    service = request.app[STATE]["service"]
    if service is None:
        return web.json_response({"status": "loading"}, status=503)
    return web.json_response({"status": "ok", "kind": service.kind, "model": service.cfg.model_path})


async def metrics_text(request: web.Request) -> web.Response:
    metrics: Metrics = request.app[METRICS]
    service = request.app[STATE]["service"]
    if service is not None:
        metrics.queue.set(service.batcher.pending)
        metrics.busy.set(service.batcher.stats.busy_s)
    return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")


@web.middleware
async def _errors(request: web.Request, handler):
    """One-line JSON errors, never a traceback; request counts and latency."""
    metrics: Metrics = request.app[METRICS]
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except RequestError as error:
        status = error.status
        headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status == 503 else None
        return web.json_response({"error": error.reason}, status=error.status, headers=headers)
    except web.HTTPException as error:  # aiohttp's own: unknown path (404), wrong method (405)
        status = error.status
        return web.json_response({"error": f"{error.reason}: {request.method} {request.path}"}, status=error.status)
    except asyncio.CancelledError:
        status = 499  # the client went away
        raise
    except Exception as error:  # noqa: BLE001 - the server goes on; the log has the traceback
        logger.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": f"internal error: {type(error).__name__}: {error}".splitlines()[0]},
                                 status=500)
    finally:
        endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
        metrics.requests.labels(endpoint, str(status)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)


def build_app(cfg: ServeConfig, load=None) -> web.Application:
    """The server's application; the model loads in a thread once the server listens (``load(cfg)`` -> the
    service; default: a DisRM or a judge by ``cfg.is_disrm``), and ``/health`` answers 503 until it is ready."""
    app = web.Application(middlewares=[_errors], client_max_size=1 << 30)
    app[METRICS] = Metrics()
    app[STATE] = {"service": None, "loader": None}
    load = load or (DisRMService if cfg.is_disrm else JudgeService)

    async def start(app: web.Application) -> None:
        async def load_in_thread() -> None:
            started = time.perf_counter()
            try:
                service = await asyncio.to_thread(load, cfg)
            except Exception:  # noqa: BLE001 - a model that cannot load stops the server, with the reason logged
                logger.exception("could not load %s", cfg.model_path)
                raise SystemExit(2) from None
            service.batcher.start()
            app[STATE]["service"] = service
            logger.info("ready: %s loaded in %.1f s, serving on http://%s:%d", cfg.model_path,
                        time.perf_counter() - started, cfg.host, cfg.port)

        app[STATE]["loader"] = asyncio.get_running_loop().create_task(load_in_thread())

    async def stop(app: web.Application) -> None:
        app[STATE]["loader"].cancel()
        service = app[STATE]["service"]
        if service is not None:
            await service.batcher.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_text)
    app.router.add_post("/get_reward", get_reward)
    app.router.add_post("/classify", classify)
    app.router.add_post("/score", score)
    app.router.add_post("/judge", judge)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app
