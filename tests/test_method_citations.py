"""Every `docs/method.md §N` citation in the repository names a section that docs/method.md has, and
nothing cites the specification the code was first written from, a file outside the repository.

A text scan of the repository's source, config and documentation files (no imports, well under a
second). A citation is `docs/method.md` followed by `§N` or `§N.M`, optionally continued as a list or a
range (`§4.2, §4.4`, `§5.1-5.2`); every number in it must be a numbered heading of docs/method.md
(`## 3. …`, `### 3.2 …`), and so must every `§N` that docs/method.md itself uses. Outside
docs/method.md a `§` that is not part of such a citation points nowhere and fails, as does the old
specification's name.
"""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "method.md"
THIS = Path(__file__).resolve()
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt"}
NAMES = {"Makefile"}
# Build outputs, run outputs, caches and environments: not the repository's text.
SKIP_DIRS = {"__pycache__", "runs", "outputs", "multirun", "build", "dist", "node_modules", "shared"}

NUMBER = r"\d+(?:\.\d+)*"
CITATION = re.compile(rf"docs/method\.md\s+§\s*{NUMBER}(?:\s*(?:[-–]|,)\s*§?\s*{NUMBER})*")
SECTION_REF = re.compile(rf"§\s*({NUMBER})(?:\s*[-–]\s*({NUMBER}))?")
HEADING = re.compile(rf"^#{{2,6}}\s+({NUMBER})\.?\s", re.MULTILINE)
OLD_SPEC = re.compile(r"\b" + "SP" + r"EC\b")  # split so that this file does not match itself


def repository_files(root: Path = ROOT) -> list[Path]:
    """The text files the scan reads: source, configs and docs, outside hidden and output directories."""
    out = []
    for folder, dirs, files in os.walk(root):
        # Pruned in place, so the walk never enters .venv or .git (rglob would, then filter: seconds).
        dirs[:] = sorted(d for d in dirs if not (d.startswith(".") or d in SKIP_DIRS or d.endswith(".egg-info")))
        for name in sorted(files):
            path = Path(folder) / name
            if (path.suffix in SUFFIXES or name in NAMES) and path.resolve() != THIS:
                out.append(path)
    return out


def sections(text: str) -> set[str]:
    """Numbers of the numbered headings of a markdown text ("3", "3.2"); a number used twice is an error."""
    found = HEADING.findall(text)
    twice = sorted({n for n in found if found.count(n) > 1})
    assert not twice, f"docs/method.md numbers these sections twice: {twice}"
    return set(found)


def cited(citation: str) -> list[str]:
    """The section numbers one citation names: "docs/method.md §4.2, §4.4" -> ["4.2", "4.4"]."""
    return re.findall(NUMBER, citation.split("§", 1)[1])


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def dangling(text: str, known: set[str], name: str) -> list[str]:
    """`name:line: citation` for each citation in `text` naming a section not in `known`."""
    bad = []
    for m in CITATION.finditer(text):
        missing = [n for n in cited(m.group(0)) if n not in known]
        if missing:
            bad.append(f"{name}:{line_of(text, m.start())}: {m.group(0)!r} (no section {', '.join(missing)})")
    return bad


def stray(text: str, name: str) -> list[str]:
    """`name:line: text` for each `§` outside a docs/method.md citation and each use of the old spec's name."""
    kept = CITATION.sub(lambda m: " " * len(m.group(0)), text)  # same length: line numbers stay right
    bad = [f"{name}:{line_of(text, m.start())}: section sign outside a docs/method.md citation"
           for m in re.finditer("§", kept)]
    bad += [f"{name}:{line_of(text, m.start())}: names the specification outside the repository"
            for m in OLD_SPEC.finditer(text)]
    return bad


@pytest.fixture(scope="module")
def known() -> set[str]:
    return sections(METHOD.read_text(encoding="utf-8"))


def test_method_has_numbered_sections(known):
    assert {"3.2", "4.5", "5.1"} <= known  # sections the code cites most; a renumbering must update them


def test_every_citation_names_an_existing_section(known):
    bad = []
    for path in repository_files():
        bad += dangling(path.read_text(encoding="utf-8", errors="replace"), known, str(path.relative_to(ROOT)))
    assert not bad, "citations of sections docs/method.md does not have:\n" + "\n".join(bad)


def test_method_refers_only_to_its_own_sections(known):
    text = METHOD.read_text(encoding="utf-8")
    bad = [f"docs/method.md:{line_of(text, m.start())}: §{n}" for m in SECTION_REF.finditer(text)
           for n in m.groups() if n is not None and n not in known]
    assert not bad, "docs/method.md refers to sections it does not have:\n" + "\n".join(bad)


def test_nothing_cites_the_old_specification():
    bad = []
    for path in repository_files():
        if path.resolve() == METHOD:
            continue
        bad += stray(path.read_text(encoding="utf-8", errors="replace"), str(path.relative_to(ROOT)))
    assert not bad, "references that point outside the repository (cite docs/method.md §N):\n" + "\n".join(bad)


def test_the_scan_reads_code_docs_and_configs():
    names = {str(p.relative_to(ROOT)) for p in repository_files()}
    assert {"README.md", "docs/method.md", "coevo/core/grpo.py", "configs/experiment/paper_zest.yaml"} <= names
    assert not any(n.startswith(".venv/") for n in names)


def test_the_parsers_on_hand_written_text():
    known = {"3", "3.2", "4", "4.2", "4.4", "5.1", "5.2"}
    assert cited("docs/method.md §4.2, §4.4") == ["4.2", "4.4"]
    assert cited("docs/method.md §5.1-5.2") == ["5.1", "5.2"]
    assert dangling("see docs/method.md §3.2 and docs/method.md §4.2, §4.7.", known, "f") == [
        "f:1: 'docs/method.md §4.2, §4.7' (no section 4.7)"]
    assert dangling("x\n(docs/method.md\n§9)", known, "g") == ["g:2: 'docs/method.md\\n§9' (no section 9)"]
    assert stray("docs/method.md §3.2, §4.4 and the §5.4 key", "h") == [
        "h:1: section sign outside a docs/method.md citation"]
    assert stray("see " + "SP" + "EC §3.2", "i") == ["i:1: section sign outside a docs/method.md citation",
                                                   "i:1: names the specification outside the repository"]
    assert stray("SPECIAL spec docs/method.md §3", "j") == []
    assert sections("## 3. A\n### 3.2 B\ntext ## 4\n#### 4.2 C\n") == {"3", "3.2", "4.2"}
