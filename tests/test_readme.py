"""Every command block of README.md runs: with small overrides, in a temporary directory, and leaves the paths it names.

Each command is taken from the README as written (continuation lines joined, comments
dropped), then made small: the substitutions in `SUBSTITUTIONS` (placeholders, data paths,
sizes) and, per entry point, the overrides in `small_overrides` (tiny random models, one step,
one process, an 80-passage corpus, a temporary run dir), added only where the command does
not set the key itself. The commands run in order in one temporary directory, so the
inspect and eval commands read the run that `make run` wrote (`runs/<stamp>`). Commands that
cannot run here are in `NOT_RUN` with the reason; a README command that is in neither fails
the test, so a new command cannot go untested by accident.
"""
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VENV = Path(sys.executable).parent.parent  # the environment running the tests; `make` reuses it as is

NOT_RUN = {
    "make test": "runs the whole suite, this test included",
    # README "On GPU machines": tests/test_makefile.py checks what they would install (make -n).
    "make test DEVICE=cuda": "installs the CUDA stack (about 4 GB more) into a .venv of its own",
    "make run DEVICE=cuda": "needs that CUDA .venv",
    ".venv/bin/python -m coevo.run proposer=qwen3-4b solver=qwen2.5-7b ranker=qwen2.5-3b":
        "GPU presets: 29 GB of weights from the hub, one GPU per policy (num_gpus=1)",
    # README "On a cluster": tests/coevo/test_cluster_e2e.py runs the same on a two-node ray.cluster_utils.Cluster.
    """ray start --head --port=6379 --num-cpus=8 --num-gpus=4 --resources='{"node_a": 1}'""":
        "starts a Ray head node with GPUs this machine lacks",
    """ray start --address=<head>:6379 --num-cpus=8 --num-gpus=4 --resources='{"node_b": 1}'""":
        "joins a second machine to that cluster",
    ".venv/bin/python -m coevo.run ray.address=<head>:6379 proposer=qwen3-4b solver=qwen2.5-7b ranker=qwen2.5-3b":
        "needs that cluster and the GPU presets",
    ".venv/bin/python -m coevo.run ray.address=<head>:6379 experiment=smoke +solver.resources.node_b=0.1 "
    "ray.placement=pack": "needs that cluster (a node labelled node_b)",
    "ray stop": "stops that cluster",
}
# (README text, what runs instead, why): placeholders filled, and what is too big for a test made small.
SUBSTITUTIONS = [
    (".venv/bin/python", sys.executable, "the test's interpreter"),
    ("runs/<stamp>", "{run}", "the run `make run` wrote"),
    ("runs/learning/trained runs/learning/control", "{run} {run}", "that run compared with itself"),
    ("step_<n>", "step_0", "that run has one step"),
    ("../shared/data", "{data}", "the shared data, wherever it is"),
    ("/data/wiki-18.jsonl", "{corpus}", "wiki-18 (21M passages) is not here"),
    ("corpus=wiki_mini", "corpus=jsonl corpus.path={corpus}", "a dense index of wiki_mini takes ~8 min on 2 cores"),
    ("limit=25", "limit=2", "2 questions per dataset"),
    ("--step 3", "--step 0", "that run has one step"),
    ("[", "", "optional arguments: all given"),
    ("]", "", "optional arguments: all given"),
]
RUN_OUTPUTS = ("tasks/step_0.jsonl", "metrics.jsonl", "config.yaml", "checkpoints/step_0/COMPLETE",
               "checkpoints/step_0/solver", "run.log")  # what README's Outputs section says a run writes


