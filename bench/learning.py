"""Benchmark (not a test): does co-evolution learn? A trained arm against a frozen control.

    .venv/bin/python -m bench.learning [--steps 4] [--eval-limit 70] [--eval-data FILE] [--eval-rollout vllm|hf]
        [--out DIR] [--png FILE] [--ray] [--seed 0] [--arm-timeout S] [--parallel] [--eval-arg KEY=VALUE ...]
        [--no-own-ranker] [--heldout CLOZES.jsonl]
        [-- HYDRA_OVERRIDES...]
    .venv/bin/python -m bench.learning --steps 2 --eval-limit 1 --eval-rollout hf -- experiment=smoke  # minutes

Runs `python -m coevo.run` twice, one arm after the other (`--parallel`: both at once, each
arm then its eval), with the same seed, data and
overrides (those after `--`, e.g. `ranker.prime_tag=true`): `trained`, and `control` with every
policy frozen (`proposer.frozen=true solver.frozen=true ranker.frozen=true`). One after the other,
the control runs the steps the trained arm finished (fewer than `--steps` when `--arm-timeout` stopped
it), so both arms pool the same steps. Each arm is a
subprocess (`ray.local=true` unless `--ray`), so its processes are gone when it ends; its run
dir is `<out>/<arm>` (default out: runs/learning-<stamp>), its output goes to
`<out>/<arm>-run.log` and, prefixed, to stderr. Then `python -m coevo.eval mode=agent` evaluates
each arm's final solver twice, with its own ranker (the run's `ranker.mode`, `<out>/<arm>-eval.json`)
and with none (`ranker.mode=none`, `<out>/<arm>-eval-none.json`; one eval when the run's mode is
`none`), on the first `--eval-limit` questions of each dataset
of `--eval-data` (default `$COEVO_SHARED_DATA/wiki_mini/questions_dev.jsonl`, whose answer
passages are all in the eval's default corpus wiki_mini: 70 per dataset = 212 questions), with
`rollout=<--eval-rollout>` (default vllm) and the overrides after `--`, then `--eval-arg`.
Trained: the latest checkpoint's solver (and ranker, `ranker.mode=trainable`, when one was
trained); control: the initial weights. `--eval-limit 0` skips evaluation. The two arms' evals are
then paired question by question, and the sampled rollouts of both runs pooled (`paired`, `in_run`:
bench/learning_stats.py's docstring defines both blocks and the POOLED counts).

Stdout is ONE JSON line, also written atomically to `<out>/learning.json` (rewritten after each
phase, so a killed benchmark leaves what it had); a PNG of the main curves goes to `--png`
(default `<out>/learning.png`). An arm whose run dies still reports the steps it finished,
with `error` set; the line is printed anyway, and the exit status is then 1 (0 when every run
and eval succeeded). Overrides that do not compose stop before any run: `arms` is empty and a
top-level `error` says why. `png_error` appears only when the plot failed.

    {"steps": N, "wall_s": seconds, "command": "python -m bench.learning ...", "overrides": [...],
     "out": dir, "png": file, "machine": {"cores", "cpu_flags": {flag: bool}}, "arms": {"trained": ARM, "control": ARM},
     "paired": {"no_ranker": PAIRED, "own_ranker": PAIRED, "heldout": PAIRED} | null, "in_run": {...} | null}
    ARM = {"run_dir", "run_command", "run_s", "returncode", "error" (null when fine),
           "series": {...}, "eval": {...} | null, "eval_no_ranker": {...} | null, "eval_heldout": {...}}

`machine`: this machine's cores and vector / bf16 flags (bench.limits's): a step's update time depends on
them (bf16 matmuls ran at 411 GFLOP/s without AMX, 1,865 with it: docs/limits-run8.json, -run9.json), so step
counts under `--arm-timeout` compare only between runs on like machines.
`paired` (null with `--eval-limit 0` and no `--heldout`) and `in_run` are written once both arms are done.
`series`: one entry per finished step (metrics.jsonl line / tasks/step_<n>.jsonl dump); a rate
with nothing to count is null.
- steps: the step numbers; candidates, accepted: proposed / accepted task counts;
- task_acceptance, target_acceptance, path_acceptance: share of candidates accepted / with a
  valid target / with a certified evidence path;
- reasons: {reason code: count} of the rejected candidates;
- proposer_reward, solver_reward, ranker_reward: mean reward of candidates / rollouts / ranker calls;
- solver_format_valid: share of rollouts that kept the action format; accuracy: mean solver
  accuracy on accepted tasks; mean_searches: searches per rollout;
- ranker_calls; ranker_format_valid: share of well-formed ranker outputs; hit@1 … hit@5: Hit@k of
  the ranking where an answer passage was among the candidates (None at a cutoff the step did not
  record: cutoffs are {1, 3, 5} capped at ranker.top_k); hit@K: the one at the largest recorded cutoff;
- solver_groups: accepted tasks with rollouts (one solver GRPO group each); mixed_groups,
  all_correct_groups, all_wrong_groups: their shares whose rollouts' `correctness` is mixed /
  all >= 1 / all <= 0 (from the dumps);
- accepted_hops: evidence-path hop count of each accepted task (from the dumps);
- updates: {role: sequences in that role's GRPO update (0 when skipped)}; zero_var_groups: {role:
  its groups without reward variance (null when not reported)}; step_s: seconds of the step.
`--no-own-ranker`: no own-ranker evals (`eval` null). `--heldout FILE` (`evidence.extraction --split
heldout`): a third eval per arm, all of FILE, `ranker.mode=none`, on the run's corpus (where the clozes'
gold passages are): `eval_heldout` (`<arm>-eval-heldout.json`), paired as `paired.heldout`.
`eval` (own ranker) and `eval_no_ranker` (`ranker.mode=none`; the same eval under both keys when
the run's mode is `none`), each the macro average over datasets from its coevo.eval result file: em,
f1, cover_em, format_failure (share of episodes without a well-formed answer), searches (mean per
question), n (questions), per_dataset ({dataset: {em, f1, n}}), pooled (POOLED: questions with EM 1
/ questions, Wilson interval), ranker_mode, file, checkpoint (null: initial weights), command,
eval_s, error (null when fine).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Optional, Sequence

from bench import split_overrides
from bench.learning_plot import plot
from bench.learning_stats import eval_pooled, in_run_block, paired_blocks
from bench.limits import cpu_flags
from coevo.core.config import compose
from coevo.core.io import atomic_write_text
from coevo.evaluate.report import load_run
from coevo.evaluate.series import extract_series  # the per-step series, shared with coevo.inspect
from coevo.train.checkpoint import latest_checkpoint

_ROOT = Path(__file__).resolve().parents[1]

ARMS = ("trained", "control")
FROZEN = ["proposer.frozen=true", "solver.frozen=true", "ranker.frozen=true"]

# ---- eval summary (pure) -------------------------------------------------------------------

def eval_summary(result: dict) -> dict[str, Any]:
    """The macro-averaged numbers of a coevo.eval result, EM/F1/n of each dataset (`per_dataset`) and the
    pooled right answers (`pooled`, null when the result holds no predictions)."""
    metrics = result.get("metrics") or {}
    avg = metrics.get("average") or {}
    per_dataset = {name: {"em": m.get("em"), "f1": m.get("f1"), "n": m.get("n")}
                   for name, m in metrics.items() if name != "average" and isinstance(m, dict)}
    return {"em": avg.get("em"), "f1": avg.get("f1"), "cover_em": avg.get("cover_em"),
            "format_failure": avg.get("format_failure"), "searches": avg.get("mean_searches"), "n": avg.get("n"),
            "per_dataset": per_dataset, "pooled": eval_pooled(result)}


# ---- subprocesses ---------------------------------------------------------------------------

def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def arm_env(parallel: bool) -> dict[str, str]:
    """The environment of an arm's processes: with `--parallel`, each arm's torch gets half the cores.

    Two arms at once with torch's default (one thread per core each) put twice as many busy
    threads as cores on the machine, and every parallel op then waits for a descheduled thread.
    """
    env = dict(os.environ)
    if parallel:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, (os.cpu_count() or 2) // len(ARMS)))
    return env


def run_logged(cmd: list[str], log: Path, tag: str, timeout: Optional[float],
               env: Optional[dict[str, str]] = None) -> tuple[int, list[str], float]:
    """Run `cmd` in its own session from the repo root; its output goes to `log` and (tagged) stderr.

    Returns (exit code, last output lines, seconds). On timeout or exit, whatever the command
    left in its process group is killed, so nothing of it outlives this call.
    """
    t0 = time.perf_counter()
    tail: deque[str] = deque(maxlen=12)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(cmd, cwd=_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True, env=env)
        expired = threading.Event()
        timer = threading.Timer(timeout, lambda: (expired.set(), _kill_group(proc.pid))) if timeout else None
        if timer is not None:
            timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                f.write(line)
                f.flush()
                tail.append(line.rstrip())
                print(f"[{tag}] {line.rstrip()}", file=sys.stderr, flush=True)
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            _kill_group(proc.pid)
            proc.wait()
    if expired.is_set():
        tail.append(f"killed after the {timeout:.0f}s time limit")
    return rc, list(tail), time.perf_counter() - t0


def _error(what: str, rc: int, tail: list[str]) -> str:
    last = " | ".join([line for line in tail if line.strip()][-3:])
    return f"{what} exited with code {rc}: " + (last if len(last) <= 600 else "..." + last[-600:])


def _shown(cmd: list[str]) -> str:
    return shlex.join(["python", *cmd[1:]] if cmd[0] == sys.executable else cmd)


def run_arm(arm: str, args: argparse.Namespace, out: Path, steps: Optional[int] = None) -> dict[str, Any]:
    """Run one arm's co-evolution loop for `steps` (None: `--steps`); its series (what it finished) and any error."""
    run_dir = out / arm
    steps = args.steps if steps is None else steps
    cmd = [sys.executable, "-m", "coevo.run", *args.overrides, f"run.steps={steps}", f"run.dir={run_dir}",
           f"seed={args.seed}", f"ray.local={str(not args.ray).lower()}", *(FROZEN if arm == "control" else [])]
    print(f"== {arm}: {_shown(cmd)}", file=sys.stderr, flush=True)
    rc, tail, seconds = run_logged(cmd, out / f"{arm}-run.log", arm, args.arm_timeout, arm_env(args.parallel))
    arm_result: dict[str, Any] = {"run_dir": str(run_dir), "run_command": _shown(cmd), "run_s": round(seconds, 1),
                                  "returncode": rc, "error": None if rc == 0 else _error("coevo.run", rc, tail)}
    try:
        records, metrics = load_run(run_dir)
        arm_result["series"] = extract_series(metrics, records)
    except (OSError, ValueError) as e:
        arm_result["series"] = extract_series([], [])
        arm_result["error"] = arm_result["error"] or f"reading {run_dir}: {e}"
    return arm_result


