"""One co-evolution step with scripted policies: rewards, dump records and updates by hand."""
from types import SimpleNamespace

import pytest

from coevo.core.config import compose, to_object
from coevo.core.types import EvidencePath, Hop, Verdict
from coevo.orchestrate.loop import coevolution_step


class FakeEvidence:
    """Targets named 'Atlantis' have no corpus support; every other target gets one 1-hop path."""

    def validate_targets(self, targets, references):
        return [Verdict(True, "ok", ("p0",)) if t != "Atlantis" else Verdict(False, "no_corpus_support")
                for t in targets]

    def build_paths(self, targets, seed):
        hop = Hop("France", "Paris", "Paris is the capital of France.", "p0", "Paris", 1.0, "relation")
        return [[EvidencePath(t, (hop,))] for t in targets]

    def validate_questions(self, questions, targets, paths):
        assert all(isinstance(p, EvidencePath) for p in paths)  # typed across the actor boundary
        return [Verdict(True, "ok", tuple(p.evidence_ids)) if t.lower() not in q.lower()
                else Verdict(False, "leaks_target", (), t) for q, t, p in zip(questions, targets, paths)]


def _proposer_reply(prompt: str, occurrence: int) -> str:
    if "Target answer" in prompt:
        return "Which city is the capital of France?</question>"  # the prompt primes "<question>"
    return ["Paris</target>", "Atlantis</target>"][occurrence % 2]


def _solver_reply(prompt: str, occurrence: int) -> str:
    if "<information>" in prompt.rsplit("Question:", 1)[-1]:  # an observation came back
        return "<answer>Paris</answer>"
    return "<search>capital of France</search>" if occurrence == 0 else "<answer>Lyon</answer>"


def _ranker_reply(prompt: str, occurrence: int) -> str:
    return "<reason>the first fits</reason><rerank>[1] > [2] > [3]</rerank>"


class Recorder:
    def __init__(self, policy):
        self.policy, self.batches = policy, []
        self.tokenizer, self.frozen = policy.tokenizer, False

    def chat_prompt_ids(self, messages):
        return self.policy.chat_prompt_ids(messages)

    def generate(self, prompts, sampling):
        if sampling.n == 1:
            return self.policy.generate(prompts, sampling)
        # n samples of one prompt = the responder's successive occurrences of that prompt
        decode, respond = self.policy.tokenizer.decode, self.policy.responder
        return [[self.policy._complete(p, respond(decode(p), i), sampling) for i in range(sampling.n)]
                for p in prompts]

    def update(self, batch):
        self.batches.append(batch)
        return {"n_seqs": len(batch)}


def run_step(scripted_policy, overlap_retriever, references=((0, "who wrote hamlet"),), overrides=()):
    cfg = to_object(compose(["experiment=smoke", "proposer.group_size=2", "solver.group_size=2",
                             "ranker.top_k=3", "ranker.n_candidates=4", "ranker.min_group_size=1",
                             "proposer.max_new_tokens=200", "solver.max_new_tokens=200", "ranker.max_new_tokens=200",
                             "solver.max_episode_tokens=4000", "solver.max_prompt_tokens=4000", *overrides]))
    proposer = Recorder(scripted_policy(_proposer_reply))
    solver = Recorder(scripted_policy(_solver_reply))
    ranker = Recorder(scripted_policy(_ranker_reply))
    actors = SimpleNamespace(proposer=proposer, solver=solver, ranker=ranker, retrieval=overlap_retriever(),
                             evidence=FakeEvidence(),
                             trainable={"proposer": proposer, "solver": solver, "ranker": ranker})
    records, metrics, _ = coevolution_step(0, list(references), actors, cfg, seed=1, progress=lambda s: None)
    return records, metrics, actors


@pytest.fixture()
def step_result(scripted_policy, overlap_retriever):
    return run_step(scripted_policy, overlap_retriever)


