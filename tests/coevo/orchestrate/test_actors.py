"""Actor wiring without Ray (`create_local_actors`) with the tiny-random preset."""
import json

import torch

from coevo.core.config import compose, to_object
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


def test_evidence_body_limits_threads_only_in_its_own_process(monkeypatch):
    monkeypatch.setattr(actors_mod, "load_corpus", lambda source: None)
    monkeypatch.setattr(actors_mod, "build_retriever", lambda *a, **k: None)
    monkeypatch.setattr(actors_mod.EvidencePipeline, "from_config", classmethod(lambda cls, *a, **k: "pipeline"))
    cfg = to_object(compose(["experiment=smoke"]))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert actors_mod.EvidenceWorker(cfg, own_process=False).pipeline == "pipeline"
        assert torch.get_num_threads() == 2  # the driver's policies keep their threads (ray.local=true)
        actors_mod.EvidenceWorker(cfg)
        assert torch.get_num_threads() == 1  # an actor takes its one core
    finally:
        torch.set_num_threads(before)
