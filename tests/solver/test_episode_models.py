"""Episodes with real policies (HF engine): tiny-random always, SmolLM2 as the slow test."""
import pytest

from coevo.core.config import RankerConfig, SolverConfig
from solver.agent import Task, run_episodes, solver_messages
from solver.ranker import Ranker
from solver.search_tool import SearchTool

TASK = Task("t1", "What is the capital of France?", ["Paris"], ["p3"])


def check_episode(ep, policy):
    n = len(ep.token_ids)
    assert n == len(ep.loss_mask) == len(ep.logprobs) and n <= 600
    assert ep.loss_mask[: ep.prompt_len] == [0] * ep.prompt_len
    assert sum(ep.loss_mask) == ep.n_generated > 0
    assert ep.end_reason and ep.n_turns >= 1
    assert all(lp <= 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask) if m)
    assert ep.token_ids[: ep.prompt_len] == policy.chat_prompt_ids(solver_messages(TASK.question, 2))


def run(model, overlap_retriever, group_size, max_new_tokens):
    from coevo.train.policy import Policy

    solver_cfg = SolverConfig(preset=model, model=model, engine="hf", kl_coef=0.0, group_size=group_size,
                              max_searches=2, max_turns=2, max_episode_tokens=600, max_new_tokens=max_new_tokens)
    policy = Policy.from_config(solver_cfg, "solver")
    ranker_cfg = RankerConfig(preset=model, model=model, engine="hf", n_candidates=4, top_k=2,
                              max_new_tokens=max_new_tokens, share_backbone=True)
    tool = SearchTool(overlap_retriever(), Ranker(ranker_cfg, policy), ranker_cfg)
    return policy, run_episodes(policy, [TASK], tool, solver_cfg)


def test_tiny_random_episode_batch(overlap_retriever):
    policy, episodes = run("tiny-random", overlap_retriever, 2, 8)
    assert [e.rollout_idx for e in episodes] == [0, 1]
    for ep in episodes:
        check_episode(ep, policy)


@pytest.mark.slow
def test_smollm2_episode_batch_end_to_end(overlap_retriever):
    policy, episodes = run("smollm2-135m", overlap_retriever, 2, 24)
    for ep in episodes:
        check_episode(ep, policy)
        assert ep.format_ok == (ep.answer is not None)


def test_tiny_random_primed_ranker_call(overlap_retriever):
    """`ranker.prime_tag` with a real tokenizer and engine: the tag's tokens end the prompt."""
    from coevo.train.policy import Policy

    policy = Policy.from_config(SolverConfig(preset="tiny-random", model="tiny-random", engine="hf", kl_coef=0.0))
    cfg = RankerConfig(preset="tiny-random", model="tiny-random", engine="hf", n_candidates=4, top_k=2,
                       max_new_tokens=8, prime_tag=True)
    tool = SearchTool(overlap_retriever(), Ranker(cfg, policy), cfg)
    (result,) = tool.search([("What is the capital of France?", "capital of France", ["Paris"], [])])
    call, tag = result.call, policy.tokenizer.encode("<reason>", add_special_tokens=False)
    assert call.generated and call.prompt_ids[-len(tag):] == tag and call.output.startswith("<reason>")
    assert len(call.completion_ids) == len(call.logprobs) <= 8
