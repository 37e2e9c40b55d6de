"""The command line of the Hydra entry points (coevo.run, coevo.solve, coevo.eval): what Hydra does not check.

`hydra_entry` runs before Hydra sees the arguments:
- `--help [name]` prints every schema key with its type, its value in this command (the
  overrides given applied), its one-line documentation and (a number) its valid range, grouped like the schema, and the
  config groups with their options; `name` (a group, a block such as `ranker` or
  `solver.reward`, or one key) prints only that part. Hydra's own help stays at `--hydra-help`.
- the whole config is composed and validated first (unknown keys with their closest known key,
  `+key` included; values, ranges): a typo fails at once and leaves nothing on disk, where
  Hydra would first have created the run directory with its `.hydra/` and log file.
- `dry_run=true`: Hydra is told to write nothing (no run directory, `.hydra/` or log file).

Every command's exit codes are the two below (and 128 + n after signal n: coevo/core/stopping.py);
what each means for a run is written out in coevo/orchestrate/startup_checks.py, which applies them.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from coevo.core.config import CONFIG_DIR, SCHEMAS, compose
from coevo.core.schema import (
    SchemaKey,
    check_override_keys,
    config_groups,
    first_line,
    override_key,
    plain,
    schema_keys,
    type_name,
    unknown_key_error,
)

EXIT_FAILED = 1  # the run (or the command's work) stopped on an error, or the memory budget refused it
EXIT_REFUSED = 2  # the command cannot start as asked (the shell's usage-error convention)

COMMANDS = {"coevo": "run", "solve": "solve", "eval": "eval"}  # Hydra config name -> `python -m coevo.<command>`
# What keeps Hydra from writing anything: no run directory (the current one, which exists), no .hydra/, no log file.
DRY_RUN_OVERRIDES = ("hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout")
HELP_FLAGS = ("--help", "-h")
_DOC_COLUMN = 56  # documentation starts here unless the declaration is longer


def hydra_entry(hydra_main: Callable[[], Any], config_name: str, validate: Callable[[DictConfig], Any],
                argv: Optional[Sequence[str]] = None) -> None:
    """Run the `@hydra.main` function `hydra_main` of root `config_name` after the checks above.

    validate: the entry point's own DictConfig -> typed, validated config (e.g. `to_object`).
    Errors print `coevo.<command>: error: ...` and exit with code 2.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    prog = f"coevo.{COMMANDS[config_name]}"
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if override_key(a) is not None]
    extra: list[str] = []
    try:
        if any(f in HELP_FLAGS for f in flags):
            names = [a for a in args if not a.startswith("-") and a not in overrides]
            print(format_help(config_name, compose(overrides, config_name, return_hydra_config=True), names))
            sys.exit(0)
        if flags:  # Hydra's own modes (--cfg, --info, -m, ...): it composes; the keys are checked here
            check_override_keys(overrides, SCHEMAS[f"{config_name}_schema"], config_groups(CONFIG_DIR))
        elif validate(compose(overrides, config_name)).dry_run:
            extra = list(DRY_RUN_OVERRIDES)
    except (ValueError, FileNotFoundError, HydraException, OmegaConfBaseException) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    sys.argv = [sys.argv[0], *args, *extra]
    hydra_main()


# ---- --help ----------------------------------------------------------------------------------------

def _value(data: Any, path: str) -> str:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    if data is None:
        return "null"
    if isinstance(data, bool):
        return str(data).lower()
    return repr(data) if data == "" else str(data)


def _row(key: SchemaKey, values: Any) -> tuple[str, str]:
    """(`path: type = value`, its doc with its valid range, if a number) of one key."""
    valid = f"  [range: {key.range.describe(key.path.rpartition('.')[2])}]" if key.range is not None else ""
    return f"{key.path}: {type_name(key.hint)} = {_value(values, key.path)}", key.doc + valid


