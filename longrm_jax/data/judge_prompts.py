"""The judge prompt of a generative reward model (Long-RewardBench, upstream-compatible): system prompts and the
user turn that shows the task prompt and the answers.

The texts are those of upstream LongRM's evaluator (an MT-Bench-style impartial-judge system prompt), kept
verbatim because a GRM trained on them is sensitive to every word. They live in the data layer because both sides
use them: the evaluator (``longrm_jax.evaluation.prompts``, which adds the verdict parsers) prompts a judge with
them, and the synthetic judge-training data (``longrm_jax.data.synthetic``) teaches a judge on exactly them.
"""

from __future__ import annotations

from collections.abc import Sequence

PAIR_SYSTEM_PROMPT = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants "
    "to the user questions. "
    "You should focus on who provides a better answer to the second user question. "
    "You should choose the assistant that follows the user's instructions and answers the user's question "
    "better. Your evaluation should consider "
    "factors such as the helpfulness, relevance, accuracy, depth, creativity, and level of detail of their "
    "responses. Begin your evaluation by "
    "comparing the two responses and provide a short explanation. Avoid any position biases and ensure that "
    "the order in which the responses were "
    "presented does not influence your decision. Do not allow the length of the responses to influence your "
    "evaluation. Do not favor certain names "
    "of the assistants. Be as objective as possible. After providing your explanation, output your final "
    "verdict by strictly following this format: "
    '"[[A]]" if assistant A is better, "[[B]]" if assistant B is better.'
)

RANK_SYSTEM_PROMPT_TEMPLATE = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by multiple AI "
    "assistants to the user's question. "
    "You should rank {number} responses based on their quality, with the highest quality response first, "
    "followed by the next best, and so on. "
    "Consider the following factors in your evaluation: helpfulness, relevance, accuracy, depth, creativity, "
    "and level of detail. "
    "Do not allow the order in which the responses were presented to influence your decision. "
    "Your ranking should be based purely on the overall quality of each response, not on the length or the "
    "name of the assistants. "
    "After evaluating the responses, please output the ranking of the assistants in the following format: "
    "{pattern}"
    "Please reply strictly in the following format, starting with [Analysis] and ending with patterns like "
    "{pattern}:\n"
    "[Analysis]\n(your analysis)\n[Ranking]\n(your ranking in the format of {pattern})"
)


def position_letter(position: int) -> str:
    """Letter naming the answer shown at ``position`` (0 -> "A")."""
    return chr(ord("A") + position)


def ranking_pattern(num_answers: int) -> str:
    """The example ranking shown to the judge, e.g. ``"[[A>B>C]]"`` for three answers."""
    return "[[" + ">".join(position_letter(i) for i in range(num_answers)) + "]]"


def judge_system_prompt(num_answers: int, kind: str) -> str:
    """System prompt for a ``kind`` in {"pair", "rank"} judgement of ``num_answers`` answers."""
    if kind == "rank":
        pattern = ranking_pattern(num_answers)
        return RANK_SYSTEM_PROMPT_TEMPLATE.format(number=num_answers, pattern=pattern)
    if kind != "pair":
        raise ValueError(f"judge kind must be 'pair' or 'rank', got {kind!r}")
    return PAIR_SYSTEM_PROMPT


def judge_user_prompt(question: str, shown_answers: Sequence[str]) -> str:
    """User turn: the task prompt then each answer in its shown order between Start/End markers."""
    parts = [f"[User Question]\n{question}"]
    for position, answer in enumerate(shown_answers):
        name = f"Assistant {position_letter(position)}'s Answer"
        parts.append(f"[The Start of {name}]\n{answer}\n[The End of {name}]")
    return "\n\n".join(parts)


def task_prompt_text(prompt_template: Sequence[dict]) -> str:
    """The task prompt a judge sees: the contents of the record's ``prompt_template`` joined by blank lines."""
    return "\n\n".join(message["content"] for message in prompt_template)


def judge_messages(prompt_template: Sequence[dict], shown_answers: Sequence[str], kind: str) -> list[dict]:
    """Chat messages [system, user] asking a GRM to judge ``shown_answers`` (already in shown order)."""
    if kind == "pair" and len(shown_answers) != 2:
        raise ValueError(f"a pairwise judgement needs 2 answers, got {len(shown_answers)}")
    return [
        {"role": "system", "content": judge_system_prompt(len(shown_answers), kind)},
        {"role": "user", "content": judge_user_prompt(task_prompt_text(prompt_template), shown_answers)},
    ]
