"""evidence/extraction.py: one-hop cloze tasks from the corpus (the solver's label-free warm-start data)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coevo.core.inputs import InputError
from coevo.core.scoring import echoes
from coevo.orchestrate.solve_loop import load_tasks
from evidence.corpus import Corpus, Passage
from evidence.extraction import HELDOUT, TRAIN, PageSplit, cloze_of, extraction_tasks, page_split, write_tasks
from evidence.hits import Hit
from evidence.mentions import Mention, PassageAnnotation, SentenceAnnotation

NASHVILLE = "Nashville is the capital of Tennessee."


def annotation(pid: str, title: str, text: str, mentions: list[tuple[str, str]]) -> PassageAnnotation:
    """One sentence spanning the whole text; each (surface, label) mention at its first occurrence."""
    found = tuple(Mention(s, label, s.lower(), text.index(s), text.index(s) + len(s)) for s, label in mentions)
    return PassageAnnotation(pid, title, title.lower(), text, (SentenceAnnotation(0, 0, len(text), text, found, ()),))


def test_a_cloze_blanks_the_entity_that_is_not_the_title():
    ann = annotation("p1", "Nashville", NASHVILLE, [("Nashville", "GPE"), ("Tennessee", "GPE")])
    cloze, reason = cloze_of(ann, seed=0)
    assert reason == "" and cloze is not None
    assert cloze.question == 'Which name fills the blank in "Nashville is the capital of ___."?'
    assert (cloze.head, cloze.answer, cloze.passage_id) == ("Nashville", "Tennessee", "p1")


@pytest.mark.parametrize("ann, reason", [
    (None, "no_sentence"),
    (annotation("p2", "Vienna", "Vienna became a capital in 1918 after the war.", [("1918", "DATE")]), "no_sentence"),
    (annotation("p3", "Vienna", "Vienna is the capital city of Austria.", [("Vienna", "GPE")]), "no_sentence"),
    (annotation("p4", "Danube", "The Danube leaves Austria and enters Austria again downstream.",
                [("Austria", "GPE")]), "echo"),  # the answer stays visible after the blank
])
def test_rejected_candidates_name_their_reason(ann, reason):
    assert cloze_of(ann, seed=0) == (None, reason)


def test_a_too_short_sentence_is_not_used():
    ann = annotation("p5", "Rome", "Rome is Italy's.", [("Italy", "GPE")])
    assert cloze_of(ann, seed=0) == (None, "no_sentence")


class _Index:
    def __init__(self, anns: dict[str, PassageAnnotation]) -> None:
        self.anns, self.prepared = anns, []

    def prepare(self, ids):
        self.prepared += list(ids)

    def annotation(self, pid):
        return self.anns.get(pid)


class _Retriever:
    """Search by title: the passage titled like the query first, then the others in corpus order;
    a title in `miss` is never found."""

    def __init__(self, corpus: Corpus, miss: set[str]) -> None:
        self.corpus, self.miss = corpus, miss

    def search(self, queries, k):
        out = []
        for q in queries:
            first = [p.id for p in self.corpus.passages if p.title == q]
            rest = [p.id for p in self.corpus.passages if p.id not in first and p.title not in self.miss]
            out.append([Hit(pid, 1.0) for pid in ([] if q in self.miss else first + rest)[:k]])
        return out


def _toy() -> tuple[Corpus, _Index]:
    rows = [("Nashville", NASHVILLE, [("Tennessee", "GPE")]),
            ("Warsaw", "Warsaw lies on the Vistula River in Poland.", [("Vistula River", "LOC")]),
            ("Filler A", "Nothing here names anything at all today.", []),
            ("Filler B", "Nothing else here names anything at all.", [])]
    corpus = Corpus([Passage(f"p{i}", t, x) for i, (t, x, _) in enumerate(rows)], name="toy")
    return corpus, _Index({f"p{i}": annotation(f"p{i}", t, x, m) for i, (t, x, m) in enumerate(rows)})


def test_tasks_keep_only_retrievable_clozes_and_count_every_rejection():
    corpus, index = _toy()
    records, reasons, read = extraction_tasks(corpus, _Retriever(corpus, miss={"Warsaw"}), index, n=10, k=2)
    assert read == 4 and sorted(index.prepared) == ["p0", "p1", "p2", "p3"]
    assert reasons == {"no_sentence": 2, "not_retrievable": 1}
    question = 'Which name fills the blank in "Nashville is the capital of ___."?'
    assert records == [{"id": "extraction-0", "question": question,
                        "answers": ["Tennessee"], "guide": ["Nashville"], "gold_ids": ["p0"], "dataset": "extraction",
                        "page": "Nashville"}]


def test_tasks_stop_at_n_and_repeat_under_one_seed():
    corpus, index = _toy()
    retriever = _Retriever(corpus, miss=set())
    first = extraction_tasks(corpus, retriever, index, n=1, k=2, seed=3)[0]
    assert len(first) == 1 and first == extraction_tasks(corpus, retriever, index, n=1, k=2, seed=3)[0]
    assert len(extraction_tasks(corpus, retriever, index, n=5, k=2)[0]) == 2


# sha256 fractions (first 8 bytes / 2**64), by hand: Nashville 0.933, Warsaw 0.177, Filler A 0.556, Filler B 0.127,
# Music City 0.720. At a held-out share of 0.2, Warsaw and Filler B are held out, the others train.
def test_a_page_split_holds_its_share_and_gives_a_title_one_split():
    titles = [f"Page {i}" for i in range(4000)]
    first = {t: page_split(t, 0.2) for t in titles}
    assert set(first.values()) == {TRAIN, HELDOUT}
    assert all(page_split(t, 0.2) == first[t] for t in titles)  # the same page, the same split
    assert abs(sum(v == HELDOUT for v in first.values()) / len(titles) - 0.2) < 0.03  # 4.7 sd of a binomial
    assert [page_split(t, 0.2) for t in ("Nashville", "Warsaw", "Filler A", "Filler B", " Warsaw ")] == \
        [TRAIN, HELDOUT, TRAIN, HELDOUT, HELDOUT]
    assert page_split("Warsaw", 0.17) == TRAIN and page_split("Nashville", 0.94) == HELDOUT


def test_the_page_split_is_the_same_in_another_process():
    titles = ["Nashville", "Warsaw", "Filler A", "Filler B", "Zürich", *[f"Page {i}" for i in range(200)]]
    code = ("import json, sys; from evidence.extraction import page_split; "
            "print(json.dumps([page_split(t, 0.2) for t in json.loads(sys.argv[1])]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # Python's own str hash differs under another seed
    out = subprocess.run([sys.executable, "-c", code, json.dumps(titles)], capture_output=True, text=True, env=env,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert json.loads(out.stdout) == [page_split(t, 0.2) for t in titles]


def test_each_split_writes_only_its_pages_and_the_records_carry_it():
    corpus, index = _toy()
    retriever = _Retriever(corpus, miss=set())
    train, train_reasons, train_read = extraction_tasks(corpus, retriever, index, n=10, k=2, split=PageSplit(TRAIN))
    held, held_reasons, held_read = extraction_tasks(corpus, retriever, index, n=10, k=2, split=PageSplit(HELDOUT))
    assert (train_read, held_read) == (2, 2)  # Nashville, Filler A | Warsaw, Filler B
    assert [(r["page"], r["split"], r["gold_ids"]) for r in train] == [("Nashville", TRAIN, ["p0"])]
    assert [(r["page"], r["split"], r["gold_ids"]) for r in held] == [("Warsaw", HELDOUT, ["p1"])]
    assert train_reasons == held_reasons == {"no_sentence": 1}


def test_a_sentence_copied_on_a_page_of_the_other_split_is_not_a_task():
    corpus, index = _toy()
    copy = Passage("p4", "Music City", "Warsaw lies on the Vistula River in Poland.")  # a training page
    corpus = Corpus([*corpus.passages, copy], name="toy")
    index.anns["p4"] = annotation("p4", "Music City", copy.text, [("Vistula River", "LOC")])
    held, reasons, _ = extraction_tasks(corpus, _Retriever(corpus, miss=set()), index, n=10, k=2,
                                        split=PageSplit(HELDOUT))
    assert held == [] and reasons == {"no_sentence": 1, "cross_split": 1}


@pytest.mark.parametrize("name, share", [("dev", 0.2), (TRAIN, 0.0), (HELDOUT, 1.0)])
def test_a_bad_split_is_refused(name, share):
    with pytest.raises(ValueError, match="split must be|strictly between"):
        PageSplit(name, share)


def test_the_task_file_trains_guided_rollouts(tmp_path):
    corpus, index = _toy()
    records, _, _ = extraction_tasks(corpus, _Retriever(corpus, miss=set()), index, n=5, k=2)
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, records)
    tasks = load_tasks(path)
    assert [(t.guide, t.evidence_ids) for t in tasks] == [(r["guide"], r["gold_ids"]) for r in records]


def test_a_bad_guide_names_its_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "Who?", "answers": ["A"]}) + "\n"
                    + json.dumps({"question": "Who?", "answers": ["A"], "guide": "A"}) + "\n")
    with pytest.raises(InputError, match=r"q.jsonl:2: 'guide' must be a list"):
        load_tasks(path)


@pytest.mark.slow
def test_toy_corpus_tasks_are_answerable_by_their_guide(toy_corpus, toy_index, toy_retriever):
    records, reasons, read = extraction_tasks(toy_corpus, toy_retriever, toy_index, n=50, k=2)
    assert records and read == len(toy_corpus)
    assert len(records) + sum(reasons.values()) == read
    for r in records:
        hits = toy_retriever.search(r["guide"], 2)[0]
        assert r["gold_ids"][0] in [h.passage_id for h in hits]
        assert any(echoes(a, [toy_corpus[r["gold_ids"][0]].text]) for a in r["answers"])
        assert not any(echoes(a, [r["question"], *r["guide"]]) for a in r["answers"])
    assert records == extraction_tasks(toy_corpus, toy_retriever, toy_index, n=50, k=2)[0]


@pytest.mark.slow
def test_the_command_writes_a_task_file_coevo_solve_reads(small_corpus, tmp_path, monkeypatch, capsys):
    from evidence import extraction

    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tasks.jsonl"
    extraction.main(["--out", str(out), "--n", "5", "--", "corpus=jsonl", f"corpus.path={small_corpus}",
                     "ranker.top_k=2"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tasks = load_tasks(out)
    assert summary["tasks"] == len(tasks) == 5 and summary["k"] == 2 and summary["passages_read"] <= 80
    assert all(t.guide and t.evidence_ids for t in tasks)
    assert (summary["split"], summary["heldout_share"]) == (TRAIN, 0.2) and "sha256" in summary["split_rule"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["split"] == TRAIN and page_split(r["page"], 0.2) == TRAIN for r in rows)


@pytest.mark.parametrize("args, message", [
    (["--out", "x.jsonl", "--n", "0"], "--n must be at least 1"),
    (["--out", "x.jsonl", "--", "ranker.top_k=0"], "ranker.top_k"),
    (["--out", "x.jsonl", "--heldout-share", "1"], "--heldout-share must be strictly between 0 and 1"),
])
def test_command_line_errors_exit_2_naming_the_option(args, message, capsys):
    from evidence import extraction

    with pytest.raises(SystemExit) as stop:
        extraction.main(args)
    assert stop.value.code == 2 and message in capsys.readouterr().err
