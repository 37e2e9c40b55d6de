"""A run owns its directory (`run.dir`): one run at a time, no silent reuse, resume only into the same experiment.

- `claim_run_dir` takes an exclusive `flock` on `<run.dir>/.lock` for the run's life. The
  kernel drops it when the process ends, however it ends, so a killed run leaves no stale
  lock; a second run on the directory stops at once, naming the pid and host the holder
  wrote into the lock file. Processes forked from the holder share its lock until they end
  (the reaper of coevo/core/lifetime.py ends them with it).
- A directory that already holds a run is refused unless the run resumes it (`resume=true`)
  or asks for it to be emptied (`run.overwrite=true`). Hydra's record of this invocation
  (`.hydra/`: written before our code runs) and the run's log (`run.log`, with the vLLM
  logging config beside it) do not count and are kept. Only
  what a run writes (`RUN_OUTPUTS`) is ever deleted: a directory holding anything else is
  refused even with `run.overwrite=true`, so a mistyped run.dir cannot wipe other files.
- `check_same_experiment` compares a resumed run's stored config.yaml with the new one on
  every key that changes what the run computes (`NOT_EXPERIMENT` lists the keys that do not)
  and names each difference.

flock works on local filesystems and on NFSv4 (where the kernel maps it to a byte-range lock).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml

from coevo.core.io import is_sibling_of

LOCK_NAME = ".lock"
CONFIG_NAME = "config.yaml"
# The run's log (coevo/core/console.py) and the vLLM logging config beside it: opened once the run owns
# run.dir, appended to by every run there (a resumed run continues its log), never counted as a run's output.
LOG_NAME = "run.log"
VLLM_LOGGING_NAME = ".vllm-logging.json"
# What runs write into run.dir (coevo.run and coevo.solve), temp files of interrupted writes included
# (atomic_write_text's `.<name>.*.tmp`, the `.tmp-tensorboard-*` dir of a TensorBoard rebuild).
RUN_OUTPUTS = (LOCK_NAME, CONFIG_NAME, "metrics.jsonl", "events.jsonl", "tasks", "checkpoints", "tensorboard",
               ".hydra", "*.log", ".*.tmp", ".tmp-tensorboard-*")
# Keys that do not change what a run computes: its length, place, hardware, engine and labels.
NOT_EXPERIMENT = ("run.steps", "run.dir", "run.save_every", "run.memory_check", "run.overwrite", "resume", "dry_run",
                  "experiment_name", "log.*", "ray.*", "rollout.*", "retrieval.cache_dir", "retrieval.replicas",
                  "corpus.mmap", "solve.steps", "*.preset",
                  "*.engine", "*.num_cpus", "*.num_gpus", "*.gpu_memory_utilization", "*.vllm_enforce_eager",
                  "*.weight_sync", "*.sleep_mode", "cluster.collective_timeout_s",
                  "*.resources", "*.resources.*",
                  "placement.*",  # placement: where the actors ran (written by the run)
                  # how and where indexes get built, not what they hold
                  "evidence.build_in_run_max_passages", "evidence.shard_passages", "evidence.build_workers")


class RunDirError(RuntimeError):
    """run.dir cannot be used as asked; the message says why and what to do instead."""


@dataclass
class RunDirLock:
    """The held lock of one run directory; `release` (or leaving the `with` block) lets it go."""

    run_dir: Path
    fd: Optional[int]

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor of the lock file drops the flock
            self.fd = None

    def __enter__(self) -> "RunDirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_run_dir(run_dir: str | os.PathLike) -> RunDirLock:
    """Create `run_dir` if needed and lock it, or raise RunDirError naming the run that holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise _in_use(run_dir, holder) from None
    except BaseException:
        os.close(fd)
        raise
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return RunDirLock(run_dir, fd)


def _in_use(run_dir: Path, holder: str) -> RunDirError:
    return RunDirError(f"run.dir {run_dir} is in use by another run ({holder}); wait for it to end or stop it, "
                       "or choose another run.dir")


