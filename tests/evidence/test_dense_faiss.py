"""retrieval=dense_faiss: FAISS Flat equals the numpy dense path, HNSW / IVF-PQ, prebuilt index files, cache.

Encoding is the slow part on CPU (≈ 8 wiki_mini passages/s on 2 shared cores), so the
wiki_mini check runs on a subset (the gold passages of 40 dev questions plus neighbours,
160 passages) encoded once by dense_minilm; FAISS indexes of other types are built from
those vectors without encoding again. The embeddings store's tests run on a fake
sentence-transformers module (hashed bag-of-words vectors, no torch): seconds, not minutes.
"""
import dataclasses
import json
import os
import re
import sys
import types
import zlib
from collections import Counter
from pathlib import Path

import faiss
import numpy as np
import pytest

from coevo.core.config import FaissConfig, RetrievalConfig
from coevo.core.inputs import load_labelled_questions
from evidence.corpus import Corpus, load_corpus, shared_data_dir
from evidence.dense_faiss import (
    build_index,
    embeddings_path,
    encode,
    encoder_spec,
    factory_string,
    passage_text,
    probe_spec,
)
from evidence.retrieval import build_retriever

QUERIES = ["movie by Stanley Kubrick", "capital of Germany", "river in Hungary", "French city"]
WIKI_MINI = shared_data_dir() / "wiki_mini" / "corpus.jsonl.gz"


@pytest.fixture()
def toy(retrieval_corpus):
    return retrieval_corpus


def ids(rows):
    return [[h.passage_id for h in row] for row in rows]