def _sections(schema: type, values: Any) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, title, rows) per block of the schema, top-level keys first, nested blocks after their parent."""
    keys = schema_keys(schema)
    top = [_row(k, values) for k in keys if "." not in k.path and k.block is None]
    out = [("", f"top level ({schema.__name__}): {first_line(schema.__doc__)}", top)]
    for block in (k for k in keys if k.block is not None):
        rows = [_row(k, values) for k in keys if k.block is None and k.path.rpartition(".")[0] == block.path]
        out.append((block.path, f"{block.path} ({block.block.__name__}): {block.doc}", rows))
    return out


def _option_doc(group: str, option: str) -> str:
    """First comment line of configs/<group>/<option>.yaml, else its first two top-level values.

    A role preset (`/model@_here_: <preset>`) is described by its model preset.
    """
    lines = (Path(CONFIG_DIR) / group / f"{option}.yaml").read_text(encoding="utf-8").splitlines()
    for line in lines:
        if "/model@_here_:" in line:
            return _option_doc("model", line.split(":", 1)[1].strip())
    docs = [ln.lstrip("# ").strip() for ln in lines if ln.startswith("#") and "@package" not in ln]
    values = [ln.strip() for ln in lines if ln[:1].isalpha() and not ln.startswith(("defaults:", "preset:"))]
    return docs[0] if docs else "; ".join(values[:2])


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


def _groups_part(choices: dict[str, Any], only: Optional[str] = None) -> list[str]:
    if only is not None:
        width = max(len(o) for o in _options(only))
        return [f"{only}={_value(choices, only)} (options: configs/{only}/<option>.yaml)"] + [
            f"  {o:<{width}}  {_option_doc(only, o)}" for o in _options(only)]
    groups = [g for g in config_groups(CONFIG_DIR) if g in choices]
    chosen = {g: f"{g}={_value(choices, g)}" for g in groups}
    width = max(len(c) for c in chosen.values())
    return ["Config groups (group=option picks configs/<group>/<option>.yaml; --help <group> describes them):"] + [
        f"  {chosen[g]:<{width}}  options: {', '.join(_options(g))}" for g in groups]


def _render(rows: list[tuple[str, str]]) -> list[str]:
    width = min(_DOC_COLUMN, max((len(d) for d, _ in rows), default=0))
    return [f"  {decl:<{width}}  # {doc}" if doc else f"  {decl}" for decl, doc in rows]


def format_help(config_name: str, cfg: DictConfig, names: Sequence[str] = ()) -> str:
    """The `--help` text of root `config_name` for composed `cfg` (with its Hydra node); `names`: only those parts."""
    schema = SCHEMAS[f"{config_name}_schema"]
    prog = f"python -m coevo.{COMMANDS[config_name]}"
    values = plain(cfg)
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if "/" not in k and "@" not in k}
    sections = _sections(schema, values)
    if not names:
        lines = [f"usage: {prog} [group=option ...] [key=value ...]",
                 f"       {prog} --help [group | block | key]   this help, or one part of it", "",
                 *_groups_part(choices), "",
                 "Keys (key=value), grouped like the schema in coevo/core/config.py; values are this command's "
                 "with the overrides given:"]
        for _, title, rows in sections:
            lines += ["", title, *_render(rows)]
        return "\n".join(lines)
    lines = []
    for name in names:
        part = _help_part(name, schema, sections, choices)
        lines += ([""] if lines else []) + part
    return "\n".join(lines)


def _help_part(name: str, schema: type, sections: list[tuple[str, str, list[tuple[str, str]]]],
               choices: dict[str, Any]) -> list[str]:
    """The lines of `--help <name>`: a config group's options, a block with its nested blocks, or one key."""
    lines = _groups_part(choices, name) + [""] if name in choices else []
    chosen = [(title, rows) for path, title, rows in sections if path == name or path.startswith(name + ".")]
    for title, rows in chosen:
        lines += [title, *_render(rows)]
    if chosen or lines:
        return lines
    error = unknown_key_error(name, schema)
    if error is not None:
        raise error
    rows = [row for _, _, rows in sections for row in rows if row[0].startswith(f"{name}:")]
    return _render(rows)