def check_not_in_use(run_dir: str | os.PathLike, locks_table: str = "/proc/locks") -> None:
    """Raise RunDirError when a live run holds `run_dir`'s lock, without taking it (a dry run's check).

    Taking the lock, even for a moment, could make a real run starting at that moment refuse the
    directory; the kernel's table of flock locks names the lock file by device and inode instead.
    Where that table cannot be read (no /proc), nothing is said and the real run's claim decides.
    """
    lock_file = Path(run_dir) / LOCK_NAME
    try:
        st = lock_file.stat()
        table = Path(locks_table).read_text()
    except OSError:
        return
    file_key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE 3445 fe:00:2146482 0 EOF"; "->" marks a waiter
        if "FLOCK" in fields and "->" not in fields and file_key in fields:
            fd = os.open(lock_file, os.O_RDONLY)
            try:
                raise _in_use(Path(run_dir), _holder(fd))
            finally:
                os.close(fd)


def _holder(fd: int, tries: int = 20) -> str:
    """Who holds the lock, from its record; the holder writes it just after locking, hence the retries."""
    for _ in range(tries):
        try:
            info = json.loads(os.pread(fd, 4096, 0))
            return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
        except (ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return "a process that has not written its pid into the lock file"


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, p) for p in patterns)


def claim_run_dir(run_dir: str | os.PathLike, *, resume: bool, overwrite: bool, keep: Iterable[str] = (),
                  resumable: bool = False) -> RunDirLock:
    """Lock `run_dir` and make sure this run may write there (emptying it first with `overwrite`).

    keep: names in `run_dir` that belong to this invocation (`hydra_entries`): never counted, never
    deleted. resumable: whether the directory holds a checkpoint (only the advice given changes).
    The verdict is `run_dir_verdict`'s, taken under the lock: a directory another live run holds is
    refused as that ("in use by another run"), before what it holds is looked at.
    """
    run_dir = Path(run_dir)
    _check_flags(resume, overwrite)
    lock = lock_run_dir(run_dir)
    try:
        doomed = run_dir_verdict(run_dir, resume=resume, overwrite=overwrite, keep=keep, resumable=resumable)
        for name in doomed:
            _remove(run_dir / name)
        if doomed:
            print(f"run.overwrite=true: deleted {_listing(doomed)} from {run_dir}", flush=True)
    except BaseException:
        lock.release()
        raise
    return lock


def run_dir_verdict(run_dir: str | os.PathLike, *, resume: bool, overwrite: bool, keep: Iterable[str] = (),
                    resumable: bool = False) -> list[str]:
    """What a run with these settings would delete from `run_dir` (`run.overwrite`), reading only.

    Raises RunDirError when the run may not write there: resume and overwrite together, a path that
    is not a directory or cannot be created, a directory holding a run without resume or overwrite,
    or anything no run writes under overwrite. A dry run calls it as is; `claim_run_dir` under the lock.
    """
    _check_flags(resume, overwrite)
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        _check_creatable(run_dir)
        return []
    keep = {LOCK_NAME, LOG_NAME, VLLM_LOGGING_NAME, *keep}
    held = sorted(p.name for p in run_dir.iterdir() if p.name not in keep)
    if not held or resume:
        return []
    if not overwrite:
        raise RunDirError(_refusal(run_dir, held, resumable))
    foreign = [name for name in held if not _matches(name, RUN_OUTPUTS)]
    if foreign:
        raise RunDirError(f"run.overwrite=true refused: run.dir {run_dir} holds {_listing(foreign)}, which no "
                          "run writes; move them away or choose another run.dir")
    return held