def write_jsonl(corpus: Corpus, path: Path) -> Path:
    """The corpus in Search-R1's wiki-18 format: id + contents '"Title"\\ntext', one line per passage."""
    path.write_text("".join(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n" for p in corpus))
    return path


def recall_at(rows, questions, k=10):
    per_q = [len(set(q.gold_ids) & {h.passage_id for h in row[:k]}) / len(q.gold_ids)
             for row, q in zip(rows, questions)]
    return sum(per_q) / len(per_q)


@pytest.fixture()
def fake_encoder(monkeypatch):
    """A fake `sentence_transformers` module for the test; returns every text its encoders were given."""
    encoded: list[str] = []

    class FakeSentenceTransformer:
        max_seq_length = 128

        def __init__(self, source, device=None):
            self.source = source

        def encode(self, texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
                   show_progress_bar=False):
            encoded.extend(texts)
            out = np.zeros((len(texts), 64), dtype=np.float32)
            for row, text in enumerate(texts):
                for word in re.findall(r"\w+", text.lower()):
                    out[row, zlib.crc32(word.encode()) % 64] += 1.0
            if normalize_embeddings:
                out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
            return out

    module = types.ModuleType("sentence_transformers")
    module.SentenceTransformer = FakeSentenceTransformer
    monkeypatch.setitem(sys.modules, "sentence_transformers", module)
    return encoded


@pytest.mark.parametrize("minilm_first", [True, False])
def test_dense_minilm_and_dense_faiss_encode_a_corpus_once(toy, tmp_path, fake_encoder, minilm_first):
    faiss_cfg = RetrievalConfig(backend="dense_faiss", cache_dir=str(tmp_path), faiss=FaissConfig(device="cpu"))
    if minilm_first:
        minilm = build_retriever(toy, "dense_minilm", cache_dir=str(tmp_path))
        flat = build_retriever(toy, faiss_cfg)
    else:
        flat = build_retriever(toy, faiss_cfg)
        minilm = build_retriever(toy, "dense_minilm", cache_dir=str(tmp_path))
    hnsw_block = FaissConfig(device="cpu", index_type="hnsw", hnsw_m=4)
    hnsw = build_retriever(toy, dataclasses.replace(faiss_cfg, faiss=hnsw_block))
    texts = [passage_text(p.title, p.text) for p in toy]
    assert [Counter(fake_encoder)[t] for t in texts] == [1] * len(toy)  # three indexes, one encoding
    assert minilm.from_cache == (not minilm_first) and not flat.from_cache and not hnsw.from_cache
    assert minilm.path.name.startswith("embeddings-") and isinstance(minilm.embeddings, np.memmap)
    entries = sorted(e.name.split("-")[0] for e in tmp_path.iterdir() if not e.name.startswith("."))
    assert entries == ["dense_faiss", "dense_faiss", "embeddings"]
    a, b = flat.search(QUERIES, 6), minilm.search(QUERIES, 6)
    assert ids(a) == ids(b) and a[0][0].passage_id == "d5"
    assert np.allclose([h.score for row in a for h in row], [h.score for row in b for h in row], atol=1e-5)
    other = FaissConfig(device="cpu", encoder="another/encoder")
    build_retriever(toy, dataclasses.replace(faiss_cfg, faiss=other))
    assert [Counter(fake_encoder)[t] for t in texts] == [2] * len(toy)  # another encoder: its own vectors


def test_embeddings_key_names_encoder_corpus_and_what_changes_vectors(toy, corpus_from_rows, tmp_path, fake_encoder):
    cfg = FaissConfig()
    spec = probe_spec(cfg)
    path = embeddings_path(toy, spec, str(tmp_path))
    assert path.parent == tmp_path and path == embeddings_path(toy, probe_spec(cfg), str(tmp_path))
    changed = [dataclasses.replace(cfg, encoder="intfloat/e5-base-v2"), dataclasses.replace(cfg, normalize=False),
               dataclasses.replace(cfg, passage_prefix="passage: ")]
    keys = {spec.key(), *(probe_spec(c).key() for c in changed), dataclasses.replace(spec, max_seq_length=256).key()}
    assert len(keys) == 5
    # device, batch size, query prefix and the index's parameters change no passage vector
    same = dataclasses.replace(cfg, device="cuda", encode_batch_size=8, query_prefix="query: ", index_type="hnsw")
    assert encoder_spec(sys.modules["sentence_transformers"].SentenceTransformer("x"), same) == spec
    other_corpus = corpus_from_rows([("Paris", "Paris is the capital of France.")], name="toy")
    assert embeddings_path(other_corpus, spec, str(tmp_path)) != path


def test_factory_strings_and_their_errors():
    cfg = FaissConfig(index_type="ivf_pq", ivf_nlist=4096, pq_m=16, pq_bits=8)
    assert factory_string(FaissConfig(), 10, 384, "c") == "Flat"
    assert factory_string(FaissConfig(index_type="hnsw", hnsw_m=16), 10, 384, "c") == "HNSW16"
    assert factory_string(cfg, 21_000_000, 768, "wiki18") == "IVF4096,PQ16x8"
    assert factory_string(cfg, 14_308, 384, "wiki_mini") == "IVF366,PQ16x8"  # nlist capped at n/39
    with pytest.raises(ValueError, match=r"retrieval\.faiss\.pq_m=10 does not divide the embedding dimension 384"):
        factory_string(FaissConfig(index_type="ivf_pq", pq_m=10), 1000, 384, "c")
    with pytest.raises(ValueError, match=r"retrieval\.faiss\.pq_bits=8 needs at least 256 passages .* 'c' has 100"):
        factory_string(cfg, 100, 384, "c")


def test_hnsw_and_ivf_pq_indexes_find_neighbours_of_random_vectors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    exact = np.argsort(-(x[:50] @ x.T), axis=1)[:, :10]
    for cfg, factory, at_least in [(FaissConfig(index_type="hnsw", hnsw_m=16), "HNSW16", 0.95),
                                   (FaissConfig(index_type="ivf_pq", pq_m=8, pq_bits=6, ivf_nprobe=4),
                                    factory_string(FaissConfig(index_type="ivf_pq", pq_m=8, pq_bits=6), 600, 32,
                                                   "r"), 0.3)]:
        index = build_index(x, factory, cfg)
        if cfg.index_type == "hnsw":
            index.hnsw.efSearch = 64
        else:
            faiss.extract_index_ivf(index).nprobe = cfg.ivf_nprobe
        _, found = index.search(x[:50], 10)
        overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, found)])
        assert overlap >= at_least, (factory, overlap)
        assert (found[:, 0] == np.arange(50)).mean() >= 0.9  # a vector finds itself first


