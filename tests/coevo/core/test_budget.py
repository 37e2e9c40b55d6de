"""Prompt budgets (docs/method.md §5.2): checked at start, never a silent cut; the paper presets' budgets hold
together."""
import pytest

from coevo.core.budget import PromptBudgetError, check_model_len, check_prompts_fit, model_len
from coevo.core.config import compose, to_object


def test_check_prompts_fit_names_role_and_key():
    check_prompts_fit([[1] * 8, [2] * 3], 8, "proposer")  # at the limit: fine
    with pytest.raises(PromptBudgetError, match=r"1 proposer prompt\(s\) of up to 9 tokens exceed config key "
                                                r"proposer.max_prompt_tokens=8"):
        check_prompts_fit([[1] * 9, [2] * 3], 8, "proposer")


def test_model_len_is_prompt_plus_generation_budget_and_fits_the_model():
    cfg = to_object(compose(["experiment=smoke"]))
    assert model_len(cfg.ranker) == 2048 + 16  # tiny-random: max_new_tokens 16
    check_model_len(4096, 4096)
    check_model_len(10**6, None)  # a model that states no context
    with pytest.raises(PromptBudgetError, match=r"= 4097 tokens exceed the model's context \(max_position_embeddings="
                                                r"4096\)"):
        check_model_len(4097, 4096)


def test_solver_prompt_budget_must_hold_its_longest_episode():
    with pytest.raises(ValueError, match=r"config key solver.max_prompt_tokens=2048 is below "
                                         r"solver.max_episode_tokens=4096.*expected solver.max_prompt_tokens >= "):
        to_object(compose(["solver.max_episode_tokens=4096"]))
    cfg = to_object(compose(["solver.max_episode_tokens=4096", "solver.max_prompt_tokens=4096"]))
    assert cfg.solver.max_prompt_tokens == cfg.solver.max_episode_tokens == 4096


@pytest.mark.parametrize("experiment", ["paper_cosearch", "paper_zest"])
def test_paper_presets_budgets_are_consistent(experiment):
    cfg = to_object(compose([f"experiment={experiment}"]))
    assert cfg.solver.max_prompt_tokens >= cfg.solver.max_episode_tokens == 8192
    assert model_len(cfg.solver) == 8192 + 512  # vLLM max_model_len of the solver engine
    if experiment == "paper_cosearch":
        # 50 candidates x 600 characters (about 150 tokens each) plus the head: inside 8192 tokens
        assert (cfg.ranker.n_candidates, cfg.ranker.top_k, cfg.ranker.passage_chars) == (50, 5, 600)
        assert cfg.ranker.max_prompt_tokens == 8192
    else:  # ZEST: no trained ranker, the first-stage top-3 (Search-R1's protocol)
        assert (cfg.ranker.mode, cfg.ranker.n_candidates, cfg.ranker.top_k) == ("none", 3, 3)


def test_trainable_policy_with_bf16_weights_is_refused_at_start():
    with pytest.raises(ValueError, match=r"config key solver.dtype=bfloat16: a trainable solver keeps fp32 master "
                                         r"weights.*expected solver.dtype=float32"):
        to_object(compose(["solver.dtype=bfloat16"]))
    with pytest.raises(ValueError, match="config key proposer.dtype=float16"):
        to_object(compose(["proposer.dtype=float16"]))
    # Frozen roles, a ranker that is not trained and a ranker on the solver's weights may hold bf16.
    assert to_object(compose(["solver.dtype=bfloat16", "solver.frozen=true"])).solver.dtype == "bfloat16"
    for ranker in ("ranker.mode=frozen", "ranker.mode=none", "ranker.share_backbone=true"):
        assert to_object(compose([ranker, "ranker.dtype=bfloat16"])).ranker.dtype == "bfloat16"
