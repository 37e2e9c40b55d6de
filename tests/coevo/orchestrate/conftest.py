"""A co-evolution step with real policies whose generation follows a script (`scripted_run`).

`create_local_actors` wires the actors from a composed experiment (`experiment=[smoke,<preset>]`)
as `coevo.run ray.local=true` does, with three changes: every policy loads the tiny byte-level
BPE model (decode(encode(t)) == t, so a script can read its prompts), each policy's engine is a
`ScriptedEngine`, and the spaCy evidence stage and the first-stage index are the deterministic
`FakeEvidence` and `WordOverlapRetriever`. Weights, optimizers, `Policy.update`, frozen flags,
the trainable set and the shared-backbone wiring are the real ones, so a test can check what an
ablation does to them.

The default script, one reference question, proposer.group_size 2, solver.group_size 2:
- proposer call 1: "Paris" (accepted) and "Atlantis" (no corpus support); call 2 a question;
- solver turn 1: both rollouts search "capital of France" (first stage: p0 p2 p3 p1, top-3
  p0 p2 p3); turn 2: answer with the title of Doc 1;
- ranker: rollout 0's call ranks [2] > [1] > [3] (Berlin first: a wrong answer), rollout 1's
  call is malformed (first-stage fallback: Paris, a right one).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch

from coevo.core.config import CoevoConfig, compose, to_object
from coevo.core.types import Completion, EvidencePath, Hop, SamplingParams, Verdict

Reply = Callable[[str, int], str]  # (decoded prompt, occurrence of that prompt in the call) -> output


class FakeEvidence:
    """Targets named 'Atlantis' have no corpus support; every other target gets one 1-hop path
    through p0; a question that names its target leaks it."""

    def validate_targets(self, targets: list[str], references: list[str]) -> list[Verdict]:
        return [Verdict(True, "ok", ("p0",)) if t != "Atlantis" else Verdict(False, "no_corpus_support")
                for t in targets]

    def build_paths(self, targets: list[str], seed: int) -> list[list[EvidencePath]]:
        hop = Hop("France", "Paris", "Paris is the capital of France.", "p0", "Paris", 1.0, "relation")
        return [[EvidencePath(t, (hop,))] for t in targets]

    def validate_questions(self, questions: list[str], targets: list[str], paths: list[Any]) -> list[Verdict]:
        return [Verdict(True, "ok", tuple(p.evidence_ids)) if t.lower() not in q.lower()
                else Verdict(False, "leaks_target", (), t) for q, t, p in zip(questions, targets, paths)]


class ScriptedEngine:
    """A `GenerationEngine` whose output is `reply(prompt text, occurrence)`; records what it was asked.

    The n samples of one prompt are its occurrences 0..n-1, as are identical prompts in one
    batch. Completions carry no log-probs, so `Policy.update` computes the old ones itself.
    """

    def __init__(self, tokenizer: Any, reply: Reply) -> None:
        self.tokenizer, self.reply = tokenizer, reply
        self.prompts: list[str] = []

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        seen: Counter[str] = Counter()
        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            self.prompts.append(text)
            completions = []
            for _ in range(sampling.n):
                reply = self.reply(text, seen[text])
                seen[text] += 1
                finish = "stop" if any(reply.endswith(s) for s in sampling.stop) else "eos"
                tokens = list(self.tokenizer.encode(reply, add_special_tokens=False))
                completions.append(Completion(list(ids), tokens, reply, None, finish))
            out.append(completions)
        return out

    def sync_weights(self, model: Any) -> None:
        pass  # generation never reads the weights


def proposer_reply(prompt: str, occurrence: int) -> str:
    if prompt.endswith("<question>"):  # call 2 (the prompt primes the opening tag)
        return "Which city is the capital of France?</question>"
    return ["Paris</target>", "Atlantis</target>"][occurrence % 2]


def is_ranker_prompt(prompt: str) -> bool:
    return "Candidates:" in prompt


def episode_text(prompt: str) -> str:
    """The solver prompt after its last "Question: ": this episode's turns (not the demonstration's)."""
    return prompt.rsplit("Question: ", 1)[1]


def first_doc_title(prompt: str) -> str:
    return prompt.rsplit("<information>Doc 1 (Title: ", 1)[1].split(")")[0]


def solver_reply(prompt: str, occurrence: int) -> str:
    if "</information>" not in episode_text(prompt):
        return "<search>capital of France</search>"
    return f"<answer>{first_doc_title(prompt)}</answer>"


RANKINGS = ["<reason>Berlin first</reason><rerank>[2] > [1] > [3]</rerank>", "no idea"]


def ranker_reply(prompt: str, occurrence: int) -> str:
    return RANKINGS[occurrence % len(RANKINGS)]


def solver_or_ranker(solver: Reply, ranker: Reply) -> Reply:
    """One engine for a shared backbone: ranker prompts go to `ranker`, the rest to `solver`."""
    return lambda prompt, occ: ranker(prompt, occ) if is_ranker_prompt(prompt) else solver(prompt, occ)


@dataclass
class ScriptedRun:
    cfg: CoevoConfig
    actors: Any
    updates: dict[int, list[list]] = field(default_factory=dict)  # id(policy) -> the batch of each update call

    def policies(self) -> list[Any]:
        """Distinct policy objects (a shared backbone's solver and ranker are one)."""
        found = [self.actors.proposer, self.actors.solver, self.actors.ranker]
        return list({id(p): p for p in found if p is not None}.values())

    def step(self, step: int = 0, references: tuple = ((0, "who wrote hamlet"),)) -> tuple[list[dict], dict]:
        from coevo.orchestrate.loop import coevolution_step

        outcome = coevolution_step(step, list(references), self.actors, self.cfg, seed=1, progress=lambda s: None)
        return outcome.records, outcome.metrics

    def update_calls(self, policy: Any) -> list[int]:
        """Batch size of each `update` call made on `policy`."""
        return [len(b) for b in self.updates.get(id(policy), [])]

    def advantages(self, policy: Any) -> list[list[float]]:
        """Advantages of each batch `policy` was updated on, rounded to 3 digits."""
        return [[round(s.advantage, 3) for s in b] for b in self.updates.get(id(policy), [])]

    @staticmethod
    def ranker_calls(records: list[dict]) -> list[dict]:
        """Every ranker call record of a step's task dump, task by task, rollout by rollout."""
        return [c for r in records for ro in r["rollouts"] for c in ro["ranker_calls"]]

    @staticmethod
    def ranker_prompts(policy: Any) -> int:
        """How many ranker prompts `policy`'s engine answered."""
        return sum(is_ranker_prompt(p) for p in policy.engine.prompts)

    @staticmethod
    def weights(policy: Any) -> list[torch.Tensor]:
        return [p.detach().clone() for p in policy.model.parameters()]

    @staticmethod
    def unchanged(policy: Any, start: list[torch.Tensor]) -> bool:
        return all(torch.equal(a, b) for a, b in zip(start, policy.model.parameters()))


@pytest.fixture
def scripted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prompt_bpe_dir: Path, passages: list,
                 overlap_retriever: type) -> Callable[..., ScriptedRun]:
    """`scripted_run(experiments, overrides, proposer=, solver=, ranker=)`: actors ready for `.step()`."""
    import coevo.orchestrate.actors as actors_mod

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in passages))
    monkeypatch.setattr(actors_mod, "EvidenceWorker", lambda cfg, **kwargs: FakeEvidence())
    monkeypatch.setattr(actors_mod, "build_retriever", lambda corpus, retrieval: overlap_retriever())

    def build(experiments: tuple[str, ...] = (), overrides: tuple[str, ...] = (), proposer: Reply = proposer_reply,
              solver: Reply = solver_reply, ranker: Optional[Reply] = ranker_reply) -> ScriptedRun:
        sizes = ["proposer.group_size=2", "solver.group_size=2", "ranker.n_candidates=4", "ranker.top_k=3",
                 "ranker.min_group_size=2", "solver.max_searches=2", "solver.max_turns=3",
                 "solver.max_episode_tokens=20000"]
        roles = [f"{r}.{k}" for r in ("proposer", "solver", "ranker")
                 for k in (f"model={prompt_bpe_dir}", "max_new_tokens=200", "max_prompt_tokens=20000")]
        cfg = to_object(compose([f"experiment=[{','.join(['smoke', *experiments])}]", "corpus=jsonl",
                                 f"corpus.path={corpus}", *sizes, *roles, *overrides]))
        actors = actors_mod.create_local_actors(cfg)
        run = ScriptedRun(cfg, actors)
        shared = actors.ranker is actors.solver
        engines = {"proposer": proposer, "solver": solver_or_ranker(solver, ranker) if shared else solver,
                   "ranker": ranker}
        for role, reply in engines.items():
            policy = getattr(actors, role)
            if policy is None or (role == "ranker" and shared):
                continue
            policy.engine = ScriptedEngine(policy.tokenizer, reply)
        for policy in run.policies():
            policy.update = _counting(policy.update, run.updates.setdefault(id(policy), []))
        return run

    return build


def _counting(update: Callable[[list], dict], batches: list[list]) -> Callable[[list], dict]:
    def counted(batch: list) -> dict:
        batches.append(list(batch))
        return update(batch)
    return counted