@pytest.mark.slow
def test_built_flat_index_equals_dense_minilm_and_is_cached(toy, tmp_path):
    faiss_r = build_retriever(toy, RetrievalConfig(backend="dense_faiss", cache_dir=str(tmp_path)))
    numpy_r = build_retriever(toy, "dense_minilm", cache_dir=str(tmp_path))
    a, b = faiss_r.search(QUERIES, 6), numpy_r.search(QUERIES, 6)
    assert ids(a) == ids(b) and a[0][0].passage_id == "d5"
    assert np.allclose([h.score for row in a for h in row], [h.score for row in b for h in row], atol=1e-5)
    assert not faiss_r.from_cache
    again = build_retriever(toy, "dense_faiss", cache_dir=str(tmp_path))
    assert again.from_cache and ids(again.search(QUERIES, 6)) == ids(a)
    assert faiss_r.search(["", "  "], 3) == [[], []] and faiss_r.search(["Paris"], 0) == [[]]
    assert len(faiss_r.search(["Paris"], 100)[0]) == len(toy)  # k capped at the corpus size


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{"index_type": "hnsw", "hnsw_m": 4},
                                       {"index_type": "ivf_pq", "pq_m": 8, "pq_bits": 2, "ivf_nprobe": 4}])
def test_hnsw_and_ivf_pq_build_and_search_through_the_backend(toy, tmp_path, overrides):
    cfg = RetrievalConfig(backend="dense_faiss", cache_dir=str(tmp_path), faiss=FaissConfig(**overrides))
    r = build_retriever(toy, cfg)
    rows = r.search(QUERIES, 3)
    assert all(1 <= len(row) <= 3 and len({h.passage_id for h in row}) == len(row) for row in rows)
    assert all(x.score >= y.score for row in rows for x, y in zip(row, row[1:]))
    if cfg.faiss.index_type == "hnsw":
        assert ids(rows) == ids(build_retriever(toy, RetrievalConfig(backend="dense_faiss",
                                                                     cache_dir=str(tmp_path))).search(QUERIES, 3))
    assert build_retriever(toy, cfg).from_cache
    entries = sorted(e.name.split("-")[1] for e in tmp_path.iterdir() if not e.name.startswith("."))
    assert cfg.faiss.index_type in entries


@pytest.fixture(scope="module")
def wiki_subset(tmp_path_factory):
    """(corpus of 160 wiki_mini passages, 40 dev questions whose gold passages it holds, dense_minilm over it)."""
    if not WIKI_MINI.exists():
        pytest.skip(f"shared data not found at {WIKI_MINI} (set COEVO_SHARED_DATA)")
    full = load_corpus("wiki_mini")
    questions, _ = load_labelled_questions(shared_data_dir() / "wiki_mini" / "questions_dev.jsonl")
    questions = [q for q in questions if q.gold_ids][::17][:40]  # every dataset of the dev file
    keep = {pid for q in questions for pid in q.gold_ids}
    for p in full:  # the neighbours in corpus order make the distractors
        if len(keep) >= 160:
            break
        keep.add(p.id)
    corpus = Corpus([p for p in full if p.id in keep], name="wiki_mini_subset")
    numpy_r = build_retriever(corpus, "dense_minilm", cache_dir=str(tmp_path_factory.mktemp("dense")))
    return corpus, questions, numpy_r