def _check_flags(resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise RunDirError("resume=true and run.overwrite=true contradict each other: resume continues run.dir, "
                          "overwrite deletes what it holds")


def _check_creatable(run_dir: Path) -> None:
    """A missing run.dir must be creatable: its nearest existing ancestor a writable directory."""
    if run_dir.exists():
        raise RunDirError(f"run.dir {run_dir} exists and is not a directory")
    ancestor = next(p for p in run_dir.absolute().parents if p.exists())
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise RunDirError(f"run.dir {run_dir} cannot be created: {ancestor} is not a writable directory")


def _listing(names: list[str], shown: int = 6) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _refusal(run_dir: Path, held: list[str], resumable: bool) -> str:
    if resumable:
        advice = "pass resume=true to continue it, run.overwrite=true to delete its contents and start over"
    else:
        advice = "it holds no checkpoint to resume: pass run.overwrite=true to delete its contents and start over"
    return f"run.dir {run_dir} already holds a run ({_listing(held)}); {advice}, or choose another run.dir"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def remove_temp_files(run_dir: str | os.PathLike) -> list[str]:
    """Delete the temp files of writes a killed run left: `.<name>.*.tmp` beside config, metrics and
    dumps, and the temp dir of a TensorBoard rebuild (resume rewrites `tensorboard/` under `atomic_dir`).

    Only safe under the run's lock: nobody else writes there. Returns the paths removed.
    """
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / "tasks"):
        for path in sorted(folder.glob(".*.tmp")) if folder.is_dir() else []:
            if path.is_file():
                path.unlink()
                removed.append(str(path))
    for path in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        if is_sibling_of(path.name, run_dir / "tensorboard") and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed.append(str(path))
    return removed


def hydra_entries(run_dir: str | os.PathLike) -> tuple[str, ...]:
    """Names Hydra wrote into `run_dir` for this invocation before our code ran (`.hydra`, `<job>.log`)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ()
    hc = HydraConfig.get()
    if Path(hc.runtime.output_dir).resolve() != Path(run_dir).resolve():
        return ()
    return tuple(name for name in (hc.output_subdir, f"{hc.job.name}.log") if name)


# ---- resuming the same experiment --------------------------------------------------------------

def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        nested = isinstance(value, dict) and value
        out.update(_flatten(value, f"{prefix}{key}.") if nested else {f"{prefix}{key}": value})
    return out


def experiment_differences(stored: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """`key: stored X, now Y` for each experiment key (not in NOT_EXPERIMENT) whose value differs.

    A key missing from `stored` (added to the schema after that run began) counts as its schema
    default from `defaults`: new keys default to the behaviour from before they existed.
    """
    old, cur, schema = _flatten(stored), _flatten(new), _flatten(defaults)
    missing = object()
    out = []
    for key in sorted(old.keys() | cur.keys()):
        if _matches(key, NOT_EXPERIMENT):
            continue
        before, now = old.get(key, schema.get(key, missing)), cur.get(key, missing)
        if before == now:
            continue
        if now is missing:
            out.append(f"{key}: stored {json.dumps(before)}, no longer a config key")
        elif before is missing:
            out.append(f"{key}: not in the stored config, now {json.dumps(now)}")
        else:
            out.append(f"{key}: stored {json.dumps(before)}, now {json.dumps(now)}")
    return out


def schema_defaults(schema: type) -> dict[str, Any]:
    """The schema's own defaults as plain data (interpolations and `???` left as strings)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(schema), resolve=False, enum_to_str=True)  # type: ignore[return-value]


def check_same_experiment(run_dir: str | os.PathLike, new_yaml: str, schema: type) -> None:
    """Raise RunDirError naming every experiment key where `new_yaml` differs from the stored config.yaml."""
    path = Path(run_dir) / CONFIG_NAME
    try:
        stored = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise RunDirError(f"resume=true but {path} is unreadable ({e}): cannot check that this run continues the "
                          "same experiment") from None
    if not isinstance(stored, dict):
        raise RunDirError(f"resume=true but {path} holds no config mapping: cannot check the experiment")
    diffs = experiment_differences(stored, yaml.safe_load(new_yaml), schema_defaults(schema))
    if diffs:
        raise RunDirError(f"resume=true but this run's config differs from the one stored in {path}:\n  "
                          + "\n  ".join(diffs) + "\nresume with the stored values, or start a new run (another "
                          "run.dir, or run.overwrite=true to replace this one)")