def control_steps(trained: Optional[dict[str, Any]], steps: int) -> int:
    """The control's step count, one arm after the other: the steps the trained arm finished (at least 1), so
    both arms pool the same steps when `--arm-timeout` (or an error) stopped the trained one short of `steps`."""
    finished = len(((trained or {}).get("series") or {}).get("steps") or [])
    return min(steps, max(1, finished))


def ranker_mode(overrides: Sequence[str]) -> str:
    """The run's `ranker.mode` under these overrides (what both arms' evaluations use)."""
    return str(compose(list(overrides)).ranker.mode)


def eval_overrides(arm: str, run_dir: Path, mode: str) -> tuple[list[str], Optional[str], Optional[str]]:
    """(eval overrides naming the arm's weights, checkpoint used or None, error or None)."""
    overrides = [f"ranker.mode={mode}"]
    if arm == "control":
        return overrides, None, None
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return overrides, None, f"no complete checkpoint in {run_dir}/checkpoints: nothing trained to evaluate"
    if (ckpt / "solver").is_dir():
        overrides.append(f"solver.checkpoint={ckpt / 'solver'}")
    if (ckpt / "ranker").is_dir() and mode == "trainable":
        overrides.append(f"ranker.checkpoint={ckpt / 'ranker'}")
    return overrides, str(ckpt), None


