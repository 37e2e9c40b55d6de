"""`evidence.hops`: which certified path call 2 writes from (longest, sampled, a fixed k) on hand-built paths."""
import random

import pytest

from coevo.core.choices import PathLength, path_length
from coevo.core.types import Completion, EvidencePath, Hop, Verdict
from evidence.paths import certify_path
from proposer.hops import NO_PATH_OF_K_HOPS, choose_path, paths_of_length
from proposer.pipeline import Candidate, attach_paths


def hop(head: str, tail: str, sentence: str, pid: str) -> Hop:
    return Hop(head, tail, sentence, pid, head, 1.0, "relation")


LOVE = hop("Hello Love", "Hank Snow", "Hello Love is a song recorded by Hank Snow.", "t0")
SNOW = hop("Hank Snow", "Nashville", "Hank Snow moved to Nashville in 1949.", "t1")
CAPITAL = hop("Nashville", "Tennessee", "Nashville is the capital of Tennessee.", "t2")
ELVIS = hop("Elvis Presley", "Nashville", "Elvis Presley recorded in Nashville.", "t3")
MEMPHIS = hop("Memphis", "Tennessee", "Memphis is a city in Tennessee.", "t4")
# As the evidence stage returns them: longest first, the greedy branch first within a length.
THREE = EvidencePath("Tennessee", (LOVE, SNOW, CAPITAL))
TWO = EvidencePath("Tennessee", (ELVIS, CAPITAL))
ONE = EvidencePath("Tennessee", (MEMPHIS,))
FOUND = [THREE, TWO, ONE]


def test_longest_is_the_first_path_as_before():
    assert choose_path(FOUND, PathLength.longest, random.Random(0)) is THREE
    assert choose_path([], PathLength.longest, random.Random(0)) is None


def test_a_fixed_k_cuts_longer_paths_to_their_last_k_hops():
    assert choose_path(FOUND, 3, random.Random(0)) == THREE
    assert choose_path(FOUND, 2, random.Random(0)) == EvidencePath("Tennessee", (SNOW, CAPITAL))
    assert choose_path(FOUND, 1, random.Random(0)) == EvidencePath("Tennessee", (CAPITAL,))
    # the distinct k-hop paths in order: two branches sharing their last hop give it once
    assert paths_of_length(FOUND, 1) == [EvidencePath("Tennessee", (CAPITAL,)), ONE]
    assert paths_of_length(FOUND, 2) == [EvidencePath("Tennessee", (SNOW, CAPITAL)), TWO]
    assert paths_of_length(FOUND, 4) == [] and choose_path(FOUND, 4, random.Random(0)) is None


def test_a_cut_path_is_still_certified():
    assert certify_path(THREE) is None
    for k in (1, 2, 3):
        assert all(certify_path(p) is None for p in paths_of_length([THREE], k))


def test_sampled_draws_every_available_length_uniformly_and_reproducibly():
    draws = [len(choose_path(FOUND, PathLength.sampled, rand)) for rand in [random.Random(7)] * 3000]
    assert all(abs(draws.count(k) / len(draws) - 1 / 3) < 0.03 for k in (1, 2, 3))  # 3000 draws: sd 0.009
    first, again = random.Random(3), random.Random(3)
    assert [choose_path(FOUND, PathLength.sampled, first) for _ in range(20)] == \
        [choose_path(FOUND, PathLength.sampled, again) for _ in range(20)]
    # only lengths up to the longest path found
    assert {len(choose_path([TWO], PathLength.sampled, random.Random(s))) for s in range(40)} == {1, 2}


@pytest.mark.parametrize("value, parsed", [("longest", PathLength.longest), ("sampled", PathLength.sampled),
                                           ("1", 1), (3, 3)])
def test_path_length_parses_the_config_value(value, parsed):
    assert path_length(value, 3) == parsed


@pytest.mark.parametrize("value", ["0", "4", "shortest", "", "-1", "2.5"])
def test_path_length_refuses_anything_else_naming_the_key(value):
    with pytest.raises(ValueError, match="evidence.hops"):
        path_length(value, 3)


class Evidence:
    """Paths by target: Tennessee has paths of 1-3 hops, Oslo one of 1 hop, Atlantis none."""

    def build_paths(self, targets, seed):
        oslo = EvidencePath("Oslo", (hop("Norway", "Oslo", "Oslo is in Norway.", "t9"),))
        return [{"Tennessee": FOUND, "Oslo": [oslo]}.get(t, []) for t in targets]


def candidates(*targets):
    out = []
    for t in targets:
        cand = Candidate(0, "ref", 0, Completion([1], [2], "x", [-0.1], "eos"), target=t)
        cand.target_verdict = Verdict(True, "ok", ("t0",))
        out.append(cand)
    return out


def test_attach_paths_rejects_a_target_without_a_path_of_k_hops_with_its_own_reason():
    cands = candidates("Tennessee", "Oslo", "Atlantis")
    attach_paths(Evidence(), cands, seed=0, hops=2)
    assert [len(c.path) if c.path else None for c in cands] == [2, None, None]
    assert [(c.stage, c.reason) for c in cands[1:]] == [("path", NO_PATH_OF_K_HOPS), ("path", "no_certified_path")]
    assert [c.paths_found for c in cands] == [3, 1, 0]  # certified paths built, whatever was chosen
    assert cands[1].stages_passed == cands[2].stages_passed == 2  # a path-stage rejection like any other


def test_attach_paths_defaults_to_the_longest_and_samples_with_the_steps_seed():
    cands = candidates("Tennessee", "Oslo")
    attach_paths(Evidence(), cands, seed=0)
    assert cands[0].path is THREE and len(cands[1].path) == 1
    lengths = []
    for seed in range(30):
        cands = candidates(*["Tennessee"] * 4)
        attach_paths(Evidence(), cands, seed=seed, hops=PathLength.sampled)
        again = candidates(*["Tennessee"] * 4)
        attach_paths(Evidence(), again, seed=seed, hops=PathLength.sampled)
        assert [c.path for c in cands] == [c.path for c in again]
        lengths += [len(c.path) for c in cands]
    assert set(lengths) == {1, 2, 3}