@pytest.mark.slow
def test_prebuilt_flat_index_equals_the_numpy_matmul_on_wiki_mini(wiki_subset, tmp_path):
    corpus, questions, numpy_r = wiki_subset
    index = faiss.IndexFlatIP(numpy_r.embeddings.shape[1])
    index.add(numpy_r.embeddings)
    faiss.write_index(index, str(tmp_path / "e5_Flat.index"))
    jsonl = load_corpus(write_jsonl(corpus, tmp_path / "subset.jsonl"))  # ids = line order
    cfg = RetrievalConfig(backend="dense_faiss", faiss=FaissConfig(index_path=str(tmp_path / "e5_Flat.index")),
                          cache_dir=str(tmp_path / "cache"))
    faiss_r = build_retriever(jsonl, cfg)
    texts = [q.question for q in questions]
    a, b = faiss_r.search(texts, 10), numpy_r.search(texts, 10)
    assert ids(a) == ids(b)  # same ids in the same order, every question
    assert np.allclose([h.score for row in a for h in row], [h.score for row in b for h in row], atol=1e-5)
    assert abs(recall_at(a, questions) - recall_at(b, questions)) <= 0.005
    assert recall_at(a, questions) > 0.5  # MiniLM finds gold passages among 160
    assert not (tmp_path / "cache").exists()  # a prebuilt index is used as is, never copied


@pytest.mark.slow
def test_hnsw_and_ivf_pq_agree_with_flat_on_wiki_mini_vectors(wiki_subset):
    corpus, questions, numpy_r = wiki_subset
    q = encode(numpy_r.encoder, [x.question for x in questions], 16, True)
    exact = np.argsort(-(q @ numpy_r.embeddings.T), axis=1)[:, :10]
    hnsw = build_index(numpy_r.embeddings, "HNSW16", FaissConfig(index_type="hnsw"))
    ivf_cfg = FaissConfig(index_type="ivf_pq", pq_m=16, pq_bits=6)
    ivf = build_index(numpy_r.embeddings, factory_string(ivf_cfg, len(corpus), q.shape[1], corpus.name), ivf_cfg)
    faiss.extract_index_ivf(ivf).nprobe = 4  # of 4 lists (160 // 39): every list, so only PQ approximates
    for index, at_least in ((hnsw, 0.95), (ivf, 0.6)):
        _, found = index.search(q, 10)
        overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, found)])
        assert overlap >= at_least, (type(index).__name__, overlap)


@pytest.mark.slow
def test_index_size_and_dimension_mismatches_name_both_files(toy, tmp_path):
    jsonl = write_jsonl(toy, tmp_path / "toy.jsonl")
    small = faiss.IndexFlatIP(384)
    small.add(np.zeros((len(toy) - 1, 384), dtype=np.float32))
    faiss.write_index(small, str(tmp_path / "small.index"))
    with pytest.raises(ValueError) as err:
        small_block = FaissConfig(index_path=str(tmp_path / "small.index"))
        build_retriever(load_corpus(jsonl), RetrievalConfig(backend="dense_faiss", faiss=small_block))
    assert str(tmp_path / "small.index") in str(err.value) and str(jsonl) in str(err.value)
    assert "holds 5 vectors" in str(err.value) and "has 6 passages" in str(err.value)
    narrow = faiss.IndexFlatIP(8)
    narrow.add(np.zeros((len(toy), 8), dtype=np.float32))
    faiss.write_index(narrow, str(tmp_path / "narrow.index"))
    with pytest.raises(ValueError, match=r"narrow\.index holds vectors of size 8 but encoder .* makes 384"):
        narrow_block = FaissConfig(index_path=str(tmp_path / "narrow.index"))
        build_retriever(load_corpus(jsonl), RetrievalConfig(backend="dense_faiss", faiss=narrow_block))
    nope = FaissConfig(index_path=os.fspath(tmp_path / "nope.index"))
    with pytest.raises(FileNotFoundError, match=r"retrieval\.faiss\.index_path=.*nope\.index: no such file"):
        build_retriever(toy, RetrievalConfig(backend="dense_faiss", faiss=nope))
