"""Our reward models as the reward of an RL trainer: TRL's ``GRPOTrainer(reward_funcs=...)`` and anything that
calls ``reward(prompts, completions, **kwargs) -> list[float]``.

    from longrm_jax.rl import reward_function
    reward = reward_function(url="http://127.0.0.1:8000")        # a `python -m longrm_jax.serve --is-disrm` server
    reward = reward_function(model_path="runs/tiny_disrm_hf")     # or the model in this process
    trainer = trl.GRPOTrainer(model=..., reward_funcs=reward, ...)

Prompts and completions come as TRL gives them: strings, or chat messages (a completion then being
``[{"role": "assistant", "content": ...}]``). Each completion is scored as ``RewardModel.score`` scores a response
to its prompt (a string prompt is one user message), the chat template applied: through the server's ``/score``
(batched there with other clients' requests) or in this process. ``async_reward_function(url=...)`` is the same
as a coroutine function, which TRL runs beside its other reward functions.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["async_reward_function", "reward_function"]


def _response(completion: Any) -> str:
    """A completion's text: a string, or the last message's content of a chat completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
    raise TypeError(f"a completion is a string or chat messages ending in one with string content, got "
                    f"{type(completion).__name__}")


def _request(prompts: Sequence[Any], completions: Sequence[Any]) -> dict:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    return {"prompts": [p if isinstance(p, str) else [dict(m) for m in p] for p in prompts],
            "responses": [_response(c) for c in completions]}


def _score_url(url: str) -> str:
    return url.rstrip("/") + "/score"


def _rewards(status: int, body: dict, url: str, expected: int) -> list[float]:
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {body.get('error', body)}")
    rewards = body.get("rewards")
    if not isinstance(rewards, list) or len(rewards) != expected:
        raise RuntimeError(f"{url}: expected {expected} rewards, got {rewards!r}")
    return [float(r) for r in rewards]


def reward_function(*, url: str | None = None, model_path: str | None = None, timeout: float = 180.0,
                    **load_kwargs):
    """``reward(prompts, completions, **kwargs) -> list[float]``: the rewards of a reward server at ``url`` (its
    ``/score``), or of the DisRM at ``model_path`` loaded here (``load_kwargs`` go to
    ``RewardModel.from_pretrained``: dtype, max_length, batch_size, ...). Exactly one of the two."""
    if (url is None) == (model_path is None):
        raise ValueError("give exactly one of url= (a reward server) and model_path= (a model to load here)")
    if url is not None:
        endpoint = _score_url(url)

        def reward(prompts, completions, **kwargs) -> list[float]:
            body = json.dumps(_request(prompts, completions)).encode()
            request = urllib.request.Request(endpoint, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    return _rewards(response.status, json.loads(response.read()), endpoint, len(completions))
            except urllib.error.HTTPError as error:
                return _rewards(error.code, json.loads(error.read() or b"{}"), endpoint, len(completions))
    else:
        from longrm_jax.api import RewardModel  # noqa: PLC0415 - jax and the model load only for this mode

        model = RewardModel.from_pretrained(model_path, **load_kwargs)

        def reward(prompts, completions, **kwargs) -> list[float]:
            request = _request(prompts, completions)
            if not request["responses"]:
                return []
            return [float(s) for s in model.score(request["prompts"], request["responses"])]

    reward.__name__ = "longrm_reward"  # TRL logs each reward function under its name
    return reward


def async_reward_function(*, url: str, timeout: float = 180.0):
    """:func:`reward_function` of a server as a coroutine function (TRL awaits it beside its other rewards)."""
    import aiohttp  # noqa: PLC0415 - only the asynchronous client needs it

    endpoint = _score_url(url)

    async def reward(prompts, completions, **kwargs) -> list[float]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.post(endpoint, json=_request(prompts, completions)) as response:
                return _rewards(response.status, await response.json(), endpoint, len(completions))

    reward.__name__ = "longrm_reward"
    return reward
