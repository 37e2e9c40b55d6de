"""Session-wide fixtures: shared data location (fails loudly when missing), and deterministic
stand-ins for a policy, its tokenizer and a retriever (`scripted_policy`, `overlap_retriever`
are the classes, `passages` the toy corpus); fixtures rather than imports because the suite
runs with --import-mode=importlib.

The scripted tokenizer is character-level (one id per character), so expected token
sequences can be written down by hand and decode(encode(t)) == t holds exactly.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Callable, Optional

import pytest
from hypothesis import HealthCheck, settings

from coevo.core.types import Completion, SamplingParams
from evidence.corpus import Corpus, Passage
from evidence.retrieval import Hit

# Every property test runs under this profile: on two cores shared with a long run an example
# can stall for seconds, so no per-example deadline and no too_slow health check. A test's own
# @settings only changes what it names (usually max_examples), the rest comes from here.
settings.register_profile("coevo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("coevo")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`$COEVO_SHARED_DATA` (default ../shared/data); CI has it, so missing data is an error."""
    # Absolute: subprocess tests run commands from their own temporary directories.
    path = Path(os.environ.get("COEVO_SHARED_DATA", "../shared/data")).expanduser().resolve()
    if not (path / "wiki_mini" / "corpus.jsonl.gz").exists():
        pytest.fail(f"shared data not found at {path}: set COEVO_SHARED_DATA to the shared data directory")
    return path


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """The first 80 wiki_mini passages as a JSONL corpus (`corpus=jsonl corpus.path=…`): indexes build in seconds."""
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    with gzip.open(shared_data / "wiki_mini" / "corpus.jsonl.gz", "rt") as f, open(path, "w") as out:
        out.writelines(line for _, line in zip(range(80), f))
    return path


class CharTokenizer:
    eos_token = "<eos>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


Responder = Callable[[str, int], str]  # (prompt text, occurrence of that prompt in the batch) -> output


class ScriptedPolicy:
    """Answers each prompt with `responder(prompt_text, occurrence)`, cut like a real engine.

    Stop strings end the completion right after the first one (kept in the text);
    `max_new_tokens` truncates. Every generated token gets logprob -(position + 1) / 100 so
    tests can check that log-probs land at the right positions.
    """

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.tokenizer = CharTokenizer()
        self.generate_calls: list[int] = []  # batch size of each generate call
        self.frozen = False

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        return self.tokenizer.encode(text)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        self.generate_calls.append(len(prompts))
        seen: dict[str, int] = {}
        out = []
        for ids in prompts:
            prompt = self.tokenizer.decode(ids)
            occurrence = seen.get(prompt, 0)
            seen[prompt] = occurrence + 1
            out.append([self._complete(ids, self.responder(prompt, occurrence), sampling)])
        return out

    def _complete(self, prompt_ids: list[int], text: str, sampling: SamplingParams) -> Completion:
        finish = "eos"
        cuts = [text.find(s) + len(s) for s in sampling.stop if s in text]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        ids = self.tokenizer.encode(text)
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        logprobs = [-(i + 1) / 100 for i in range(len(ids))]
        return Completion(list(prompt_ids), ids, self.tokenizer.decode(ids), logprobs, finish)


PASSAGES = [
    Passage("p0", "Paris", "Paris is the capital of France."),
    Passage("p1", "Lyon", "Lyon is a city in France."),
    Passage("p2", "Berlin", "Berlin is the capital of Germany."),
    Passage("p3", "France", "France is a country in Europe whose capital is Paris."),
    Passage("p4", "Rhine", "The Rhine flows through Germany."),
    Passage("p5", "Alps", "The Alps are mountains in Europe."),
]


class WordOverlapRetriever:
    """Scores = number of shared lowercase words (title + text); ties in corpus order; > 0 only."""

    def __init__(self, passages: Optional[list[Passage]] = None) -> None:
        self.corpus = Corpus(passages or PASSAGES, name="fake")
        self.queries: list[list[str]] = []

    @staticmethod
    def _words(text: str) -> set[str]:
        return {w.strip(".,?").lower() for w in text.split()} - {""}

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.queries.append(list(queries))
        out = []
        for q in queries:
            scored = [(len(self._words(q) & self._words(f"{p.title} {p.text}")), i) for i, p in enumerate(self.corpus)]
            ranked = sorted((s for s in scored if s[0] > 0), key=lambda x: (-x[0], x[1]))[:k]
            out.append([Hit(self.corpus.passages[i].id, float(s)) for s, i in ranked])
        return out


@pytest.fixture
def scripted_policy() -> type[ScriptedPolicy]:
    return ScriptedPolicy


@pytest.fixture
def overlap_retriever() -> type[WordOverlapRetriever]:
    return WordOverlapRetriever


@pytest.fixture
def passages() -> list[Passage]:
    return list(PASSAGES)
