"""What each experiment preset does to a co-evolution step, checked on its behaviour (weights,
updates, what was generated, what the solver saw), not on the config it echoes.

Real policies with scripted generation (`scripted_run`, tests/coevo/orchestrate/conftest.py);
the scenario and its first-stage results are written out there.
"""
import pytest

FIRST_STAGE = ["p0", "p2", "p3", "p1"]  # "capital of France" over the toy corpus, best first


def test_default_step_updates_every_role(scripted_run):
    """The control for every test below: without an ablation all three policies move."""
    run = scripted_run()
    start = {p.role: run.weights(p) for p in run.policies()}
    _, metrics = run.step()
    for policy in run.policies():
        assert run.update_calls(policy) == [metrics["update"][policy.role]["n_seqs"]]
        assert not run.unchanged(policy, start[policy.role]), policy.role
    assert [metrics["update"][r]["n_seqs"] for r in ("proposer", "solver", "ranker")] == [3, 2, 2]


@pytest.mark.parametrize("experiment,role", [("frozen_proposer", "proposer"), ("fixed_ranker", "ranker")])
def test_frozen_role_generates_but_never_moves(scripted_run, experiment, role):
    """frozen_proposer / fixed_ranker: the role still writes what the step uses, its groups have
    variance (the control above updates it), yet its weights stay and it is never updated."""
    run = scripted_run((experiment,))
    policy = getattr(run.actors, role)
    start = run.weights(policy)
    records, metrics = run.step()
    assert policy.engine.prompts  # it generated
    if role == "proposer":
        assert [r["target"] for r in records] == ["Paris", "Atlantis"]
        assert [r["proposer_reward"] for r in records] == [1.0, -0.5]  # a group with variance
    else:
        calls = run.ranker_calls(records)
        assert calls[0]["chosen_ids"] == ["p2", "p0", "p3"]  # its ranking is what the solver read
        assert [c["reward"] for c in calls] == [0.5, -0.2] and calls[0]["group_id"] is not None
    assert role not in run.actors.trainable and role not in metrics["update"]
    assert run.update_calls(policy) == []
    assert run.unchanged(policy, start)
    others = [p for p in run.policies() if p is not policy]
    assert all(len(run.update_calls(p)) == 1 for p in others)  # the other roles still train


def test_retrieval_only_shows_the_first_stage_top_k_and_generates_nothing(scripted_run):
    run = scripted_run(("retrieval_only",))
    assert run.actors.ranker is None and "ranker" not in run.actors.trainable
    records, metrics = run.step()
    calls = run.ranker_calls(records)
    assert len(calls) == 2
    for call in calls:
        assert call["mode"] == "none" and call["output"] == "" and call["group_id"] is None
        assert call["candidate_ids"] == FIRST_STAGE and call["chosen_ids"] == FIRST_STAGE[:3]
    assert run.ranker_prompts(run.actors.solver) == 0
    # the solver read the first-stage order: Doc 1 is Paris for both rollouts
    assert [ro["answer"] for ro in records[0]["rollouts"]] == ["Paris", "Paris"]
    assert "ranker" not in metrics["update"] and metrics["ranker"]["calls"] == 2
    solver_seqs = run.update_calls(run.actors.solver)
    assert solver_seqs == [] or solver_seqs == [metrics["update"]["solver"]["n_seqs"]]


def test_oracle_ranker_promotes_answer_passages_without_a_model(scripted_run):
    run = scripted_run(("oracle_ranker",))
    assert run.actors.ranker is None and "ranker" not in run.actors.trainable
    records, metrics = run.step()
    calls = run.ranker_calls(records)
    assert len(calls) == 2
    for call in calls:
        # p0 and p3 contain "Paris": first, in first-stage order, then p2; p1 is cut at K=3
        assert call["mode"] == "oracle" and call["output"] == "" and call["group_id"] is None
        assert call["candidate_ids"] == FIRST_STAGE and call["chosen_ids"] == ["p0", "p3", "p2"]
        assert call["reward"] == 2.0  # Hit@1 = Hit@3 = 1 > gamma: r_rel + r_main (a correct answer)
    assert run.ranker_prompts(run.actors.solver) == 0
    assert "ranker" not in metrics["update"]


def test_shared_backbone_ranks_with_the_solver_and_updates_it_once_per_step(scripted_run):
    run = scripted_run(("shared_backbone",))
    solver = run.actors.solver
    assert run.actors.ranker is solver and set(run.actors.trainable) == {"proposer", "solver"}
    start = run.weights(solver)
    for step in (0, 1):
        records, metrics = run.step(step)
        calls = run.ranker_calls(records)
        assert [c["chosen_ids"] for c in calls] == [["p2", "p0", "p3"], FIRST_STAGE[:3]]
        assert [c["reward"] for c in calls] == [0.5, -0.2]
        # one update of the shared weights: 2 solver episodes + 2 ranker calls, statistics nested
        assert set(metrics["update"]) == {"proposer", "solver"}
        assert metrics["update"]["solver"]["n_seqs"] == 4 and metrics["update"]["solver"]["ranker"]["groups"] == 1
    assert run.ranker_prompts(solver) == 4  # the solver's engine ranked
    assert run.update_calls(solver) == [4, 4]  # once per step, never twice
    assert not run.unchanged(solver, start)
