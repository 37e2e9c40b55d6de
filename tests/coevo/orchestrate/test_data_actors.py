"""The retrieval and evidence actor bodies: what they import, how many threads they take."""
import subprocess
import sys
from pathlib import Path

import torch

from coevo.core.config import compose, to_object
from coevo.orchestrate import data_actors
from coevo.orchestrate.remote import THREAD_ENV

ROOT = Path(__file__).resolve().parents[3]


def _fresh(code: str) -> subprocess.CompletedProcess:
    env_clear = "import os\nfor k in %r: os.environ.pop(k, None)\n" % (THREAD_ENV,)
    return subprocess.run([sys.executable, "-c", env_clear + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_retrieval_actor_process_imports_no_torch_and_no_model_library():
    # Ray imports an actor class's module in the actor process: this is all a bm25s actor loads.
    proc = _fresh("import sys\nimport coevo.orchestrate.data_actors\n"
                  "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'spacy') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_without_torch_the_thread_count_goes_to_the_environment_torch_reads_later():
    proc = _fresh("import os\nfrom coevo.orchestrate.remote import limit_threads\n"
                  "print(limit_threads(0.5), os.environ['OMP_NUM_THREADS'], os.environ['MKL_NUM_THREADS'])\n"
                  "import torch\nprint(torch.get_num_threads())")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "1", "1", "1"]  # at least one thread, and torch obeys it


def test_evidence_body_limits_threads_only_in_its_own_process(monkeypatch):
    monkeypatch.setattr(data_actors, "open_corpus", lambda corpus_cfg: None)
    monkeypatch.setattr(data_actors, "build_retriever", lambda *a, **k: None)
    monkeypatch.setattr(data_actors.EvidencePipeline, "from_config", classmethod(lambda cls, *a, **k: "pipeline"))
    cfg = to_object(compose(["experiment=smoke"]))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert data_actors.EvidenceWorker(cfg, own_process=False).pipeline == "pipeline"
        assert torch.get_num_threads() == 2  # the driver's policies keep their threads (ray.local=true)
        data_actors.EvidenceWorker(cfg)
        assert torch.get_num_threads() == 1  # an actor takes its one core (torch already loaded: set directly)
    finally:
        torch.set_num_threads(before)


def test_evidence_body_with_lazy_annotation_annotates_only_what_its_paths_reach(small_corpus, tmp_path, monkeypatch):
    # The actor body as a run composes it (Hydra overrides -> the StrEnum -> EvidencePipeline.from_config).
    from evidence.annotation_store import AnnotationStore
    from evidence.lazy_entities import LazyEntityIndex

    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    cfg = to_object(compose(["experiment=smoke", "corpus=jsonl", f"corpus.path={small_corpus}",
                             "evidence.annotation=lazy", "evidence.stats_sample=40"]))
    worker = data_actors.EvidenceWorker(cfg, own_process=False)
    index = worker.pipeline.index
    assert isinstance(index, LazyEntityIndex) and len(index.stats.corpus) == 40 and index.annotated == 0
    verdicts = worker.validate_targets(["Edgar Allan Poe", "Politician"], ["", ""])
    assert [v.ok for v in verdicts] == [True, True]
    paths = worker.build_paths(["Edgar Allan Poe", "Journalist", "Actor"], seed=0)
    assert sum(map(len, paths)) > 0
    stores = list((tmp_path / "cache" / "entities").glob("lazy-*"))
    assert len(stores) == 1 and 0 < AnnotationStore(stores[0], {}).count() == index.annotated < 80
