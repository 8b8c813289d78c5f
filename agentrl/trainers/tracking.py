"""What a run records as it goes: its id, a metrics JSONL, WandB, a console line per step.

    tracker = RunTracker(run_dir, project="agentrl", experiment="sokoban-ppo", config=cfg,
                         resume_step=start_step - 1 if resuming else None)
    for step in range(start_step, total_steps + 1):
        with tracker.progress(f"step {step} rollout", total=num_episodes) as bar:
            ...                                   # bar.update(1) per finished episode
        tracker.log(step, metrics)                # one JSONL line, WandB, one console line
    tracker.close()

- **Run id**: ``<experiment>-<yyyymmdd-hhmmss>-<4 hex>``, kept in ``<run_dir>/run.json`` so a
  resumed run reuses it (WandB continues the same run).
- **Metrics**: ``<run_dir>/metrics.jsonl``, one flat JSON object per step
  (``{"step": 3, "time": <unix s>, "train/simpleSokobanAgent/success": 0.25, ...}``), flushed
  per line. Steps strictly increase: one record per step, so a trainer logs a step's training
  and validation metrics in one call. Non-finite values are written as ``null`` (strict JSON).
- **Resume**: a step can be logged and then lost (killed before its checkpoint). A tracker
  made with ``resume_step=N`` first drops the records after step ``N`` (and a half-written last
  line), rewriting the file atomically, so the redone steps appear once: no step is duplicated
  or missing. ``resume_step=None`` starts the history afresh (a run restarted from scratch in
  the same folder).
- **WandB**: offline by default (files under ``<run_dir>/wandb``, upload later with
  ``wandb sync``); online when ``WANDB_API_KEY`` is set; ``WANDB_MODE`` or ``wandb_mode``
  (``online|offline|disabled``) overrides both. ``wandb.init(id=run_id, resume="allow")``
  continues the same run after a resume; WandB keeps the first record of a redone step and drops
  the repeat with a warning (the JSONL is the full record). A failing ``wandb.init`` is logged
  as a warning and the run goes on without WandB.
- **Secrets**: the config given to WandB (and written into checkpoints) passes through
  :func:`public_config`, which replaces the values of secret-looking keys (``api_key``,
  ``hf_token``, ``password``, ...) and any string equal to a secret environment variable (like
  ``WANDB_API_KEY``) with ``"<redacted>"``. Nothing here prints the key.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import math
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from agentrl.rollout.episode_record import episode_table, sample_line

__all__ = [
    "METRICS_FILE", "REDACTED", "RUN_FILE", "WANDB_MODES", "RunTracker", "keep_metrics",
    "matching_keys", "metrics_record", "new_run_id", "public_config", "read_metrics",
    "resolve_wandb_mode", "run_config", "run_id_for", "summary_line",
]

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
WANDB_MODES = ("online", "offline", "disabled")
REDACTED = "<redacted>"
RESERVED_KEYS = ("step", "time")

# Key names whose values are secrets (lower-cased): ``key`` and ``token`` alone, or ending in a
# secret's name: ``wandb_api_key``, ``hf_token`` and ``db_password`` are redacted;
# ``pad_token`` and ``max_response_tokens`` are not.
SECRET_NAME = re.compile(
    r"^(key|token)$|(^|[._-])(api[_-]?key|access[_-]?key|secret|secret[_-]?key|password|passwd"
    r"|credentials?|(access|auth|api|hf|wandb|bearer|refresh)[_-]?token)$"
)
# Environment variables whose values must never appear in a file or on the console.
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL")
MIN_SECRET_LENGTH = 8  # shorter values ("1", "true") would redact ordinary settings

# (pattern, label) of the console summary, in order; ``{preset}`` is the pattern's ``*`` part.
SUMMARY_FIELDS = (
    ("train/*/success", "success {preset}"),
    ("val/*/success", "val {preset}"),
    ("train/*/return", "return {preset}"),
    ("sft/loss", "sft_loss"),
    ("actor/pg_loss", "pg_loss"),
    ("critic/vf_loss", "vf_loss"),
    ("actor/ppo_kl", "ppo_kl"),
    ("actor/kl", "kl"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/entropy", "entropy"),
    ("timing/step_s", "s"),
    ("timing_s/step", "s"),
)


# --- run identity --------------------------------------------------------------------------

def new_run_id(experiment: str, now: datetime | None = None) -> str:
    """``<experiment>-<yyyymmdd-hhmmss>-<4 hex>``; the experiment name is reduced to
    ``[A-Za-z0-9_.-]`` (WandB ids may not hold ``/ \\ # ? % :``) and at most 40 characters."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment).strip("-.")[:40] or "run"
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def run_id_for(run_dir: str | Path, experiment: str) -> str:
    """The run id recorded in ``<run_dir>/run.json``, or a new one recorded there."""
    path = Path(run_dir) / RUN_FILE
    if path.exists():
        record = json.loads(path.read_text())
        run_id = record.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"{path}: 'run_id' must be a non-empty string, got {run_id!r}")
        return run_id
    run_id = new_run_id(experiment)
    record = {"run_id": run_id, "experiment": experiment, "created": datetime.now().isoformat()}
    write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    return run_id


