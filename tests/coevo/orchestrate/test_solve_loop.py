"""CoSearch step of `python -m coevo.solve` with scripted policies: rewards, groups, batches, updates."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from coevo.core.config import RankerConfig, SolverConfig, register_schema
from coevo.core.stages import STAGE_FILE_ENV
from coevo.orchestrate.loop import solve_tasks
from coevo.orchestrate.solve_loop import (
    SolveRootConfig,
    load_tasks,
    question_batches,
    rollout_metrics,
    solve_step,
    to_solve_object,
)
from solver.agent import Task

CONFIG_DIR = str(Path(__file__).resolve().parents[3] / "configs")
TASKS = [Task("t1", "What is the capital of France?", ["Paris"], ["p3"]),
         Task("t2", "Which river flows through Germany?", ["Rhine"], ["p4"])]
RANKINGS = ["<reason>a</reason><rerank>[1] > [3] > [2]</rerank>", "no idea",
            "<reason>b</reason><rerank>[2] > [4] > [1]</rerank>", "<reason>c</reason><rerank>[1] > [2] > [3]</rerank>"]


def solver_turn(prompt, occurrence):
    if "Candidates:" in prompt:  # shared-backbone ranker prompt
        return RANKINGS[occurrence]
    episode = prompt.rsplit("Question: ", 1)[1]  # skip the demonstration
    if "Germany" in episode and "</information>\n" not in episode:
        return "I am not sure."  # every t2 rollout breaks the format: a zero-variance group
    if "</information>\n" not in episode:
        return "<search>capital of France</search>"
    first_title = prompt.rsplit("<information>Doc 1 (Title: ", 1)[1].split(")")[0]
    return f"<answer>{first_title}</answer>"


@pytest.fixture
def trainable(scripted_policy):
    class Trainable(scripted_policy):
        def __init__(self, responder):
            super().__init__(responder)
            self.updates = []

        def update(self, batch):
            self.updates.append(batch)
            return {"loss": 0.0, "n_seqs": len(batch)}
    return Trainable


def make_cfg(**ranker_kw):
    return SolveRootConfig(solver=SolverConfig(preset="t", model="t", group_size=4, max_searches=2, max_turns=3,
                                               max_new_tokens=100),
                           ranker=RankerConfig(preset="t", model="t", n_candidates=4, top_k=3, **ranker_kw))


def make_actors(cfg, trainable, overlap_retriever, shared=False):
    """The co-evolution loop's actor shape without proposer and evidence (as `coevo.solve` builds it)."""
    solver = trainable(solver_turn)
    ranker = solver if shared else trainable(lambda p, o: RANKINGS[o])
    roles = {"solver": solver}
    if cfg.ranker.mode == "trainable" and not shared:
        roles["ranker"] = ranker
    return SimpleNamespace(proposer=None, evidence=None, solver=solver, ranker=ranker,
                           retrieval=overlap_retriever(), trainable=roles)


def test_solve_metrics_leave_guided_replays_out(trainable, overlap_retriever):
    """A task file with guides (evidence/extraction.py) under `solver.guided_rollouts`: t1's last rollout
    replays its guide and answers the gold; the solver's figures are of the 7 sampled rollouts."""
    cfg = make_cfg()
    cfg.solver.guided_rollouts = True
    actors = make_actors(cfg, trainable, overlap_retriever)
    tasks = [Task("t1", TASKS[0].question, ["Paris"], ["p3"], guide=["capital of France"]), TASKS[1]]
    episodes, groups, _ = solve_tasks(tasks, actors, cfg, 0)
    (guided,) = [ep for ep in episodes if ep.guided]
    assert (guided.task.id, guided.answer, guided.n_searches) == ("t1", "Paris", 1)
    solver = rollout_metrics(episodes, groups, cfg.ranker.top_k)["solver"]
    # sampled: t1's 3 search and answer, t2's 4 break the format (with the replay counted: 4 of 8)
    assert (solver["format_valid"], solver["end_reasons"]) == (3 / 7, {"answer": 3, "no_action": 4})
    assert (solver["guided"], solver["guided_read"]) == (1, int(guided.read_answer))


def test_solve_step_rewards_groups_and_updates(trainable, overlap_retriever):
    cfg = make_cfg()
    actors = make_actors(cfg, trainable, overlap_retriever)
    m = solve_step(actors, TASKS, cfg, seed=0, train=True)
    # t1: 4 rollouts search once, answer with Doc 1's title: Paris, Paris (fallback order), Berlin, Paris
    solver = m["solver"]
    assert (solver["format_valid"], solver["em"], solver["mean_searches"]) == (0.5, 0.375, 0.5)
    assert solver["end_reasons"] == {"answer": 4, "no_action": 4}
    # solver rewards t1 [1, 1, 0, 1] (equal searches), t2 all -0.2 -> t2 is zero-variance
    assert m["reward"]["solver"] == pytest.approx((3 - 0.8) / 8, abs=1e-4)
    assert (m["update"]["solver"]["zero_var_groups"], m["update"]["solver"]["n_seqs"]) == (1, 4)
    # ranker: r_rel 1, malformed, 0.5, 1 -> rewards 2, -0.2, 0.5, 2; one semantic group of 4
    ranker = m["ranker"]
    assert (ranker["calls"], ranker["format_valid"], ranker["groups"], ranker["grouped_share"]) == (4, 0.75, 1, 1.0)
    assert m["reward"]["ranker"] == pytest.approx(4.3 / 4)
    assert m["update"]["ranker"]["zero_var_groups"] == 0 and set(m["time_s"]) == {"solve", "update"}
    (solver_batch,) = actors.solver.updates
    (ranker_batch,) = actors.ranker.updates
    assert len(solver_batch) == 4 and len(ranker_batch) == 4
    adv = [s.advantage for s in ranker_batch]
    assert adv[0] == pytest.approx(adv[3]) and adv[0] > adv[2] > adv[1]
    assert sum(adv) == pytest.approx(0.0, abs=1e-5)
    for seq in ranker_batch + solver_batch:
        assert len(seq.input_ids) == len(seq.loss_mask) == len(seq.old_logprobs)



