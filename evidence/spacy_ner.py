"""spaCy side of the entity index: load the pipeline, turn Docs into mentions and linkers.

Pipeline choice (measured on this machine, 400 vital_articles passages): `tok2vec + senter
+ ner` ran at 98 passages/s and `tok2vec + tagger + senter + ner` at 100 passages/s (the
tagger is a thin layer over the shared tok2vec), so we keep the tagger: its fine-grained
tags (VB*, IN, TO, POS, NNP) give the graph's relation cues and the title-case noun-phrase
filter without a hand-kept word list. The parser (noun chunks), lemmatizer and
attribute_ruler are excluded; title-cased noun phrases are runs of capitalized tokens
containing a proper-noun tag instead of noun chunks.

spaCy is imported lazily so that loading a cached index never imports it.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import time
from collections import Counter
from functools import lru_cache, partial
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from coevo.core.progress import track
from evidence import topic
from evidence.corpus import MAX_PASSAGE_CHARS, Corpus, Passage
from evidence.mentions import (
    ALLOWED_LABELS,
    ANNOTATOR_VERSION,
    VALUE_LABELS,
    Mention,
    normalize_entity,
    strip_disambiguator,
    title_key,
)

EXCLUDED_PIPES = ["parser", "lemmatizer", "attribute_ruler"]
LINKER_TAGS = frozenset({"VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "IN", "TO", "POS"})
PROPER_TAGS = frozenset({"NNP", "NNPS"})
# Lower-case words allowed inside a title-cased phrase ("Bank of America", "Ludwig van Beethoven").
CONNECTORS = frozenset({"of", "de", "la", "le", "von", "van", "der", "den", "du", "da", "del", "di", "des", "y"})
# Capitalized words that start a sentence or phrase without naming anything.
LEADING_NOISE = frozenset({"the", "a", "an", "in", "on", "at", "for", "from", "by", "with", "this", "that",
                           "these", "those", "his", "her", "its", "their", "our", "my", "after", "before",
                           "during", "however", "although", "when", "while", "since", "as", "it", "he",
                           "she", "they", "we", "i", "there", "some", "many", "most", "all"})
# A one-word PERSON/NP mention folds into the one PERSON of its passage it is the surname of
# ("Snow" → "Hank Snow"). Wider folding (ORG prefixes, multi-word suffixes) merged distinct
# entities on wiki_mini ("Harvard" → "Harvard Business School", "European Union" →
# "Treaties of the European Union"), so it stays this narrow.
FOLDABLE_SHORT = frozenset({"PERSON", "NP"})
# Labels whose fuller forms of a multi-word title fold into it (leads spell out middle names).
FOLD_FULL_FORMS = frozenset({"PERSON", "NP", "ORG"})
# Loaded corpora are already cut to this (counted, see evidence.corpus); the slice guards
# corpora built in code.
MAX_CHARS = MAX_PASSAGE_CHARS
# A DATE is a node only when it names a point in time (year, decade, day, month), not a duration.
_DATE_OK = re.compile(r"\b\d{3,4}s?\b|\b\d{1,2}(?:st|nd|rd|th)\b|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)"
                      r"[a-z]*\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")


@lru_cache(maxsize=4)
def load_nlp(model_name: str) -> Any:
    """The spaCy pipeline with tok2vec, tagger, senter and ner only (one load per process)."""
    import spacy

    nlp = spacy.load(model_name, exclude=EXCLUDED_PIPES)
    if "senter" in nlp.disabled:
        nlp.enable_pipe("senter")
    return nlp


def model_version(model_name: str) -> str:
    """Installed version of a spaCy model package, read without importing spaCy."""
    try:
        return importlib.metadata.version(model_name)
    except importlib.metadata.PackageNotFoundError:
        return str(load_nlp(model_name).meta.get("version", "unknown"))


def _is_cap(tok: Any) -> bool:
    return tok.text[:1].isupper() and any(ch.isalpha() for ch in tok.text)


def _title_case_runs(sent: Any, taken: set[int]) -> list[tuple[int, int]]:
    """Token ranges [i, j) of capitalized runs (with connectors) that contain a proper noun."""
    runs, toks, i = [], list(sent), 0
    while i < len(toks):
        if toks[i].i in taken or not _is_cap(toks[i]):
            i += 1
            continue
        j = last_cap = i
        while j + 1 < len(toks) and toks[j + 1].i not in taken:
            nxt = toks[j + 1]
            if _is_cap(nxt):
                last_cap = j = j + 1
            elif nxt.lower_ in CONNECTORS or (nxt.lower_ == "the" and toks[j].lower_ in CONNECTORS):
                j += 1
            else:
                break
        run = toks[i:last_cap + 1]
        while run and run[0].lower_ in LEADING_NOISE:
            run = run[1:]
        if run and any(t.tag_ in PROPER_TAGS for t in run):
            runs.append((run[0].i, run[-1].i + 1))
        i = last_cap + 1
    return runs


def _title_pattern(title: str) -> Optional[re.Pattern]:
    words = re.sub(r"\s*\([^()]*\)\s*$", "", title or "").split()
    if not words or not title_key(title):
        return None
    body = r"\s+".join(re.escape(w) for w in words)
    if words[0][:1].isupper():
        # Case-blind after the first letter, which must stay upper case: a lower-case match of
        # a capitalized title is the common noun ("adolescence"), not the entity.
        body = f"(?-i:{re.escape(words[0][0])})" + body[len(re.escape(words[0][0])):]
    return re.compile(r"(?<!\w)" + body + r"(?!\w)", re.IGNORECASE)


def _sentence_mentions(sent: Any, title_re: Optional[re.Pattern]) -> list[tuple[int, int, str]]:
    """(start_char, end_char, label) of the entity-like spans of one sentence, by position."""
    found: list[tuple[int, int, str]] = []
    taken: set[int] = set()
    for ent in sent.ents:
        keep = ent.label_ in ALLOWED_LABELS and (ent.label_ != "DATE" or _DATE_OK.search(ent.text))
        if keep or (ent.label_ in VALUE_LABELS and _DIGIT.search(ent.text)):
            found.append((ent.start_char, ent.end_char, ent.label_))
        # Tokens of dropped entities (ordinals, "two", "decades") are not free for title-case runs either.
        taken.update(range(ent.start, ent.end))
    doc = sent.doc
    for i, j in _title_case_runs(sent, taken):
        found.append((doc[i].idx, doc[j - 1].idx + len(doc[j - 1].text), "NP"))
    if title_re is not None:
        for m in title_re.finditer(sent.text):
            a, b = sent.start_char + m.start(), sent.start_char + m.end()
            # The title wins over shorter spans inside it ("Love" in "Hello Love"), never over
            # a span it only partly overlaps.
            inside = [f for f in found if a <= f[0] and f[1] <= b and f[1] - f[0] < b - a]
            if not any(x < b and a < y for x, y, _ in found if (x, y, _) not in inside):
                found = [f for f in found if f not in inside] + [(a, b, "TITLE")]
    return _merge_name_parts(sorted(found), sent.doc.text)


def _merge_name_parts(found: list[tuple[int, int, str]], text: str) -> list[tuple[int, int, str]]:
    """Join a capitalized run directly before a PERSON into it: NER often splits a first
    name off ("Fritz" + "Jakob Haber")."""
    merged: list[tuple[int, int, str]] = []
    for a, b, lab in found:
        if merged and lab == "PERSON" and merged[-1][2] == "NP" and not text[merged[-1][1]:a].strip():
            merged[-1] = (merged[-1][0], b, "PERSON")
        else:
            merged.append((a, b, lab))
    return merged


def _is_subsequence(short: list[str], long_: list[str]) -> bool:
    it = iter(long_)
    return all(tok in it for tok in short)


def _fold_keys(spans: list[tuple[int, int, str, str]], title: str) -> dict[str, str]:
    """Alias keys of this passage → the key they stand for: a fuller form of the title
    ("Fritz Jakob Haber" → "Fritz Haber"), then one-word surnames → the one multi-word
    PERSON ending with that word ("Snow" → "Hank Snow")."""
    folded = {}
    t_toks = title.split()
    if len(t_toks) >= 2:
        for key in {key for _, _, lab, key in spans if lab in FOLD_FULL_FORMS}:
            if len(key.split()) > len(t_toks) and key.split()[0] == t_toks[0] and _is_subsequence(t_toks, key.split()):
                folded[key] = title
    persons = {folded.get(key, key) for _, _, lab, key in spans if lab == "PERSON"}
    # The passage's own title never folds away: it is the subject the passage is about.
    for key in {key for _, _, lab, key in spans if lab in FOLDABLE_SHORT and " " not in key} - {title}:
        hosts = {p for p in persons if p.endswith(" " + key)}
        if len(hosts) == 1 and key not in folded:  # ambiguous surnames (two Obamas) stay as they are
            folded[key] = hosts.pop()
    return folded


def extract_passage(doc: Any, title: str, title_label: Optional[Callable[[str], Optional[str]]] = None
                    ) -> list[tuple[int, int, list[tuple[int, int, str, str]], list[int]]]:
    """Per sentence: (start, end, mentions as (start, end, label, key), linker offsets).

    `title_label(title)` types a topic its passage never names (see `topic.add_topic_mentions`).
    """
    title_re, t_key = _title_pattern(title), title_key(title) if title else ""
    sents, sentences = list(doc.sents), []
    for i, sent in enumerate(sents):
        spans = [(a, b, lab, normalize_entity(doc.text[a:b])) for a, b, lab in _sentence_mentions(sent, title_re)]
        spans = [(a, b, lab, t_key if lab == "TITLE" else key) for a, b, lab, key in spans if key]
        if i == 0:  # the opening sentence's subject may name the topic in another form
            spans = topic.lead_subject(sent, spans, title, t_key)
        linkers = [t.idx for t in sent if t.tag_ in LINKER_TAGS]
        sentences.append((sent.start_char, sent.end_char, spans, linkers))
    folded = _fold_keys([m for s in sentences for m in s[2]], t_key)
    sentences = [(a, b, [(x, y, lab, folded.get(k, k)) for x, y, lab, k in spans], links)
                 for a, b, spans, links in sentences]
    topic.add_topic_mentions(sents, [spans for _, _, spans, _ in sentences], title, t_key, title_label)
    return sentences


def extract_mentions(doc: Any, title: str = "") -> list[Mention]:
    """Flat mention list of a Doc (free text such as a proposed target)."""
    return [Mention(doc.text[a:b], lab, key, a, b)
            for _, _, spans, _ in extract_passage(doc, title) for a, b, lab, key in spans]


class _Interner:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.ids)
        return i

    def strings(self) -> list[str]:
        return list(self.ids)


def pack(per_passage: Iterable[tuple[str, list]], n_passages: int) -> tuple[dict[str, np.ndarray], list, list]:
    """Flatten per-passage sentence records into CSR arrays plus vocabularies."""
    vocab, labels = _Interner(), _Interner()
    sent_ptr, sent_span, ment_ptr, ment, link_ptr, link, title_ent = [0], [], [0], [], [0], [], []
    label_counts: Counter = Counter()
    ent_pass: set[tuple[int, int]] = set()
    for p, (t_key, sentences) in enumerate(per_passage):
        title_ent.append(vocab(t_key))
        for a, b, spans, links in sentences:
            sent_span.append((a, b))
            for x, y, lab, key in spans:
                e, lb = vocab(key), labels(lab)
                ment.append((x, y, lb, e))
                label_counts[(e, lb)] += 1
                ent_pass.add((e, p))
            link.extend(links)
            ment_ptr.append(len(ment))
            link_ptr.append(len(link))
        sent_ptr.append(len(sent_span))
    n_ent = len(vocab.ids)
    ent_label = np.full(n_ent, -1, dtype=np.int32)
    best: dict[int, int] = {}
    for (e, lb), c in sorted(label_counts.items()):
        if c > best.get(e, 0):
            best[e], ent_label[e] = c, lb
    pairs = np.array(sorted(ent_pass), dtype=np.int32).reshape(-1, 2)
    ent_ptr = np.searchsorted(pairs[:, 0], np.arange(n_ent + 1)).astype(np.int32)
    i32 = np.int32
    arrays = {
        "sent_ptr": np.array(sent_ptr, i32), "sent_span": np.array(sent_span, i32).reshape(-1, 2),
        "ment_ptr": np.array(ment_ptr, i32), "ment": np.array(ment, i32).reshape(-1, 4),
        "link_ptr": np.array(link_ptr, i32), "link": np.array(link, i32),
        "ent_ptr": ent_ptr, "ent_pass": pairs[:, 1].copy(), "ent_label": ent_label,
        "title_ent": np.array(title_ent, i32).reshape(n_passages),
    }
    return arrays, vocab.strings(), labels.strings()


def default_processes(n_passages: int) -> int:
    """spaCy worker processes for a corpus: 1 on machines with fewer than 4 cores.

    Measured on this 2-core machine shared with other jobs (1,500 wiki_mini passages):
    1 process 36.7 s, 2 processes 42.5 s — the fork and model copy cost more than a busy
    second core returns. Bigger machines get one process per 2 cores, at most 4, and only
    for corpora large enough to amortize the start-up.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(4, cores // 2) if cores >= 4 and n_passages >= 2000 else 1


def annotate_records(passages: Sequence[Passage], model_name: str, n_process: int = 1,
                     batch_size: int = 64) -> Iterator[tuple[str, list]]:
    """Per passage, in order: (title key, `extract_passage` sentences), the records `pack` takes."""
    nlp = load_nlp(model_name)
    docs = nlp.pipe((p.text[:MAX_CHARS] for p in passages), batch_size=batch_size, n_process=n_process)
    label = partial(title_ner_label, nlp)
    return ((title_key(p.title), extract_passage(doc, p.title, label)) for p, doc in zip(passages, docs))


def title_ner_label(nlp: Any, title: str) -> Optional[str]:
    """NER label of a title read on its own ("Fritz Vogelgsang" → PERSON), when one entity
    spans all of it (disambiguator dropped); else None."""
    name = strip_disambiguator(title).strip()
    if not name:
        return None
    ents = nlp(name).ents
    return ents[0].label_ if len(ents) == 1 and ents[0].text == name else None


def unpack(arrays: dict[str, np.ndarray], vocab: list[str], labels: list[str]) -> Iterator[tuple[str, list]]:
    """The records `pack` was given, back from its output (the inverse of `pack`).

    Merging shards is unpacking each in corpus order and packing the whole stream once, so
    the merged vocabulary, labels and arrays are those of one pass over the corpus.
    """
    sent_ptr, sent_span = arrays["sent_ptr"].tolist(), arrays["sent_span"].tolist()
    ment_ptr, ment = arrays["ment_ptr"].tolist(), arrays["ment"].tolist()
    link_ptr, link = arrays["link_ptr"].tolist(), arrays["link"].tolist()
    for p, t_ent in enumerate(arrays["title_ent"].tolist()):
        sentences = []
        for s in range(sent_ptr[p], sent_ptr[p + 1]):
            spans = [(x, y, labels[lb], vocab[e]) for x, y, lb, e in ment[ment_ptr[s]:ment_ptr[s + 1]]]
            sentences.append((sent_span[s][0], sent_span[s][1], spans, link[link_ptr[s]:link_ptr[s + 1]]))
        yield vocab[t_ent], sentences


def merge_packed(parts: Iterable[tuple[dict[str, np.ndarray], list[str], list[str]]],
                 n_passages: int) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """One packed index of consecutive packed parts (shards in corpus order) holding `n_passages` in all."""
    return pack((rec for part in parts for rec in unpack(*part)), n_passages)


def index_meta(corpus: Corpus, model_name: str, arrays: dict[str, np.ndarray], vocab: list[str],
               n_process: int, annotate_s: float) -> dict[str, Any]:
    """meta.json of an entity index of `corpus` (one-shot or merged from shards)."""
    return {"spacy_model": model_name, "spacy_version": model_version(model_name),
            "annotator": ANNOTATOR_VERSION, "corpus_hash": corpus.content_hash, "corpus": corpus.name,
            "passages": len(corpus), "entities": len(vocab), "mentions": int(arrays["ment"].shape[0]),
            "n_process": n_process, "annotate_s": round(annotate_s, 3)}


def annotate_corpus(corpus: Corpus, model_name: str, n_process: Optional[int] = None,
                    batch_size: int = 64) -> tuple[dict[str, np.ndarray], list[str], list[str], dict[str, Any]]:
    """Run spaCy once over every passage; return the arrays, vocabularies and metadata."""
    t0 = time.perf_counter()
    if n_process is None:
        n_process = default_processes(len(corpus))
    records = annotate_records(corpus.passages, model_name, n_process, batch_size)
    records = track(records, f"entity annotation of corpus {corpus.name!r}", len(corpus), "passages")
    arrays, vocab, labels = pack(records, len(corpus))
    return arrays, vocab, labels, index_meta(corpus, model_name, arrays, vocab, n_process, time.perf_counter() - t0)