# --- config and secrets --------------------------------------------------------------------

def plain_config(config: Any) -> Any:
    """Dataclasses, OmegaConf configs and mappings as plain dicts/lists (interpolations
    resolved); values other than str, int, float, bool and None (paths, enums) as strings."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return plain_config(dataclasses.asdict(config))
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Mapping):
        return {str(k): plain_config(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [plain_config(v) for v in config]
    return config if config is None or isinstance(config, (str, int, float, bool)) else str(config)


def public_config(config: Any) -> Any:
    """:func:`plain_config` with secrets replaced by ``"<redacted>"`` (see the module docstring)."""
    return _redact(plain_config(config), _secret_values())


def _secret_values() -> set[str]:
    return {v for k, v in os.environ.items()
            if SECRET_ENV.search(k.upper()) and len(v) >= MIN_SECRET_LENGTH}


def _redact(value: Any, secret_values: set[str], name: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _redact(v, secret_values, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, secret_values) for v in value]
    if value is not None and SECRET_NAME.search(name.lower()):
        return REDACTED
    if isinstance(value, str) and any(s in value for s in secret_values):
        return REDACTED
    return value


def scrub(text: str) -> str:
    """``text`` with every secret environment value replaced (for error messages we log)."""
    for secret in _secret_values():
        text = text.replace(secret, REDACTED)
    return text


# --- metrics file --------------------------------------------------------------------------

def run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config: ``config.yaml`` in the run folder, else the newest
    checkpoint's; ``{}`` when neither exists."""
    import yaml

    candidates = [run_dir / "config.yaml"]
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir():
        candidates += sorted(checkpoints.glob("step_*/config.yaml"), reverse=True)
    for path in candidates:
        if path.is_file():
            loaded = yaml.safe_load(path.read_text())
            return loaded if isinstance(loaded, dict) else {}
    return {}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics JSONL, in file order. A half-written last line (a crash while
    writing) is skipped; a broken line elsewhere is an error naming its line number."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                log.warning("%s: skipping a half-written last line", path)
                break
            raise ValueError(f"{path}:{number}: not a JSON object: {line[:80]!r}") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise TypeError(f"{path}:{number}: a record needs an integer 'step'")
        records.append(record)
    return records