def test_episode_record_is_json_ready(trainable, overlap_retriever):
    cfg = make_cfg()
    actors = make_actors(cfg, trainable, overlap_retriever)
    episodes, _, _ = solve_tasks(TASKS[:1], actors, cfg, seed=0)
    record = json.loads(json.dumps(episodes[0].to_record()))
    assert record["answer"] == "Paris" and record["n_searches"] == 1 and record["reward"] == 1.0
    (call,) = record["ranker_calls"]
    assert call["group_id"] == "t1/ans1/0" and call["reward"] == 2.0 and call["chosen_ids"] == ["p0", "p3", "p2"]


def test_shared_backbone_gets_one_update_with_both_batches(trainable, overlap_retriever):
    cfg = make_cfg(share_backbone=True)
    actors = make_actors(cfg, trainable, overlap_retriever, shared=True)
    m = solve_step(actors, TASKS, cfg, seed=0, train=True)
    assert [len(b) for b in actors.solver.updates] == [8]
    assert set(m["update"]) == {"solver"} and m["update"]["solver"]["ranker"]["groups"] == 1


@pytest.mark.parametrize("mode", ["frozen", "none", "oracle"])
def test_non_trainable_ranker_modes_never_update_the_ranker(trainable, overlap_retriever, mode):
    cfg = make_cfg(mode=mode)
    actors = make_actors(cfg, trainable, overlap_retriever)
    ranker_policy = actors.ranker
    if mode != "frozen":
        actors.ranker = None  # none/oracle hold no ranker policy at all
    m = solve_step(actors, TASKS, cfg, seed=0, train=True)
    assert set(m["update"]) == {"solver"} and m["ranker"]["calls"] == 4
    assert ranker_policy.updates == []
    assert (m["ranker"]["generated"] > 0) == (mode == "frozen")


def test_train_false_makes_no_update(trainable, overlap_retriever):
    cfg = make_cfg()
    actors = make_actors(cfg, trainable, overlap_retriever)
    m = solve_step(actors, TASKS, cfg, seed=0, train=False)
    assert actors.solver.updates == [] and "update" not in m


def test_load_tasks_and_batches(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "question": "Q1?", "answers": ["x", "y"], "gold_ids": ["p1"]},
        {"question": "Q2?", "answer": "z"}, {}]) + "\n")
    # The whole file is validated up front, also past `limit`.
    with pytest.raises(ValueError, match=r"q\.jsonl:3: missing key 'question'"):
        load_tasks(path, limit=2)
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")
    tasks = load_tasks(path, limit=2)
    # A record without id gets `<dataset>-<line>`, the dataset defaulting to the file's name.
    assert [(t.id, t.answers, t.evidence_ids) for t in tasks] == [("a", ["x", "y"], ["p1"]), ("q-2", ["z"], [])]
    batches = list(question_batches(tasks, 3, 3, shuffle=False))
    assert [[t.id for t in b] for b in batches] == [["a", "q-2"]] * 3


def test_solve_config_mirrors_coevo_config():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        solve = compose(config_name="solve", overrides=["experiment=smoke", "run.dir=x"])
        coevo = compose(config_name="coevo", overrides=["experiment=smoke", "run.dir=x", "corpus=wiki_mini",
                                                        "solver.reward.correctness=f1"])
    GlobalHydra.instance().clear()
    solve_dict = dict(solve)
    assert solve_dict.pop("solve")["batch_questions"] == 4
    assert solve_dict == dict(coevo)
    cfg = to_solve_object(solve)
    assert cfg.solver.preset == "tiny-random" and cfg.solve.data.endswith("wiki_mini/questions_dev.jsonl")


def test_solve_step_publishes_its_stages(trainable, overlap_retriever, tmp_path, monkeypatch):
    path = tmp_path / "stages.jsonl"
    monkeypatch.setenv(STAGE_FILE_ENV, str(path))
    cfg = make_cfg()
    solve_step(make_actors(cfg, trainable, overlap_retriever), TASKS, cfg, seed=0, train=True)
    # the loop's StageTimer stages (the scripted policies publish none of their own)
    assert [json.loads(line)["stage"] for line in path.read_text().splitlines()] == ["solve", "", "update", ""]
