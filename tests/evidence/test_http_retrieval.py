"""retrieval=http against evidence.serve: same hits as the local backend, Search-R1's API, clear errors."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from coevo.core.config import HttpConfig, RetrievalConfig
from evidence.corpus import Corpus, Passage, load_corpus
from evidence.http_retrieval import RetrievalServerError, parse_result
from evidence.retrieval import build_retriever
from evidence.serve import main, make_server

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ["capital of France", "river Germany", "", "Kubrick film 1968", "the of a", "France"]


@pytest.fixture()
def corpus(retrieval_corpus):
    return retrieval_corpus


@pytest.fixture()
def served(corpus, tmp_path):
    """(local bm25s retriever, the URL of an evidence.serve server over it on a free port)."""
    local = build_retriever(corpus, "bm25s", cache_dir=str(tmp_path))
    server = make_server(local, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield local, f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    server.shutdown()
    server.server_close()
    thread.join(5)


def client(corpus, url, **kw):
    return build_retriever(corpus, RetrievalConfig(backend="http", http=HttpConfig(url=url, **kw)))


def post(url, payload):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=5) as r:
        return json.loads(r.read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_client_returns_the_local_backends_hits(corpus, served):
    local, url = served
    remote = client(corpus, url)
    for k in (1, 3, 10):
        assert remote.search(QUERIES, k) == local.search(QUERIES, k)
    assert remote.search(["France"], 0) == [[]] and remote.search(["", " "], 3) == [[], []]
    assert remote.backend == "http" and not remote.from_cache


def test_server_speaks_search_r1s_api(corpus, served):
    _, url = served
    body = post(url, {"queries": ["Kubrick film", "Danube"], "topk": 2, "return_scores": True})
    first = body["result"][0][0]
    assert first["document"] == {"id": "d5", "contents": '"Kubrick"\n' + corpus.passages[5].text}
    assert isinstance(first["score"], float) and len(body["result"]) == 2
    plain = post(url, {"queries": ["Danube"], "topk": 1})  # Search-R1's default: no scores, documents only
    assert plain["result"] == [[{"id": "d4", "contents": '"Danube"\n' + corpus.passages[4].text}]]
    assert len(post(url, {"queries": ["river"], "topk": None})["result"][0]) == 3  # the server's default topk
    assert parse_result(plain, 1, url) == [[("d4", -0.0)]]  # a scoreless answer keeps its order


def test_server_answers_bad_requests_with_400_naming_the_problem(served):
    _, url = served
    for payload, message in [({"queries": "x"}, "'queries': a list of strings"),
                             ({"queries": ["x"], "topk": -1}, "'topk': an integer >= 1")]:
        with pytest.raises(urllib.error.HTTPError) as err:
            post(url, payload)
        assert err.value.code == 400 and message in json.loads(err.value.read())["error"]
    with urllib.request.urlopen(url.replace("/retrieve", "/health"), timeout=5) as r:
        assert json.loads(r.read()) == {"status": "ok", "backend": "bm25s", "corpus": "toy", "passages": 6}


def test_a_refused_request_is_not_retried_and_names_the_url(corpus, served):
    _, url = served
    with pytest.raises(RetrievalServerError, match=r"retrieval server .*/nope refused the request: HTTP 404"):
        client(corpus, url.replace("/retrieve", "/nope"), retries=5, backoff_s=10).search(["France"], 2)


def test_a_down_server_fails_within_the_timeout_naming_the_url(corpus):
    url = f"http://127.0.0.1:{free_port()}/retrieve"  # nothing listens there
    t0 = time.perf_counter()
    with pytest.raises(RetrievalServerError) as err:
        client(corpus, url, timeout_s=1.0, retries=2, backoff_s=0.05)  # building it checks the server
    assert time.perf_counter() - t0 < 3  # two short backoffs, no hanging
    assert str(err.value).startswith(f"retrieval server {url} did not answer after 3 attempt(s)")
    assert "python -m evidence.serve" in str(err.value)


def test_a_silent_server_times_out(corpus):
    listener = socket.socket()  # accepts connections (the backlog) but never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/retrieve"
    try:
        t0 = time.perf_counter()
        with pytest.raises(RetrievalServerError, match="did not answer after 2 attempt"):
            client(corpus, url, timeout_s=0.3, retries=1, backoff_s=0.0).search(["France"], 2)
        assert time.perf_counter() - t0 < 2.5
    finally:
        listener.close()


def test_ids_the_local_corpus_lacks_are_an_error_naming_the_url(served):
    _, url = served
    other = Corpus([Passage("x0", "X", "capital of France")], name="other")
    with pytest.raises(RetrievalServerError, match=r"returned passage id 'd0', which corpus 'other' .* does not hold"):
        client(other, url).search(["capital of France"], 2)


def test_serve_refuses_a_bad_override_and_http_itself(capsys):
    with pytest.raises(SystemExit) as err:
        main(["retrieval.faiss.index_typ=flat"])
    assert err.value.code == 2 and "retrieval.faiss.index_type" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main(["retrieval=http"])
    assert err.value.code == 2 and "expected a local backend" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter: imports and config composition take seconds
def test_python_m_evidence_serve_serves_a_jsonl_corpus(corpus, tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n" for p in corpus))
    port = free_port()
    env = {**os.environ, "COEVO_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "evidence.serve", "--port", str(port), "corpus=jsonl",
                             f"corpus.path={path}", "retrieval=bm25"], env=env, cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/retrieve"
        deadline = time.monotonic() + 60
        while True:  # wait for the server to listen (the client retries only a few times)
            try:
                hits = client(load_corpus(path), url, retries=0).search(["Kubrick film"], 2)
                break
            except RetrievalServerError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.2)
        assert hits[0][0].passage_id == "d5"
    finally:
        proc.terminate()
        proc.wait(10)
    assert f"bm25s over corpus 'toy' (6 passages) at http://127.0.0.1:{port}/retrieve" in proc.stderr.read()
