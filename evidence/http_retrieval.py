"""`retrieval=http`: the client of a running Search-R1-style retrieval server.

The API (Search-R1's search_r1/search/retrieval_server.py; `python -m evidence.serve` serves
the same): `POST <url>` with `{"queries": [...], "topk": k, "return_scores": true}` answers
`{"result": [[{"document": {"id": ..., "contents": "\"Title\"\ntext"}, "score": s}, ...], ...]}`,
one list per query, best first (without scores: the documents themselves).

The server must serve the configured corpus: every returned id is looked up in it (the
solver, ranker and evidence stage read passages from the local corpus), and an id it does
not hold is an error naming the URL. Building the client sends one query, so a server that
is down or serves another corpus fails the start. A failed request (no connection, timeout, HTTP 5xx)
is retried `retrieval.http.retries` times, waiting `backoff_s * 2**i` before retry i; then the
error names the URL, the attempts and the last failure. HTTP 4xx is not retried (the same
request would fail again).
"""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from coevo.core.config import RetrievalConfig
from evidence.corpus import Corpus
from evidence.hits import Hit, live_queries

log = logging.getLogger(__name__)


PROBE_QUERY = "Wikipedia"  # the start-up check's query: any word that retrieves something


class RetrievalServerError(RuntimeError):
    """The retrieval server is down, too slow, or answered something that is not the API; names the URL."""


# A retrieval server is a cluster-local service: an HTTP(S)_PROXY set for the outside world
# must not route (or refuse) requests to it, so the opener ignores proxy variables.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_json(url: str, payload: dict[str, Any], timeout_s: float) -> Any:
    """One POST of `payload` as JSON; the decoded JSON answer."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode("utf-8"), method="POST",
                                     headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=timeout_s) as response:
        return json.loads(response.read().decode("utf-8"))


def _http_error_text(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read().decode("utf-8", "replace")[:500]
    except OSError:
        body = ""
    return f"HTTP {e.code} {e.reason}" + (f": {body}" if body else "")


def post_with_retries(url: str, payload: dict[str, Any], timeout_s: float, retries: int, backoff_s: float) -> Any:
    """`post_json` retried on connection failures, timeouts and 5xx, with exponential backoff."""
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            return post_json(url, payload, timeout_s)
        except urllib.error.HTTPError as e:
            last = _http_error_text(e)
            if e.code < 500:  # the request itself is wrong: retrying cannot help
                raise RetrievalServerError(f"retrieval server {url} refused the request: {last}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            last = str(getattr(e, "reason", e)) or type(e).__name__
        except json.JSONDecodeError as e:
            last = f"the answer is not JSON ({e})"
        log.warning("retrieval server %s: attempt %d of %d failed (%s)", url, attempt + 1, retries + 1, last)
    raise RetrievalServerError(
        f"retrieval server {url} did not answer after {retries + 1} attempt(s) (timeout {timeout_s}s each; last: "
        f"{last}); expected a running Search-R1-style server (python -m evidence.serve, or set retrieval.http.url)")


def parse_result(body: Any, n: int, url: str) -> list[list[tuple[str, float]]]:
    """(passage id, score) per query from a Search-R1 answer; anything else names the URL."""
    rows = body.get("result") if isinstance(body, dict) else None
    if not isinstance(rows, list) or len(rows) != n:
        got = f"{len(rows)} result lists" if isinstance(rows, list) else f"no 'result' list ({str(body)[:200]})"
        raise RetrievalServerError(f"retrieval server {url} answered {got}; expected {n}, one per query")
    out = []
    for row in rows:
        hits = []
        for rank, item in enumerate(row if isinstance(row, list) else [None]):
            # return_scores=true gives {"document", "score"}; a server that ignores it sends documents.
            doc = item.get("document", item) if isinstance(item, dict) else None
            if not isinstance(doc, dict) or "id" not in doc:
                raise RetrievalServerError(f"retrieval server {url} answered {str(item)[:200]}; expected "
                                           f"{{'document': {{'id': ..., 'contents': ...}}, 'score': ...}}")
            score = item.get("score") if "document" in item else None
            hits.append((str(doc["id"]), float(score) if isinstance(score, (int, float)) else -float(rank)))
        out.append(hits)
    return out


class HttpRetriever:
    """Search through a retrieval server; the hits are ids of the local corpus."""

    backend = "http"
    build_s = 0.0
    from_cache = False  # nothing is built here: the server holds the index

    def __init__(self, corpus: Corpus, cfg: RetrievalConfig) -> None:
        self.corpus = corpus
        http = cfg.http  # this backend's block
        self.url = http.url
        self.timeout_s, self.retries, self.backoff_s = http.timeout_s, http.retries, http.backoff_s
        # One query now, so that a server that is down, or serves another corpus, fails the
        # start (naming the URL) instead of the first search, after the models have loaded.
        self.search([PROBE_QUERY], 1)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        live = live_queries(queries)
        out: list[list[Hit]] = [[] for _ in queries]
        if not live or k <= 0:
            return out
        payload = {"queries": [queries[i] for i in live], "topk": int(k), "return_scores": True}
        body = post_with_retries(self.url, payload, self.timeout_s, self.retries, self.backoff_s)
        for i, hits in zip(live, parse_result(body, len(live), self.url)):
            missing = [pid for pid, _ in hits if pid not in self.corpus]
            if missing:
                raise RetrievalServerError(
                    f"retrieval server {self.url} returned passage id {missing[0]!r}, which corpus "
                    f"{self.corpus.name!r} ({self.corpus.source or 'built in code'}) does not hold; expected the "
                    f"server to serve the configured corpus")
            out[i] = [Hit(pid, score) for pid, score in hits[:k]]
        return out
