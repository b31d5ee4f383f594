"""Judge prompts and verdict parsers for generative reward models (Long-RewardBench, upstream-compatible).

The prompt texts and builders live in ``longrm_jax.data.judge_prompts`` (the synthetic judge-training data uses
them too) and are re-exported here, the evaluator's one import point. The parsers reproduce upstream's rules,
quirks included, so that accuracies are comparable:

* pairwise: ``"[[A]]"`` anywhere in the text -> A is better; else ``"[[B]]"`` -> B is better; else no verdict
  (scored wrong). ``"[[A]]"`` wins when both appear.
* Best-of-N: the first single-bracketed run of word characters separated by ``>`` (so ``"[[A>C>B]]"``,
  ``"[A > C > B]"`` and ``"[Assistant A > Assistant C > Assistant B]"`` all parse); the words ``assistant``,
  ``Assistant``, colons and spaces are removed from each item, every item must then be one capital letter and
  every shown position must appear. A text with more than nine ``>`` characters is rejected outright
  (upstream's guard against runaway generations).

All "ranks" here are *per shown position*: ``ranks[j]`` is the predicted rank (0 = best) of the answer shown
at position j (letter ``chr(65 + j)``). An empty list means "no verdict".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from longrm_jax.data.judge_prompts import (  # noqa: F401 - re-exported: the evaluator's judge prompt API
    PAIR_SYSTEM_PROMPT,
    RANK_SYSTEM_PROMPT_TEMPLATE,
    judge_messages,
    judge_system_prompt,
    judge_user_prompt,
    position_letter,
    ranking_pattern,
    task_prompt_text,
)

# Upstream rejects a ranking text with more than this many '>' characters.
_MAX_RANK_SEPARATORS = 9
# A single-bracketed list of word/space runs joined by '>' (upstream's pattern, matched leftmost first).
_RANKING_RE = re.compile(r"\[[\w\s]+(?:\s*>\s*[\w\s]+)+\]")
_RANK_ITEM_NOISE = ("assistant", "Assistant", ":", " ")


def parse_pairwise_verdict(text: str) -> list[int]:
    """``[0, 1]`` if the text holds ``[[A]]``, else ``[1, 0]`` if it holds ``[[B]]``, else ``[]``."""
    if "[[A]]" in text:
        return [0, 1]
    if "[[B]]" in text:
        return [1, 0]
    return []


def parse_ranking_verdict(text: str, num_answers: int | None = None) -> list[int]:
    """Per-position ranks from the first ``[X>Y>...]`` ranking in ``text``; ``[]`` when unparsable.

    ``num_answers`` (when given) additionally requires exactly that many distinct letters; upstream does not
    check the count beyond requiring every position 0..len-1 to be named, so by default neither do we.
    """
    if text.count(">") > _MAX_RANK_SEPARATORS:
        return []
    match = _RANKING_RE.search(text)
    if match is None:
        return []
    items = match.group(0).split(">")
    for noise in _RANK_ITEM_NOISE:
        items = [item.replace(noise, "") for item in items]
    items[0] = items[0].strip("[")
    items[-1] = items[-1].strip("]")
    # Each item must now be exactly one capital letter naming a position.
    if any(len(item) != 1 or not ("A" <= item <= "Z") for item in items):
        return []
    positions_in_rank_order = [ord(item) - ord("A") for item in items]
    try:
        ranks = [positions_in_rank_order.index(p) for p in range(len(positions_in_rank_order))]
    except ValueError:  # a position is missing (e.g. "A>C" or a repeated letter)
        return []
    if num_answers is not None and (len(items) != num_answers or len(set(items)) != num_answers):
        return []
    return ranks


def parse_verdict(text: str, kind: str, num_answers: int | None = None) -> list[int]:
    """Dispatch to the pairwise or ranking parser (``kind`` in {"pair", "rank"})."""
    if kind == "pair":
        return parse_pairwise_verdict(text)
    return parse_ranking_verdict(text, num_answers)


def ranks_from_scores(scores_shown: Sequence[float]) -> list[int]:
    """Per-position ranks from scalar scores in shown order: higher score -> better rank; ties keep shown order.

    This is the DisRM ranking: a stable descending sort, so on an exact tie the earlier shown answer wins.
    """
    by_rank = sorted(range(len(scores_shown)), key=lambda p: scores_shown[p], reverse=True)
    return [by_rank.index(p) for p in range(len(scores_shown))]


def verdict_letter_index(text: str, kind: str) -> int | None:
    """Character offset of the verdict's first letter in ``text`` (the letter whose probability AUC uses).

    Pairwise: the ``A``/``B`` inside the ``[[A]]``/``[[B]]`` that the parser took. Ranking: the first letter of
    the parsed ranking. ``None`` when the parser finds no verdict.
    """
    if kind == "pair":
        for token in ("[[A]]", "[[B]]"):
            at = text.find(token)
            if at >= 0:
                return at + 2
        return None
    if not parse_ranking_verdict(text):
        return None
    match = _RANKING_RE.search(text)
    assert match is not None
    for offset, char in enumerate(match.group(0)):
        if "A" <= char <= "Z" and not match.group(0)[offset:].startswith("Assistant"):
            return match.start() + offset
    return None
