"""Actor wiring without Ray (`create_local_actors`) with the tiny-random preset."""
import json
from types import SimpleNamespace

import pytest
import torch

from coevo.core.config import RankerConfig, compose, to_object
from coevo.core.types import TrainSequence
from coevo.orchestrate import actors as actors_mod
from coevo.orchestrate.actors import create_local_actors
from solver.ranker import build_ranker


def test_frozen_shared_backbone_ranker_does_not_drift(tmp_path):
    """ranker.mode=frozen + share_backbone: a separate frozen copy of the solver's initial weights,
    so a solver update leaves the "fixed" ranker where it started."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": t, "text": f"{t} is a city."}) + "\n"
                              for i, t in enumerate(["Paris", "Lyon", "Berlin"])))
    cfg = to_object(compose(["experiment=smoke", "ranker.mode=frozen", "ranker.share_backbone=true", "corpus=jsonl",
                             f"corpus.path={corpus}", f"retrieval.cache_dir={tmp_path / 'index'}"]))
    actors = create_local_actors(cfg, with_proposer=False)
    solver, ranker = actors.solver, actors.ranker
    assert ranker is not solver and ranker.frozen and not solver.frozen
    assert set(actors.trainable) == {"solver"}
    assert build_ranker(cfg.ranker, solver, lambda: ranker).policy is ranker
    start = [p.detach().clone() for p in ranker.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(start, solver.model.parameters()))  # the solver's weights
    result = solver.update([TrainSequence([1, 2, 3, 4, 5], [0, 0, 1, 1, 1], 1.0)])
    assert not result.get("skipped")
    assert any(not torch.equal(a, b) for a, b in zip(start, solver.model.parameters()))  # the solver moved
    assert all(torch.equal(a, b) for a, b in zip(start, ranker.model.parameters()))  # the ranker did not


def _policy(frozen=False):
    return SimpleNamespace(frozen=frozen)


@pytest.mark.parametrize("mode, own, ranker_is, trained", [
    ("trainable", _policy(), "own", ["proposer", "solver", "ranker"]),  # its own trainable policy
    ("trainable", None, "solver", ["proposer", "solver"]),  # share_backbone: the solver's object, one update
    ("frozen", _policy(frozen=True), "own", ["proposer", "solver"]),  # its own (or a copy of the solver's), fixed
    ("oracle", None, None, ["proposer", "solver"]),  # no model at all
    ("none", None, None, ["proposer", "solver"]),
])
def test_one_ranker_wiring_for_ray_and_one_process(mode, own, ranker_is, trained):
    cfg = SimpleNamespace(ranker=RankerConfig(preset="t", model="t", mode=mode))
    proposer, solver = _policy(), _policy()
    ranker, trainable = actors_mod.ranker_and_trainable(cfg, proposer, solver, own)
    assert ranker is {"own": own, "solver": solver, None: None}[ranker_is]
    assert list(trainable) == trained and trainable["solver"] is solver
    # coevo.solve: no proposer; a frozen solver (solve.train=false) leaves nothing to train
    assert actors_mod.ranker_and_trainable(cfg, None, _policy(frozen=True), own)[1] == (
        {"ranker": own} if "ranker" in trained else {})


@pytest.mark.parametrize("n, parts, sizes", [(7, 3, [3, 2, 2]), (6, 3, [2, 2, 2]), (2, 4, [1, 1]), (0, 3, [0]),
                                             (5, 1, [5])])
def test_split_evenly_hand_computed(n, parts, sizes):
    chunks = actors_mod.split_evenly(list(range(n)), parts)
    assert [len(c) for c in chunks] == sizes
    assert [x for c in chunks for x in c] == list(range(n))  # contiguous, in order


class _FakeRetrievalActor:
    """A retrieval actor whose `.remote` answers at once: hits name the query, passages the hit."""

    def __init__(self) -> None:
        self.calls = []
        self.search_with_passages = self

    def remote(self, queries, k):
        self.calls.append(list(queries))
        hits = [[f"{q}#{i}" for i in range(k)] for q in queries]
        return hits, {h: f"text of {h}" for row in hits for h in row}


def test_remote_retriever_splits_a_batch_across_replicas_and_keeps_query_order(monkeypatch):
    monkeypatch.setattr(actors_mod, "call", lambda ref, what: ref)
    queries = [f"q{i}" for i in range(5)]
    one = actors_mod.RemoteRetriever([_FakeRetrievalActor()])
    fakes = [_FakeRetrievalActor() for _ in range(3)]
    three = actors_mod.RemoteRetriever(fakes)
    assert three.search(queries, 2) == one.search(queries, 2)
    assert [f.calls for f in fakes] == [[["q0", "q1"]], [["q2", "q3"]], [["q4"]]]
    assert three.corpus["q4#1"] == "text of q4#1" and three.corpus.passages == one.corpus.passages
    assert three.search(["q9"], 1) == [["q9#0"]] and fakes[1].calls == [["q2", "q3"]]  # one query: one replica
    with pytest.raises(ValueError, match="at least one retrieval actor"):
        actors_mod.RemoteRetriever([])


def test_each_retrieval_replica_is_an_actor_with_its_core_and_start_note():
    cfg = to_object(compose(["experiment=smoke", "retrieval.replicas=3"]))
    requests = actors_mod._requests(cfg, None)
    names = ["retrieval", "retrieval.1", "retrieval.2"]
    assert [n for n in requests if n.startswith("retrieval")] == names
    assert all(requests[n] == requests["evidence"] for n in names)  # one CPU each, like the evidence actor
    notes = actors_mod.start_notes(cfg)
    assert all("loads the corpus and its bm25s index" in notes[n] for n in names)


def test_the_alive_check_asks_every_actor_and_names_the_first_dead_one(monkeypatch):
    class Handle:
        def __init__(self, name):
            self.ready = type("Method", (), {"remote": staticmethod(lambda: name)})()

    asked = []

    def call(ref, what):  # as remote.call: a dead actor's ray.get becomes an ActorFailure naming it
        asked.append(ref)
        if ref == "retrieval":
            raise actors_mod.ActorFailure(f"{what} failed in its Ray actor: the actor died unexpectedly")
        return {"pid": 1}

    monkeypatch.setattr(actors_mod, "call", call)
    names = ("proposer", "solver", "ranker", "evidence")
    run = actors_mod.Actors(None, None, None, None, None, {}, handles={n: Handle(n) for n in names})
    run.check_alive()
    assert asked == list(names)
    run.handles["retrieval"] = Handle("retrieval")
    with pytest.raises(actors_mod.ActorFailure, match=r"^retrieval \(alive check\) failed in its Ray actor"):
        run.check_alive()
    asked.clear()
    actors_mod.Actors(None, None, None, None, None, {}).check_alive()  # one process: nothing to ask
    assert asked == []
