"""The ranker's prompt (docs/method.md §4.3), built to fit its token budget (docs/method.md §5.2).

A prompt over budget is never cut from the head (that loses the instructions, the question
and the first candidates while indices 1..N still parse): `fit_prompt` shortens every
candidate text to one common length instead, the longest that fits, and a prompt that does
not fit even with empty candidate texts is a PromptBudgetError naming the keys.
"""
from __future__ import annotations

from typing import Callable, Sequence

from coevo.core.budget import PromptBudgetError
from solver.reward import PassageLike

RANKER_SYSTEM = (
    "You rank search results. You get a question, the search query written for it and numbered "
    "candidate passages. Pick the {k} passages most useful for answering the question, best first. "
    "First explain briefly inside <reason> and </reason>. Then write exactly {k} distinct candidate "
    "numbers inside <rerank> and </rerank>, separated by >, for example: <rerank>{example}</rerank>. "
    "Write nothing after </rerank>."
)
# `ranker.reasoning=false`: the same task without the <reason> block (small models).
RANKER_SYSTEM_NO_REASON = (
    "You rank search results. You get a question, the search query written for it and numbered "
    "candidate passages. Pick the {k} passages most useful for answering the question, best first. "
    "Write exactly {k} distinct candidate numbers inside <rerank> and </rerank>, separated by >, "
    "for example: <rerank>{example}</rerank>. Write nothing else."
)


def _truncate(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rstrip() + "…"


# One demonstrated call (small models copy the format from it); its ranking has min(k, 6) entries.
DEMO_CANDIDATES = (
    ("Hamlet (film)", "Hamlet is a 1948 British film adaptation of the play, directed by Laurence Olivier."),
    ("Hamlet", "The Tragedy of Hamlet, Prince of Denmark, is a tragedy written by William Shakespeare."),
    ("Shakespeare's plays", "William Shakespeare wrote about 39 plays, among them Hamlet and Macbeth."),
    ("Denmark", "Denmark is a Nordic country in Northern Europe."),
    ("Elsinore", "Kronborg castle in Helsingor is the setting of the play Hamlet."),
    ("Prince", "A prince is a male ruler or a member of a monarch's family."),
)
DEMO_ORDER = (2, 3, 5, 1, 4, 6)


def _ranker_user(q0: str, sub_query: str, numbered: list[str], k: int) -> str:
    return (f"Question: {q0}\nSearch query: {sub_query}\n\nCandidates:\n" + "\n".join(numbered)
            + f"\n\nRank the {k} most useful candidates.")


def ranker_messages(q0: str, sub_query: str, candidates: Sequence[PassageLike], k: int,
                    passage_chars: int = 300, reasoning: bool = True) -> list[dict]:
    """Chat messages of one ranker call: instructions, one demonstrated call, then q0, the
    sub-query and the numbered candidates truncated to `passage_chars`. Without `reasoning`
    the instructions and the demonstration ask for the <rerank> block alone."""
    example = " > ".join(f"[{i}]" for i in (3, 1, 2, 5, 4)[:k])
    demo_k = min(k, len(DEMO_ORDER))
    demo_user = _ranker_user("Who wrote the play Hamlet?", "Hamlet play author",
                             [f"[{i}] ({t}) {x}" for i, (t, x) in enumerate(DEMO_CANDIDATES, 1)], demo_k)
    demo_answer = ("<reason>Candidate [2] names the author of Hamlet.</reason>\n" if reasoning else "") + (
        "<rerank>" + " > ".join(f"[{i}]" for i in DEMO_ORDER[:demo_k]) + "</rerank>")
    lines = [f"[{i}] ({p.title}) {_truncate(p.text, passage_chars)}" for i, p in enumerate(candidates, 1)]
    system = RANKER_SYSTEM if reasoning else RANKER_SYSTEM_NO_REASON
    return [{"role": "system", "content": system.format(k=k, example=example)},
            {"role": "user", "content": demo_user}, {"role": "assistant", "content": demo_answer},
            {"role": "user", "content": _ranker_user(q0, sub_query, lines, k)}]


MAX_FIT_RENDERS = 12  # prompts rendered to find the cut; the search halves its interval every second one


def fit_prompt(render: Callable[[int], list[int]], passage_chars: int, budget: int, what: str) -> tuple[list[int], int]:
    """(prompt ids, characters kept per candidate text) for the longest common cut <= `passage_chars` within `budget`.

    `render(chars)` builds the whole prompt with every candidate text cut to `chars` characters;
    its length grows with `chars`, about linearly, so the search interpolates (odd renders) and
    bisects (even ones). `what` names the budget's keys in the error.
    """
    ids = render(passage_chars)
    if len(ids) <= budget:
        return ids, passage_chars
    floor = render(0)
    if len(floor) > budget:
        raise PromptBudgetError(
            f"ranker prompt needs {len(floor)} tokens with every candidate text cut to nothing (instructions, "
            f"question, sub-query and the candidates' titles), over {what}; expected a budget that holds them: "
            "raise it or lower ranker.n_candidates")
    lo, hi, f_lo, f_hi, best = 0, passage_chars, len(floor), len(ids), floor
    for i in range(MAX_FIT_RENDERS):
        if hi - lo <= 1:
            break
        guess = lo + (budget - f_lo) * (hi - lo) // max(1, f_hi - f_lo) if i % 2 == 0 else (lo + hi) // 2
        guess = min(max(guess, lo + 1), hi - 1)
        prompt = render(guess)
        if len(prompt) <= budget:
            lo, f_lo, best = guess, len(prompt), prompt
        else:
            hi, f_hi = guess, len(prompt)
    return best, lo