def readme_commands(text: str) -> list[str]:
    """The commands of every ```bash block: continuation lines joined, comment lines and trailing comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = "" if line.lstrip().startswith("#") else line.split(" #")[0]
            if line.strip():
                commands.append(" ".join(line.split()))
    return commands


def entry_point(command: str) -> str:
    """`make run`, `coevo.run`, … or "" when the test does not know how to run it."""
    if command.startswith("make run"):
        return "make run"
    m = re.match(r"\.venv/bin/python -m (coevo\.(?:run|solve|eval|inspect)|evidence\.build_index)\b", command)
    return m.group(1) if m else ""


def test_every_readme_command_is_run_or_listed_with_a_reason():
    commands = readme_commands(README.read_text())
    assert len(commands) >= 10
    unknown = [c for c in commands if c not in NOT_RUN and not entry_point(c)]
    assert unknown == [], "README commands this test cannot run: add them to NOT_RUN with the reason, or a runner"
    assert [c for c in NOT_RUN if c not in commands] == [], "NOT_RUN lists commands the README no longer has"


def test_extraction_joins_continuations_and_drops_comments():
    text = "x\n```bash\n# a comment\nmake run   # note\n.venv/bin/python -m coevo.eval a=1 \\\n    b=2\n```\n"
    assert readme_commands(text) == ["make run", ".venv/bin/python -m coevo.eval a=1 b=2"]


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+") if "=" in arg else ""


def small_overrides(entry: str, args: list[str], fresh_dir: Path, corpus: Path) -> list[str]:
    """What makes `args` small, for the keys `args` does not set itself."""
    small_corpus = ["corpus=jsonl", f"corpus.path={corpus}"]
    extra = {
        "coevo.run": ["experiment=smoke", "run.steps=1", "ray.local=true", f"run.dir={fresh_dir}", *small_corpus],
        "coevo.solve": ["experiment=smoke", "solve.steps=1", "solve.limit=4", f"run.dir={fresh_dir}", *small_corpus],
        "coevo.eval": [] if "--compare" in args else ["experiment=smoke", *small_corpus],
    }.get(entry, [])
    given = {_key(a) for a in args}
    return [a for a in extra if _key(a) not in given]


def expected_paths(entry: str, args: list[str], cwd: Path) -> list[Path]:
    """The paths the README says the command leaves."""
    values = dict(a.split("=", 1) for a in args if "=" in a)
    if writes_nothing(args):
        return []
    if entry in ("coevo.run", "make run"):
        return [Path(values["run.dir"]) / p for p in RUN_OUTPUTS]
    if entry == "coevo.solve":
        return [Path(values["run.dir"]) / "metrics.jsonl", Path(values["run.dir"]) / "run.log"]
    if entry == "coevo.eval" and "out" in values:
        return [cwd / values["out"]]
    if entry == "coevo.inspect" and "--html" in args:
        return [cwd / args[args.index("--html") + 1]]
    return []


def writes_nothing(args: list[str]) -> bool:
    """`--help` and `dry_run=true`: the README says these leave nothing on disk."""
    return "--help" in args or "dry_run=true" in args


def prepare(command: str, n: int, work: Path, ctx: dict[str, str]) -> tuple[list[str], list[Path]]:
    """(argv, paths to check) of README command number `n`, made small."""
    for old, new, _why in SUBSTITUTIONS:
        command = command.replace(old, new.format(**ctx))
    entry = entry_point(command.replace(sys.executable, ".venv/bin/python"))
    args = shlex.split(command)
    if entry == "make run":  # its own arguments travel in ARGS="..."
        given = [a.split("=", 1)[1] for a in args[2:] if a.startswith("ARGS=")]
        overrides = [*shlex.split(given[0] if given else ""), f"run.dir={ctx['run']}"]
        overrides += small_overrides("coevo.run", overrides, Path(ctx["run"]), Path(ctx["corpus"]))
        argv = ["make", "-C", str(ROOT), "-o", str(VENV / ".installed"), f"VENV={VENV}", "run",
                "ARGS=" + " ".join(overrides)]
        return argv, expected_paths(entry, overrides, work)
    args += small_overrides(entry, args, work / f"run_{n}", Path(ctx["corpus"]))
    return args, expected_paths(entry, args, work)



@pytest.mark.slow
def test_every_readme_command_runs(tmp_path, shared_data, small_corpus):
    ctx = {"run": str(tmp_path / "runs" / "readme"), "data": str(shared_data),
           "corpus": str(small_corpus)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    failures, times = [], []
    for n, command in enumerate(readme_commands(README.read_text())):
        if command in NOT_RUN:
            continue
        argv, paths = prepare(command, n, tmp_path, ctx)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        times.append(f"{time.perf_counter() - t0:6.1f}s  {command}")
        missing = [str(p) for p in paths if not p.exists()]
        run_dirs = [Path(a.split("=", 1)[1]) for a in argv if a.startswith("run.dir=")]
        if writes_nothing(argv):  # nothing on disk afterwards, not even an empty run directory
            missing += [f"(should not exist) {d}" for d in run_dirs if d.exists()]
        if proc.returncode != 0 or missing:
            failures.append(f"{command}\n  ran: {shlex.join(argv)}\n  exit {proc.returncode}; missing {missing}\n"
                            f"{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    print("\n".join(times))
    assert failures == [], "\n\n".join(failures)
