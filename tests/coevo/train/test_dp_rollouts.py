"""Data-parallel rollouts of a sharded role (coevo/train/sharded.py `prompt_blocks`, `block_sampling`;
coevo/orchestrate/sharded_actors.py `RemoteShardedPolicy.generate`): the split by hand, a solver group
never on two ranks, and 2 gloo ranks with the HF engine sampling what one process samples."""
from __future__ import annotations

import json
import random
import socket
import sys
from pathlib import Path

import pytest
import torch

from coevo.core.config import RankerConfig, SolverConfig
from coevo.core.types import SamplingParams
from coevo.train.models import load_model_and_tokenizer
from coevo.train.policy import Policy
from coevo.train.sharded import block_sampling, prompt_blocks
from solver.agent import Task, run_episodes
from solver.ranker import Ranker
from solver.search_tool import SearchTool

sys.path.insert(0, str(Path(__file__).parent))  # spawned ranks import their bodies from dp_ranks.py
import dp_ranks  # noqa: E402


@pytest.mark.parametrize("n, world, groups, expected", [
    (8, 2, None, [(0, 4), (4, 8)]),
    (5, 2, None, [(0, 3), (3, 5)]),  # the ideal cut 2.5: the higher boundary on a tie
    (7, 3, None, [(0, 2), (2, 5), (5, 7)]),  # ideal cuts 2.33, 4.67
    (1, 2, None, [(0, 1), (1, 1)]),  # one prompt: rank 0's, rank 1 idle
    (0, 2, None, [(0, 0), (0, 0)]),
    (6, 2, [0, 0, 0, 1, 1, 1], [(0, 3), (3, 6)]),
    (6, 2, [0, 0, 1, 1, 2, 2], [(0, 4), (4, 6)]),  # boundaries 2 and 4 tie around 3: the higher
    (6, 2, [7, 7, 7, 7, 7, 3], [(0, 5), (5, 6)]),  # group ids are labels, not positions
    (4, 3, [0, 0, 0, 0], [(0, 0), (0, 4), (4, 4)]),  # one group: one rank gets it all (cut 2.67 -> 4)
])
def test_prompt_blocks_by_hand(n, world, groups, expected) -> None:
    assert prompt_blocks(n, world, groups) == expected


def test_a_group_never_spans_ranks_and_every_prompt_is_in_one_block() -> None:
    rng = random.Random(0)
    for _ in range(300):
        sizes = [rng.randint(1, 6) for _ in range(rng.randint(1, 12))]
        groups = [g for g, size in enumerate(sizes) for _ in range(size)]
        world = rng.randint(1, 5)
        blocks = prompt_blocks(len(groups), world, groups)
        assert len(blocks) == world and blocks[0][0] == 0 and blocks[-1][1] == len(groups)
        assert all(a <= b == c for (a, b), (c, _) in zip(blocks, blocks[1:]))  # contiguous, in rank order
        owner = {g: {r for r, (a, b) in enumerate(blocks) if g in groups[a:b]} for g in set(groups)}
        assert all(len(ranks) == 1 for ranks in owner.values()), (groups, world, blocks)
    plain = prompt_blocks(11, 4)
    assert max(b - a for a, b in plain) - min(b - a for a, b in plain) <= 1


def test_the_split_refuses_groups_it_cannot_keep_whole() -> None:
    with pytest.raises(ValueError, match="apart"):
        prompt_blocks(4, 2, [0, 1, 0, 1])
    with pytest.raises(ValueError, match="3 group ids for 4 prompts"):
        prompt_blocks(4, 2, [0, 0, 1])
    with pytest.raises(ValueError, match="world=0"):
        prompt_blocks(4, 0)


def test_a_block_is_seeded_from_its_first_prompt_and_carries_no_groups() -> None:
    sampling = SamplingParams(n=3, seed=100, groups=[0, 0, 1])
    assert (block_sampling(sampling, 2).seed, block_sampling(sampling, 2).groups) == (106, None)
    assert block_sampling(SamplingParams(n=3), 2).seed is None and sampling.seed == 100