def keep_metrics(path: Path, keep: Callable[[dict[str, Any]], bool], dropped: str
                 ) -> list[dict[str, Any]]:
    """Keep the records of a metrics JSONL for which ``keep`` holds, and no half-written last
    line; the file is rewritten atomically, only when something goes (``dropped`` says which
    records, in the warning). Returns the kept records."""
    text = path.read_text() if path.exists() else ""
    records = read_metrics(path)
    kept = [r for r in records if keep(r)]
    whole_lines = text.endswith("\n") or not text  # else the next line would be glued on
    if len(kept) != sum(1 for line in text.splitlines() if line.strip()) or not whole_lines:
        if len(kept) < len(records):
            log.warning("%s: dropping %d record(s) %s", path, len(records) - len(kept), dropped)
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, and rename it into place:
    a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, file_mode())  # mkstemp's 0600 -> as any file the user writes
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def file_mode() -> int:
    """The mode a new file gets from the umask (0644 under the usual 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in ``folder`` durable (no-op where folders can't be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def metrics_record(step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """One metrics JSONL record: ``step``, ``time`` and the metrics as numbers (non-finite: None)."""
    record: dict[str, Any] = {"step": step, "time": round(time.time(), 3)}
    for key, value in metrics.items():
        if key in RESERVED_KEYS:
            raise ValueError(f"metric name {key!r} is reserved (reserved: {', '.join(RESERVED_KEYS)})")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}") from None
        record[key] = number if math.isfinite(number) else None
    return record


# --- console -------------------------------------------------------------------------------

def matching_keys(keys: Iterable[str], pattern: str) -> list[str]:
    """The keys matching a glob like ``train/*/success``, sorted."""
    return sorted(k for k in keys if fnmatch.fnmatchcase(k, pattern))


def summary_line(step: int, metrics: Mapping[str, Any], total_steps: int | None = None) -> str:
    """One line with the metrics a person watches: success per preset, return, losses, KL,
    entropy, seconds per step (the keys in ``SUMMARY_FIELDS`` that are present)."""
    parts = [f"step {step}" + (f"/{total_steps}" if total_steps else "")]
    for pattern, label in SUMMARY_FIELDS:
        for key in matching_keys(metrics, pattern):
            value = metrics[key]
            if value is None:
                continue
            preset = key.split("/")[1] if "{preset}" in label else ""
            parts.append(f"{label.format(preset=preset)} {float(value):.3g}")
    return " | ".join(parts)


# --- WandB ---------------------------------------------------------------------------------

def resolve_wandb_mode(requested: str | None = None) -> str:
    """``requested``, else ``$WANDB_MODE``, else ``online`` when ``$WANDB_API_KEY`` is set,
    else ``offline``."""
    for source, mode in (("wandb_mode", requested), ("WANDB_MODE", os.environ.get("WANDB_MODE"))):
        if mode:
            mode = "offline" if mode == "dryrun" else mode  # WandB's old name for offline
            if mode not in WANDB_MODES:
                raise ValueError(f"{source}={mode!r}: allowed values are {', '.join(WANDB_MODES)}")
            return mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _start_wandb(run_dir: Path, project: str, experiment: str, run_id: str, config: Any,
                 mode: str) -> Any:
    """A WandB run, or ``None`` when disabled or when WandB fails to start (logged)."""
    if mode == "disabled":
        return None
    try:
        import wandb

        return wandb.init(
            project=project, name=experiment, id=run_id, resume="allow", dir=str(run_dir),
            mode=mode, config=public_config(config or {}),
            settings=wandb.Settings(console="off", silent=True),
        )
    except Exception as error:  # noqa: BLE001 -- no network, bad key, no wandb: the run goes on
        log.warning("WandB disabled for this run: %s: %s", type(error).__name__,
                    scrub(str(error).splitlines()[0] if str(error) else ""))
        return None


def _wandb_table(episodes: Sequence[Mapping[str, Any]]) -> Any:
    """The episode records as a ``wandb.Table`` (one row per turn)."""
    import wandb

    columns, rows = episode_table(episodes)
    return wandb.Table(columns=list(columns), data=rows)


# --- the tracker ---------------------------------------------------------------------------

class RunTracker:
    """The run's metrics history (JSONL), WandB run and console output; see the module docstring.

    ``run_id=None`` reads or creates ``<run_dir>/run.json``. ``resume_step`` is the step of the
    checkpoint the run continues from (records after it are dropped); ``None`` starts afresh.
    ``last_step`` is the last step in the history (``None`` when empty). ``console=False``
    silences the summary lines and progress bars.
    """

    def __init__(self, run_dir: str | Path, *, project: str, experiment: str,
                 run_id: str | None = None, config: Any = None, use_wandb: bool = True,
                 wandb_mode: str | None = None, resume_step: int | None = None,
                 total_steps: int | None = None, console: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id or run_id_for(self.run_dir, experiment)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.total_steps = total_steps
        self.console = console
        self.last_step = self._keep_history_until(resume_step)
        self._file = self.metrics_path.open("a")
        mode = resolve_wandb_mode(wandb_mode) if use_wandb else "disabled"
        self.wandb_run = _start_wandb(self.run_dir, project, experiment, self.run_id, config, mode)

    def _keep_history_until(self, resume_step: int | None) -> int | None:
        """Drop the records after ``resume_step`` (all when ``None``); the last kept step."""
        kept = keep_metrics(self.metrics_path,
                            lambda r: resume_step is not None and r["step"] <= resume_step,
                            "of an earlier start (the run starts over)" if resume_step is None
                            else f"after step {resume_step} (they will be redone)")
        return kept[-1]["step"] if kept else None

    def log(self, step: int, metrics: Mapping[str, Any],
            episodes: Sequence[Mapping[str, Any]] = ()) -> None:
        """Record ``step``'s metrics: a JSONL line (flushed), WandB, and a console line.
        Steps must increase: logging a step twice is an error, not a second record.
        ``episodes`` (episode records of the step) go to WandB as the table ``episodes``
        (one row per turn), and a validation episode's first reply to the console."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} is not after the last logged step {self.last_step}; "
                             "log each step once, with all its metrics")
        record = metrics_record(step, metrics)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self.last_step = step
        if self.wandb_run is not None:
            values = {k: v for k, v in record.items() if k not in RESERVED_KEYS and v is not None}
            if episodes:
                values["episodes"] = _wandb_table(episodes)
            self.wandb_run.log(values, step=step)
        if self.console:
            tqdm.write(summary_line(step, record, self.total_steps))
            line = sample_line([e for e in episodes if e.get("split") == "val"])
            if line:
                tqdm.write("  " + line)

    def progress(self, stage: str, total: int | None = None, *, unit: str = "it") -> tqdm:
        """A progress bar for one stage of a step (cleared when done; hidden off a terminal)."""
        return tqdm(total=total, desc=stage, unit=unit, leave=False,
                    disable=None if self.console else True, dynamic_ncols=True)

    def records(self) -> list[dict[str, Any]]:
        """The history so far (from the file, so it includes the steps before a resume)."""
        if not self._file.closed:
            self._file.flush()
        return read_metrics(self.metrics_path)

    def close(self, exit_code: int = 0) -> None:
        """Flush and close the metrics file and finish the WandB run (idempotent)."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        if self.wandb_run is not None:
            run, self.wandb_run = self.wandb_run, None
            try:
                run.finish(exit_code=exit_code)
            except Exception as error:  # noqa: BLE001 -- the metrics file is already safe
                log.warning("WandB finish failed: %s", scrub(str(error)))

    def __enter__(self) -> RunTracker:  # noqa: PYI034 -- typing.Self needs Python 3.11
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exit_code=0 if exc_type is None else 1)