def run_corpus(overrides: Sequence[str]) -> list[str]:
    """The overrides that give an eval the run's corpus (eval.yaml's default is wiki_mini)."""
    corpus = compose(list(overrides)).corpus
    return [f"corpus={corpus.name}", *([f"corpus.path={corpus.path}"] if corpus.get("path") else [])]


def evaluate_arm(arm: str, args: argparse.Namespace, out: Path, mode: str, name: str = "eval",
                 heldout: bool = False) -> dict[str, Any]:
    """Agent-mode eval of one arm's final solver with `ranker.mode=<mode>` into `<out>/<arm>-<name>.json`;
    the eval summary (or its error). `heldout`: every question of `--heldout` on the run's corpus instead
    of `--eval-limit` a dataset of `--eval-data`."""
    own, ckpt, error = eval_overrides(arm, out / arm, mode)
    result: dict[str, Any] = {"ranker_mode": mode, "checkpoint": ckpt, "error": error}
    if error:
        return result
    path = out / f"{arm}-{name}.json"
    data = [f"data={args.heldout}", "limit=null", *run_corpus(args.overrides)] if heldout \
        else [f"data={args.eval_data}", f"limit={args.eval_limit}"]
    cmd = [sys.executable, "-m", "coevo.eval", *args.overrides, f"rollout={args.eval_rollout}", *args.eval_arg,
           "mode=agent", *data, f"seed={args.seed}", f"out={path}", *own]
    print(f"== {name} {arm}: {_shown(cmd)}", file=sys.stderr, flush=True)
    rc, tail, seconds = run_logged(cmd, out / f"{arm}-{name}.log", f"{name} {arm}", args.arm_timeout,
                                   arm_env(args.parallel))
    result.update(file=str(path), command=_shown(cmd), eval_s=round(seconds, 1))
    if rc != 0:
        return {**result, "error": _error("coevo.eval", rc, tail)}
    try:
        return {**eval_summary(json.loads(path.read_text(encoding="utf-8"))), **result}
    except (OSError, ValueError) as e:
        return {**result, "error": f"reading {path}: {e}"}


