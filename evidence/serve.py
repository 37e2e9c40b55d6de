"""`python -m evidence.serve [--host H] [--port P] [--topk K] <overrides>`: any backend over HTTP.

Serves Search-R1's retrieval API (search_r1/search/retrieval_server.py), so Search-R1's
clients and `retrieval=http` both work against it:
- `POST /retrieve` with `{"queries": [...], "topk": k, "return_scores": true}` answers
  `{"result": [[{"document": {"id": ..., "contents": "\"Title\"\ntext"}, "score": s}, ...], ...]}`
  (with `return_scores` false, the documents alone, as Search-R1 does); a missing `topk`
  is `--topk`.
- `GET /health` answers what is served (backend, corpus, passages).
The overrides are those of `coevo.run` (`corpus=wiki_mini retrieval=dense_faiss
retrieval.faiss.index_type=hnsw`), checked the same way. Standard-library server (http.server's
ThreadingHTTPServer): no web framework is a dependency, and retrieval, not HTTP, is the cost.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Sequence

from evidence.corpus import Corpus
from evidence.hits import Retriever

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024 * 1024  # a request larger than this is refused, not read into memory


class RequestError(ValueError):
    """A request that is not the API; answered with HTTP 400 and this message."""


def document(corpus: Corpus, passage_id: str) -> dict[str, str]:
    """A passage as Search-R1's corpus writes it (wiki-18.jsonl: id + contents)."""
    p = corpus[passage_id]
    return {"id": p.id, "contents": f'"{p.title}"\n{p.text}'}


def parse_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a /retrieve body; anything else raises RequestError."""
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"the body is not JSON ({e})") from None
    if not isinstance(req, dict):
        raise RequestError("expected a JSON object {\"queries\": [...], \"topk\": k, \"return_scores\": bool}")
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise RequestError("expected 'queries': a list of strings")
    topk = req.get("topk") or default_topk  # Search-R1: a missing or null topk is the server's default
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise RequestError(f"expected 'topk': an integer >= 1, got {topk!r}")
    return queries, topk, bool(req.get("return_scores", False))


def answer(retriever: Retriever, queries: list[str], topk: int, return_scores: bool) -> dict[str, Any]:
    """The /retrieve answer for one request."""
    result = []
    for row in retriever.search(queries, topk):
        docs = [document(retriever.corpus, h.passage_id) for h in row]
        result.append([{"document": d, "score": h.score} for d, h in zip(docs, row)] if return_scores else docs)
    return {"result": result}


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000,
                default_topk: int = 3) -> ThreadingHTTPServer:
    """A server bound to (host, port) (port 0: a free one, see `server_address`); call serve_forever."""
    lock = threading.Lock()  # one search at a time: the backends are not all thread-safe (Search-R1 locks too)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # the name http.server calls
            if self.path.rstrip("/") != "/health":
                return self._send(404, {"error": f"no GET {self.path}; expected /health or POST /retrieve"})
            self._send(200, {"status": "ok", "backend": retriever.backend, "corpus": retriever.corpus.name,
                             "passages": len(retriever.corpus)})

        def do_POST(self) -> None:  # the name http.server calls
            if self.path.rstrip("/") != "/retrieve":
                return self._send(404, {"error": f"no POST {self.path}; expected POST /retrieve"})
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY_BYTES:
                return self._send(413, {"error": f"request of {size} bytes; expected at most {MAX_BODY_BYTES}"})
            try:
                queries, topk, scores = parse_request(self.rfile.read(size), default_topk)
                with lock:
                    self._send(200, answer(retriever, queries, topk, scores))
            except RequestError as e:
                self._send(400, {"error": str(e)})
            except Exception as e:  # the client gets a 500 naming it; the server lives on
                log.exception("retrieval failed")
                self._send(500, {"error": f"{type(e).__name__}: {e}"})

        def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
            log.debug("%s %s", self.address_string(), format % args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True  # a hung client never keeps the process alive at shutdown
    return server


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Load the configured corpus and retriever, then serve until interrupted."""
    from coevo.core.config import compose, to_object
    from evidence.corpus_store import open_corpus
    from evidence.retrieval import build_retriever

    ap = argparse.ArgumentParser(prog="python -m evidence.serve", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    ap.add_argument("--port", type=int, default=8000, help="port (Search-R1's default 8000)")
    ap.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    args, overrides = ap.parse_known_args(argv)
    try:
        cfg = to_object(compose(overrides))
    except ValueError as e:
        ap.exit(2, f"evidence.serve: error: {e}\n")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if cfg.retrieval.backend == "http":
        ap.exit(2, "evidence.serve: error: retrieval=http would serve another server's answers; "
                   "expected a local backend (bm25, rank_bm25, dense_minilm, dense_faiss, e5_faiss)\n")
    corpus = open_corpus(cfg.corpus)
    server = make_server(build_retriever(corpus, cfg.retrieval), args.host, args.port, args.topk)
    host, port = server.server_address[:2]
    print(f"evidence.serve: {cfg.retrieval.backend} over corpus {corpus.name!r} ({len(corpus)} passages) at "
          f"http://{host}:{port}/retrieve", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
