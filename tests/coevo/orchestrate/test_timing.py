"""coevo/orchestrate/timing.py: seconds and tokens per stage, the metered policies, the breakdown line."""
from types import SimpleNamespace

from coevo.core.types import Completion, SamplingParams
from coevo.orchestrate.timing import MeteredPolicy, StageTimer, breakdown_line, update_tokens


class EchoPolicy:
    """`n` completions of 3 tokens per prompt; a tokenizer the metered view must still show."""

    tokenizer = "tok"

    def generate(self, prompts, sampling):  # noqa: ANN001
        return [[Completion(list(p), [1, 2, 3], "abc") for _ in range(sampling.n)] for p in prompts]


def test_generation_tokens_count_into_the_open_stage_only() -> None:
    timer = StageTimer()
    policy = MeteredPolicy(EchoPolicy(), timer)
    assert policy.tokenizer == "tok"  # everything but generate is the policy's own
    sampling = SamplingParams(n=2)
    policy.generate([[5, 6], [7]], sampling)  # outside every stage: belongs to none
    with timer("target"):
        policy.generate([[5, 6], [7]], sampling)  # prefill 2 + 1, decode 2 prompts x 2 samples x 3 tokens
        with timer("question"):
            policy.generate([[1, 2, 3, 4]], SamplingParams(n=1))
        policy.generate([[8]], SamplingParams(n=1))  # back in "target" after the inner stage closed
    assert timer.tokens == {"target": {"prefill": 4, "decode": 15}, "question": {"prefill": 4, "decode": 3}}
    assert set(timer.seconds) == {"target", "question"} and timer.current is None


def test_metered_actors_wrap_each_policy_present_and_leave_the_run_s_actors_alone() -> None:
    solver = EchoPolicy()
    actors = SimpleNamespace(proposer=None, solver=solver, ranker=solver, retrieval="r", trainable={"solver": solver})
    timer = StageTimer()
    view = timer.metered(actors)
    assert view.proposer is None and isinstance(view.solver, MeteredPolicy) and isinstance(view.ranker, MeteredPolicy)
    assert view.retrieval == "r" and view.trainable["solver"] is solver  # updates and checkpoints: the real policy
    assert actors.solver is solver  # the run's own object is unchanged


def test_update_tokens_add_every_role_s_sequence_tokens() -> None:
    updates = {"proposer": {"seq_tokens": 120, "n_tokens": 40}, "solver": {"skipped": True, "n_seqs": 0},
               "ranker": {"seq_tokens": 30}}
    assert update_tokens(updates) == {"seq": 150}
    assert update_tokens({}) == {"seq": 0}


def test_breakdown_line_terms_rates_and_the_remainder() -> None:
    time_s = {"target": 2.0, "solve": 4.0, "update": 3.0, "path": 0.5}
    tokens = {"target": {"prefill": 1500, "decode": 400}, "solve": {"prefill": 200, "decode": 2000},
              "update": {"seq": 6000}}
    line = breakdown_line(time_s, tokens, write_s=0.25, wall_s=10.0)
    # 2 + 4 + 3 + 0.5 + 0.25 = 9.75 of 10 s: 0.25 s (printed 0.2 with round-half-even) no stage covers.
    assert line == ("time 10.0s = target 2.0s (1.5k prefill + 400 decode, 200 tok/s) + solve 4.0s (200 prefill + "
                    "2.0k decode, 500 tok/s) + update 3.0s (6.0k seq, 2000 tok/s) + path 0.5s + write 0.2s + "
                    "other 0.2s")
    assert breakdown_line({"update": 0.0}, {"update": {"seq": 5}}, 0.0, 0.0) == \
        "time 0.0s = update 0.0s (5 seq) + write 0.0s + other 0.0s"  # no rate over zero seconds