def test_stage_verdicts_and_rewards(step_result):
    records, metrics, _ = step_result
    paris, atlantis = records
    assert paris["accepted"] and paris["target"] == "Paris" and paris["evidence_path"]["evidence_ids"] == ["p0"]
    assert atlantis["reason"] == "no_corpus_support" and atlantis["stage"] == "target"
    # rollout 0 searches once then answers Paris (correct); rollout 1 answers Lyon (wrong)
    assert [r["rollout_idx"] for r in paris["rollouts"]] == [0, 1]
    assert [r["correctness"] for r in paris["rollouts"]] == [1.0, 0.0]
    assert [r["n_searches"] for r in paris["rollouts"]] == [1, 0]
    assert [r["reward"] for r in paris["rollouts"]] == [1.0, 0.0]
    assert paris["accuracy"] == 0.5 and paris["proposer_reward"] == 1.0  # 1 - |2*0.5 - 1|
    assert atlantis["proposer_reward"] == -0.5 and atlantis["rollouts"] == []
    assert metrics["acceptance"] == {"target": 0.5, "path": 0.5, "task": 0.5}
    assert metrics["reasons"] == {"no_corpus_support": 1}


def test_ranker_call_recorded_and_rewarded(step_result):
    records, metrics, _ = step_result
    call = records[0]["rollouts"][0]["ranker_calls"][0]
    assert call["format_ok"] and call["candidate_ids"][0] == "p0" and call["chosen_ids"][0] == "p0"
    # I_ans=1 (p0 contains "Paris"), r_rel = mean(Hit@1, Hit@3) = 1 > gamma -> r_rel + r_main = 2
    assert call["i_ans"] and call["r_rel"] == 1.0 and call["reward"] == 2.0
    assert metrics["ranker"]["calls"] == 1


def test_updates_get_group_normalized_advantages(step_result):
    _, metrics, actors = step_result
    (prop_batch,) = actors.proposer.batches
    # proposer group [1.0, -0.5]: unbiased std = 1.0607 -> advantages +-0.7071;
    # call 1 + call 2 of Paris, call 1 of Atlantis
    advs = sorted(round(s.advantage, 3) for s in prop_batch)
    assert advs == [-0.707, 0.707, 0.707]
    (solver_batch,) = actors.solver.batches
    assert sorted(round(s.advantage, 3) for s in solver_batch) == [-0.707, 0.707]
    for seq in solver_batch:
        assert len(seq.input_ids) == len(seq.loss_mask) == len(seq.old_logprobs)
    # one-call group: zero variance
    assert actors.ranker.batches == [] or all(len(b) == 0 for b in actors.ranker.batches)
    assert metrics["update"]["ranker"]["zero_var_groups"] == 1


def test_repeated_reference_questions_keep_every_accepted_task(scripted_policy, overlap_retriever):
    """A short question file cycled gives a step the same reference twice (same ref_index): both
    accepted "Paris" candidates must be solved and rewarded, not collide in one task id."""
    refs = [(0, "who wrote hamlet"), (0, "who wrote hamlet")]
    records, metrics, actors = run_step(scripted_policy, overlap_retriever, refs)
    assert [r["target"] for r in records] == ["Paris", "Atlantis", "Paris", "Atlantis"]
    assert [r["task_id"] for r in records] == ["s0-q0-c0", None, "s0-q0-c2", None]
    first, second = records[0], records[2]
    assert len(first["rollouts"]) == len(second["rollouts"]) == 2
    # each task's own rollouts; none of them gets the invalid penalty
    assert first["accuracy"] is not None and second["accuracy"] is not None
    assert first["proposer_reward"] >= 0.0 and second["proposer_reward"] >= 0.0
    assert metrics["acceptance"]["task"] == 0.5


def test_keep_zero_advantage_keeps_the_zero_variance_ranker_group(scripted_policy, overlap_retriever):
    # The one ranker call forms a one-call group (zero variance): dropped by default, kept with the option.
    _, metrics, actors = run_step(scripted_policy, overlap_retriever, overrides=["ranker.keep_zero_advantage=true"])
    (ranker_batch,) = actors.ranker.batches
    assert [s.advantage for s in ranker_batch] == [0.0]
    assert metrics["update"]["ranker"]["zero_var_groups"] == 1 and metrics["update"]["ranker"]["n_seqs"] == 1
    # the other roles' batches are unchanged (their groups have variance)
    (solver_batch,) = actors.solver.batches
    assert sorted(round(s.advantage, 3) for s in solver_batch) == [-0.707, 0.707]