# ---- output, main ---------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Options before `--`; everything after it is Hydra overrides for both arms (and their eval)."""
    options, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="co-evolution steps per arm")
    parser.add_argument("--eval-limit", type=int, default=70,
                        help="questions per dataset in the eval (0: no eval; 70 on wiki_mini dev: 212 questions)")
    parser.add_argument("--eval-data", type=Path, default=Path(os.environ.get("COEVO_SHARED_DATA", "../shared/data"))
                        / "wiki_mini" / "questions_dev.jsonl",
                        help="questions whose answer passages are in the eval corpus (default wiki_mini's dev set)")
    parser.add_argument("--eval-rollout", choices=("hf", "vllm"), default="vllm",
                        help="rollout engine of the evals (the arms' runs use the overrides' one)")
    parser.add_argument("--eval-arg", action="append", default=[], help="extra override for the evals only")
    parser.add_argument("--no-own-ranker", action="store_true", help="only the ranker.mode=none evals")
    parser.add_argument("--heldout", type=Path, default=None, help="held-out clozes, evaluated as well")
    parser.add_argument("--out", type=Path, default=None, help="default runs/learning-<stamp>")
    parser.add_argument("--png", type=Path, default=None, help="default <out>/learning.png")
    parser.add_argument("--ray", action="store_true", help="run the roles as Ray actors (default ray.local=true)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arm-timeout", type=float, default=None, help="seconds per run and per eval")
    parser.add_argument("--parallel", action="store_true",
                        help="run the two arms (and their evals) at the same time instead of one after the other")
    args = parser.parse_args(options)
    args.overrides = overrides
    if args.steps < 1 or args.eval_limit < 0:
        parser.error("--steps must be >= 1 and --eval-limit >= 0")
    args.out = (args.out or Path("runs") / f"learning-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    args.png = (args.png or args.out / "learning.png").resolve()
    args.eval_data = args.eval_data.expanduser().resolve()
    args.heldout = args.heldout.expanduser().resolve() if args.heldout else None
    return args


def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: null instead, so every reader parses the line."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return [_finite(v) for v in x] if isinstance(x, list) else x


def _write(result: dict[str, Any], out: Path) -> str:
    line = json.dumps(_finite(result), ensure_ascii=False, allow_nan=False)
    atomic_write_text(out / "learning.json", line + "\n")
    return line


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0 = time.perf_counter()
    command = shlex.join(["python", "-m", "bench.learning", *argv])
    result: dict[str, Any] = {"steps": args.steps, "wall_s": None, "command": command, "overrides": args.overrides,
                              "out": str(args.out), "png": str(args.png),
                              "machine": {"cores": os.cpu_count(), "cpu_flags": cpu_flags()}, "arms": {},
                              "paired": None, "in_run": None}
    try:
        mode = ranker_mode(args.overrides)
    except Exception as e:  # a bad override: both arms would fail the same way
        mode, result["error"] = "none", f"overrides do not compose: {e}"
    lock = threading.Lock()

    def save() -> None:
        with lock:
            _write({**result, "wall_s": round(time.perf_counter() - t0, 1)}, args.out)

    def arm_job(arm: str) -> None:
        steps = None if args.parallel or arm == "trained" else control_steps(result["arms"].get("trained"), args.steps)
        arm_result = run_arm(arm, args, args.out, steps)
        with lock:
            result["arms"][arm] = arm_result
        save()
        own = args.eval_limit and not args.no_own_ranker
        arm_result["eval"] = evaluate_arm(arm, args, args.out, mode) if own else None
        save()
        arm_result["eval_no_ranker"] = evaluate_arm(arm, args, args.out, "none", "eval-none") \
            if args.eval_limit and (mode != "none" or not own) else arm_result["eval"]
        save()
        if args.heldout:
            arm_result["eval_heldout"] = evaluate_arm(arm, args, args.out, "none", "eval-heldout", heldout=True)
            save()

    if "error" not in result:
        if args.parallel:  # both arms at once: each is one process, so two cores serve one arm each
            jobs = [threading.Thread(target=arm_job, args=(arm,), name=arm) for arm in ARMS]
            for job in jobs:
                job.start()
            for job in jobs:
                job.join()
            result["arms"] = {arm: result["arms"][arm] for arm in ARMS if arm in result["arms"]}
        else:
            for arm in ARMS:
                arm_job(arm)
        result["paired"] = paired_blocks(result["arms"], mode, not args.no_own_ranker, args.heldout is not None) \
            if args.eval_limit or args.heldout else None
        result["in_run"] = in_run_block(result["arms"], args.steps, args.seed)
    try:
        plot(result["arms"], args.png, result["command"])
    except Exception as e:  # the numbers matter more than the picture
        result["png_error"] = f"{type(e).__name__}: {e}"
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(_write(result, args.out), flush=True)
    failed = "error" in result or any(a.get("error") or (a.get("eval") or {}).get("error")
                                      or (a.get("eval_no_ranker") or {}).get("error")
                                      or (a.get("eval_heldout") or {}).get("error")
                                      for a in result["arms"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
