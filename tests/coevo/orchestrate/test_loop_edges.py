"""Edge cases of one co-evolution step on real policies with scripted generation
(`scripted_run`, tests/coevo/orchestrate/conftest.py, which spells out the default script):
nothing accepted, every rollout correct, a solver format violation, malformed ranker output.
The shared backbone's single update per step is in test_ablations.py.
"""
import pytest

FIRST_STAGE_TOP3 = ["p0", "p2", "p3"]  # "capital of France" over the toy corpus


def test_every_candidate_rejected_trains_nothing(scripted_run):
    run = scripted_run(proposer=lambda prompt, occ: "Atlantis</target>")
    start = {p.role: run.weights(p) for p in run.policies()}
    records, metrics = run.step()
    assert [(r["stage"], r["reason"], r["proposer_reward"]) for r in records] == [
        ("target", "no_corpus_support", -0.5)] * 2
    assert all(r["task_id"] is None and r["rollouts"] == [] and r["accuracy"] is None for r in records)
    # no question asked, no episode, no search
    assert len(run.actors.proposer.engine.prompts) == 1
    assert run.actors.solver.engine.prompts == [] and run.actors.ranker.engine.prompts == []
    assert run.actors.retrieval.queries == []
    assert metrics["acceptance"] == {"target": 0.0, "path": 0.0, "task": 0.0}
    assert metrics["reward"] == {"proposer": -0.5, "solver": None, "ranker": None}
    # a zero-variance proposer group and empty solver/ranker batches: no update call at all
    assert metrics["update"]["proposer"] == {"skipped": True, "n_seqs": 0, "groups": 1, "zero_var_groups": 1,
                                             "zero_var_share": 1.0, "mean_group_size": 2.0}
    assert metrics["update"]["solver"]["skipped"] and metrics["update"]["ranker"]["skipped"]
    for policy in run.policies():
        assert run.update_calls(policy) == [] and run.unchanged(policy, start[policy.role])


def _answers_paris(searches_first: bool):
    def reply(prompt, occ):
        episode = prompt.rsplit("Question: ", 1)[1]
        if searches_first and occ == 0 and "</information>" not in episode:
            return "<search>capital of France</search>"
        return "<answer>Paris</answer>"
    return reply


def test_every_rollout_correct_is_a_zero_variance_solver_group(scripted_run):
    run = scripted_run(solver=_answers_paris(searches_first=False))
    solver_start = run.weights(run.actors.solver)
    records, metrics = run.step()
    paris = records[0]
    assert [(ro["correctness"], ro["reward"], ro["n_searches"]) for ro in paris["rollouts"]] == [(1.0, 1.0, 0)] * 2
    # p = 1: too easy, proposer reward 1 - |2p - 1| = 0, still above the invalid -0.5
    assert paris["accuracy"] == 1.0 and paris["proposer_reward"] == 0.0
    assert metrics["update"]["solver"]["zero_var_groups"] == 1 and metrics["update"]["solver"]["n_seqs"] == 0
    assert run.update_calls(run.actors.solver) == [] and run.unchanged(run.actors.solver, solver_start)
    # the proposer group [0, -0.5] has variance: +-0.707 on call 1 of both, call 2 of Paris
    assert run.advantages(run.actors.proposer) == [[0.707, 0.707, -0.707]]


def test_every_rollout_correct_with_unequal_searches_still_teaches_the_tool_cost(scripted_run):
    run = scripted_run(solver=_answers_paris(searches_first=True))
    records, metrics = run.step()
    # rollout 0 searched once, rollout 1 never: 1 - 0.2 * (1 - 0) / (1 - 0) = 0.8 against 1.0
    assert [(ro["correctness"], ro["reward"]) for ro in records[0]["rollouts"]] == [(1.0, 0.8), (1.0, 1.0)]
    assert records[0]["accuracy"] == 1.0
    assert run.advantages(run.actors.solver) == [[-0.707, 0.707]]


def _violates_after_berlin(prompt, occ):
    episode = prompt.rsplit("Question: ", 1)[1]
    if "</information>" not in episode:
        return "<search>capital of France</search>"
    title = prompt.rsplit("<information>Doc 1 (Title: ", 1)[1].split(")")[0]
    return "Berlin, I think." if title == "Berlin" else f"<answer>{title}</answer>"


def test_solver_format_violation(scripted_run):
    """Rollout 0 reads Berlin first (the ranker's order) and writes no action; rollout 1 answers."""
    run = scripted_run(solver=_violates_after_berlin)
    records, metrics = run.step()
    bad, good = records[0]["rollouts"]
    assert (bad["format_ok"], bad["end_reason"], bad["answer"], bad["correctness"], bad["reward"]) == (
        False, "no_action", None, 0.0, -0.2)
    assert (good["format_ok"], good["answer"], good["reward"]) == (True, "Paris", 1.0)
    assert records[0]["accuracy"] == 0.5 and metrics["solver"]["format_valid"] == 0.5
    # the violation is trained against: episode order, -alpha against 1.0
    assert run.advantages(run.actors.solver) == [[-0.707, 0.707]]
    # its ranker call is rewarded (r_rel 0.5, not above gamma: reward r_rel) but grouped with nothing;
    # rollout 1's call alone is below ranker.min_group_size=2: no ranker group, no ranker update
    bad_call, good_call = bad["ranker_calls"][0], good["ranker_calls"][0]
    assert (bad_call["reward"], bad_call["group_id"]) == (0.5, None)
    assert (good_call["reward"], good_call["group_id"]) == (-0.2, None)
    assert metrics["update"]["ranker"]["groups"] == 0 and run.update_calls(run.actors.ranker) == []


@pytest.mark.parametrize("malformed,reason", [
    ("no idea", "no_rerank_tag"),
    ("<reason>a</reason><rerank>[1] > [9] > [2]</rerank>", "index_out_of_range"),
    ("<reason>a</reason><rerank>[3] > [1]</rerank>", "wrong_count"),
])
def test_malformed_ranker_output_falls_back_to_the_first_stage_with_the_penalty(scripted_run, malformed, reason):
    rankings = ["<reason>Berlin first</reason><rerank>[2] > [1] > [3]</rerank>", malformed]
    run = scripted_run(ranker=lambda prompt, occ: rankings[occ], overrides=("ranker.format_penalty=0.3",))
    records, metrics = run.step()
    ok_call, bad_call = (ro["ranker_calls"][0] for ro in records[0]["rollouts"])
    assert (bad_call["format_ok"], bad_call["reason"], bad_call["output"]) == (False, reason, malformed)
    assert bad_call["chosen_ids"] == FIRST_STAGE_TOP3 and bad_call["reward"] == -0.3
    assert ok_call["chosen_ids"] == ["p2", "p0", "p3"] and ok_call["format_ok"]
    # the solver read the fallback order (Doc 1 = Paris) after the malformed call
    assert [ro["answer"] for ro in records[0]["rollouts"]] == ["Berlin", "Paris"]
    assert metrics["ranker"]["format_valid"] == 0.5
    # the malformed call is trained against (rewards 0.5 and -0.3 in one group)
    assert run.advantages(run.actors.ranker) == [[0.707, -0.707]]