def test_every_turn_s_prompts_carry_their_task_so_no_solver_group_is_split(scripted_policy, overlap_retriever) -> None:
    """Three tasks of three rollouts ending at different turns: each generate call's `groups` name the task of
    each prompt, and the 2-rank split of every call keeps each task's live rollouts on one rank."""
    seen: list[tuple[list[str], list[int]]] = []

    class Recording(scripted_policy):
        def generate(self, prompts, sampling):  # noqa: ANN001, ANN201
            questions = [self.tokenizer.decode(p).rsplit("Question: ", 1)[1].split("\n")[0] for p in prompts]
            seen.append((questions, list(sampling.groups)))
            return super().generate(prompts, sampling)

    def responder(prompt: str, occurrence: int) -> str:
        if "</information>" in prompt.rsplit("Question: ", 1)[1]:
            return "<answer>Paris</answer>"
        return ["<answer>Paris</answer>", "<search>capital of France</search>", "<search>France</search>"][
            occurrence % 3]

    tasks = [Task(f"t{i}", f"Question number {i}?", ["Paris"], ["p0"]) for i in range(3)]
    cfg = RankerConfig(preset="t", model="t", mode="none", n_candidates=4, top_k=3)
    solver = SolverConfig(preset="t", model="t", group_size=3, max_searches=3, max_turns=4, max_episode_tokens=100_000,
                          max_prompt_tokens=100_000, max_new_tokens=200)
    run_episodes(Recording(responder), tasks, SearchTool(overlap_retriever(), Ranker(cfg, None), cfg), solver)
    assert [len(q) for q, _ in seen] == [9, 6]  # the second turn: the two searching rollouts of each task
    for questions, groups in seen:
        assert [f"Question number {g}?" for g in groups] == questions
        for world in (2, 3):
            blocks = prompt_blocks(len(groups), world, groups)
            assert all(len({r for r, (a, b) in enumerate(blocks) if g in groups[a:b]}) == 1 for g in set(groups))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_hf_ranks_each_generate_half_and_sample_what_one_process_samples(tiny_dir, tmp_path) -> None:
    """8 prompts in 4 groups, 2 seeded samples each: rank 0 generates prompts 0-3, rank 1 prompts 4-7 (with its own
    generation copy, filled by the first sync); together the same token ids and log-probs as one process's
    call, before and after an update (rank 1's copy gets the update's weights)."""
    torch.multiprocessing.spawn(dp_ranks.rank_main, args=(2, _free_port(), str(tiny_dir), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"dp{r}.json").read_text()) for r in (0, 1)]
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(str(tiny_dir))
    single = Policy(dp_ranks.config(), model, tok, "solver")
    want = {"before": dp_ranks.rows(single.generate(dp_ranks.PROMPTS, dp_ranks.SAMPLING))}
    single.update(dp_ranks.batch())
    want["after"] = dp_ranks.rows(single.generate(dp_ranks.PROMPTS, dp_ranks.SAMPLING))
    assert [r["generating_ranks"] for r in ranks] == [2, 2]
    for moment in ("before", "after"):
        assert [r[moment]["block"] for r in ranks] == [[0, 4], [4, 8]]  # half the prompts each, groups whole
        got = ranks[0][moment]["rows"] + ranks[1][moment]["rows"]
        assert [[c["ids"] for c in cs] for cs in got] == [[c["ids"] for c in cs] for cs in want[moment]]
        for cs, ws in zip(got, want[moment]):
            for c, w in zip(cs, ws):
                assert torch.allclose(torch.tensor(c["logprobs"]), torch.tensor(w["logprobs"]), atol=1e-4)
    # The update moved rank 1's generation copy: its rows' log-probs changed (a stale copy would match "before").
    before = [lp for cs in ranks[1]["before"]["rows"] for c in cs for lp in c["logprobs"]]
    after = [lp for cs in ranks[1]["after"]["rows"] for c in cs for lp in c["logprobs"]]
    assert len(before) != len(after) or max(abs(a - b) for a, b in zip(before, after)) > 1e-3


def test_the_plan_says_which_ranks_generate() -> None:
    """`python -m coevo.plan`'s `generating_ranks`: every rank of a sharded role, but rank 0 alone for vLLM in
    its own process; the HF engine's generation copy is on every rank (planned on rank 0)."""
    from coevo.core.config import compose, to_object
    from coevo.train.gpu_plan import plan_roles

    def plans(*overrides: str) -> dict:
        cfg = to_object(compose(["proposer=qwen3-4b", "solver=qwen2.5-7b", *overrides], "coevo"))
        return {p.role: p.to_record() for p in plan_roles(cfg)}

    vllm = plans("rollout=vllm")
    assert (vllm["solver"]["generating_ranks"], vllm["proposer"]["generating_ranks"]) == (4, 2)
    assert plans("rollout=vllm", "solver.weight_sync=tmpfs")["solver"]["generating_ranks"] == 1
    hf = plans("rollout=hf")["solver"]
    assert hf["generating_ranks"] == 4 and hf["generation_copy"] > 0
