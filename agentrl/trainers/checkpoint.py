"""Checkpoints a run can resume from: written atomically, found by step, the last K kept.

    state = {"optimizers": {...}, "schedulers": {...}, "step": 12}
    save_checkpoint(run_dir, 12, models={"actor": (model, tokenizer)},
                    tensors={"critic": value_head.state_dict(), "trainer_state": state},
                    config=cfg, keep_last=3)
    path = newest_intact_checkpoint(Path(run_dir) / CHECKPOINTS_DIR)  # a run: resume.py
    loaded = load_checkpoint(path)
    restore_weights(model, loaded.model_dirs["actor"])

Layout, one folder per step::

    <run_dir>/checkpoints/step_000012/
        actor/              save_pretrained() of each object given for "actor" (model or peft
                            adapter, tokenizer)
        critic.pt           torch.save() of each entry of ``tensors``
        trainer_state.pt
        config.yaml         the resolved config, secrets redacted (tracking.public_config)
        COMPLETE            written last, the manifest: {"step", "saved_at",
                            "files": {relative path: {"bytes": n, "sha256": hex}}}
    <run_dir>/checkpoints/best.json
                            the run's best checkpoint by held-out validation (write_best):
                            {"step", "checkpoint": "step_000012", "val_success", "val",
                            "saved_at"}; that folder survives ``keep_last`` pruning

**Atomic.** Everything is written (and fsynced) into ``step_000012.tmp-<pid>``, the marker
last, and the folder is then renamed to ``step_000012``. A crash at any point leaves either no
``step_*`` folder or a complete one. A checkpoint counts only if its marker parses, names its
step, and every file it lists exists with the listed size, so a folder copied half-way or
truncated is ignored too. Leftovers (temporary folders of processes that are gone, folders
without a valid marker) are deleted at the next save. Old checkpoints are renamed away before
they are deleted, so a crash while pruning never leaves a folder that still looks complete.

**Verified before use.** :func:`checkpoint_problem` re-reads every file against the manifest's
sizes and SHA-256 checksums (about a second per GB; the result is kept for the process while
no file changes). ``resume=auto`` takes the newest *intact* checkpoint: a damaged newer one is
named in a warning and skipped. When checkpoints exist and none is intact the run stops with a
``ValueError`` naming each and why: starting over would overwrite the run's history (what a
resumed run may change: :mod:`agentrl.trainers.resume`). Manifests of older checkpoints (sizes
only) are checked by size.

**Best and last.** A run keeps its best checkpoint by held-out validation beside its newest:
``save_checkpoint(..., keep_steps=(best,))`` prunes around it, and ``best.json`` names it,
written atomically (a temporary file, fsynced, renamed over the old one) after the folder it
names is complete. A run folder stands for its best checkpoint (:func:`run_checkpoint`,
:func:`model_folder`) unless ``last`` or ``step_N`` is asked for; a run without ``best.json``
(no validation, an ``agentrl sft`` run, an older run) stands for its newest intact one.

**Loading.** ``*.pt`` files load with ``torch.load(weights_only=True)``: tensors, containers and
plain numbers only, no pickled code (:mod:`agentrl.trainers.rng_state` stores RNG states in
that form). Model folders are HF
folders: pass them to ``from_pretrained`` / ``load_model`` or restore into a built model with
:func:`restore_weights` (keeps the parameter objects an optimizer already holds).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml

from agentrl.trainers.tracking import fsync_dir, public_config
from agentrl.trainers.verl_checkpoints import is_verl_run, verl_model

__all__ = [
    "BEST_FILE", "CHECKPOINTS_DIR", "CHECKPOINT_CHOICES", "CONFIG_FILE", "MARKER",
    "BestRecord", "LoadedCheckpoint", "checkpoint_problem", "checkpoint_step", "chosen_model",
    "clear_best", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "model_folder",
    "newest_intact_checkpoint", "prune_checkpoints", "read_best", "restore_weights",
    "run_checkpoint", "save_checkpoint", "write_best",
]

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
MARKER = "COMPLETE"
CONFIG_FILE = "config.yaml"
MODEL_FILES = ("config.json", "adapter_config.json")
HASH_CHUNK = 1 << 22

BEST_FILE = "best.json"
CHECKPOINT_CHOICES = "best, last or step_N"
"""What ``checkpoint=`` (``--checkpoint``) may name among a run folder's checkpoints."""

STEP_DIR = re.compile(r"step_(\d+)")
LEFTOVER_DIR = re.compile(r"step_\d+\.(tmp|old|trash)-(\d+)")
LEFTOVER_BEST = re.compile(re.escape(BEST_FILE) + r"\.tmp-(\d+)")
STEP_CHOICE = re.compile(r"(?:step_)?(\d+)")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
RESERVED_NAMES = {CONFIG_FILE.split(".")[0], MARKER}


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read back: ``tensors`` by name (``critic.pt`` -> ``"critic"``), the config,
    and the HF folders of the saved models by name."""

    path: Path
    step: int
    tensors: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    model_dirs: dict[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class BestRecord:
    """A run's best checkpoint by held-out validation: ``val_success`` is the mean over the
    validation presets of ``val/<preset>/success`` (``val``: each preset's)."""

    step: int
    val_success: float
    val: dict[str, float] = field(default_factory=dict)

    @property
    def folder_name(self) -> str:
        return f"step_{self.step:06d}"


# --- saving --------------------------------------------------------------------------------

def save_checkpoint(run_dir: str | Path, step: int, *,
                    models: Mapping[str, Any | Sequence[Any]] | None = None,
                    tensors: Mapping[str, Any] | None = None, config: Any = None,
                    keep_last: int | None = None, keep_steps: Sequence[int] = ()) -> Path:
    """Write the checkpoint of ``step`` atomically and return its folder.

    ``models``: name -> an object with ``save_pretrained(folder)`` or a sequence of them (a model
    and its tokenizer), saved into ``<name>/``. ``tensors``: name -> anything ``torch.save``
    stores, saved as ``<name>.pt``. ``config``: a mapping, dataclass or OmegaConf config, saved
    as ``config.yaml``. ``keep_last``: keep only the newest K complete checkpoints (``None``:
    all) and those of ``keep_steps`` (the run's best). A checkpoint already saved for ``step`` is replaced, and so is every later one: a run
    that saves ``step`` resumed from before them (a damaged newest checkpoint, ``resume=`` an
    older one), so they are an abandoned future that must neither be resumed nor count
    among the kept.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                  or keep_last < 1):
        raise ValueError(f"keep_last must be a positive int or None, got {keep_last!r}")
    models, tensors = dict(models or {}), dict(tensors or {})
    _check_names(models, tensors)
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root)
    final = root / f"step_{step:06d}"
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        _write_contents(tmp, models, tensors, config)
        _write_marker(tmp, step)
        _move_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for later in _step_folders(root):
        if _folder_step(later) > step:
            _delete(later)
    if keep_last is not None:
        prune_checkpoints(run_dir, keep_last, keep_steps)
    return final


def prune_checkpoints(run_dir: str | Path, keep_last: int, keep_steps: Sequence[int] = ()
                      ) -> None:
    """Delete the complete checkpoints of ``run_dir`` older than its newest ``keep_last``,
    except those of ``keep_steps``."""
    for old in list_checkpoints(run_dir)[:-keep_last]:
        if checkpoint_step(old) not in keep_steps:
            _delete(old)


def _check_names(models: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    for kind, names in (("models", models), ("tensors", tensors)):
        for name in names:
            if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED_NAMES:
                raise ValueError(f"{kind} name {name!r}: use letters, digits, '_' and '-', "
                                 f"not {' or '.join(sorted(RESERVED_NAMES))}")
    if clash := set(models) & set(tensors):
        raise ValueError(f"names used for both models and tensors: {sorted(clash)}")


def _write_contents(folder: Path, models: Mapping[str, Any], tensors: Mapping[str, Any],
                    config: Any) -> None:
    for name, objects in models.items():
        for obj in objects if isinstance(objects, (list, tuple)) else (objects,):
            obj.save_pretrained(folder / name)
    for name, value in tensors.items():
        torch.save(value, folder / f"{name}.pt")
    if config is not None:
        text = yaml.safe_dump(public_config(config), sort_keys=False, allow_unicode=True)
        (folder / CONFIG_FILE).write_text(text)
    for path in _files(folder):
        _fsync_file(path)


def _write_marker(folder: Path, step: int) -> None:
    """The marker goes last: its presence, with matching file sizes, means "complete"."""
    files = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in _files(folder)}
    record = {"step": step, "saved_at": datetime.now().isoformat(timespec="seconds"),
              "files": files}
    with open(folder / MARKER, "w") as file:
        json.dump(record, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    for sub in sorted({p.parent for p in _files(folder)} | {folder}, reverse=True):
        fsync_dir(sub)


def _move_into_place(tmp: Path, final: Path) -> None:
    if final.exists():  # the same step saved again (a run resumed from an older checkpoint)
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    fsync_dir(final.parent)


def _delete(folder: Path) -> None:
    """Rename first, so a crash half-way through the delete leaves no complete-looking folder."""
    trash = folder.with_name(f"{folder.name}.trash-{os.getpid()}")
    folder.rename(trash)
    shutil.rmtree(trash)


def _remove_leftovers(root: Path) -> None:
    """Temporary folders of dead processes (or of this one) and ``step_*`` folders that are
    not complete: what a crash left behind."""
    for entry in root.iterdir():
        if entry.is_dir() and _is_leftover(entry):
            shutil.rmtree(entry, ignore_errors=True)
        elif (tmp := LEFTOVER_BEST.fullmatch(entry.name)) and not _alive(int(tmp.group(1))):
            entry.unlink(missing_ok=True)


# --- the best checkpoint ------------------------------------------------------------------

def write_best(run_dir: str | Path, record: BestRecord) -> Path:
    """Point ``<run_dir>/checkpoints/best.json`` at ``record``'s checkpoint, which must be
    complete: written to a temporary file, fsynced, then renamed over the old pointer, so a
    crash leaves the old pointer or the new one."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if checkpoint_step(root / record.folder_name) != record.step:
        raise ValueError(f"best.json may only name a complete checkpoint; "
                         f"{root / record.folder_name} is not one")
    data = {"step": record.step, "checkpoint": record.folder_name,
            "val_success": record.val_success, "val": dict(record.val),
            "saved_at": datetime.now().isoformat(timespec="seconds")}
    path, tmp = root / BEST_FILE, root / f"{BEST_FILE}.tmp-{os.getpid()}"
    with open(tmp, "w") as file:
        json.dump(data, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    fsync_dir(root)
    return path


def read_best(run_dir: str | Path) -> BestRecord | None:
    """The record ``best.json`` holds (``run_dir`` or its ``checkpoints/`` folder); ``None``
    without one; ``ValueError`` naming the file when it cannot be read."""
    root = Path(run_dir)
    if root.name != CHECKPOINTS_DIR and (root / CHECKPOINTS_DIR).is_dir():
        root = root / CHECKPOINTS_DIR
    path = root / BEST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        record = BestRecord(step=data["step"], val_success=float(data["val_success"]),
                            val={k: float(v) for k, v in (data.get("val") or {}).items()})
        valid = isinstance(record.step, int) and data.get("checkpoint") == record.folder_name
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        valid = False
    if not valid:
        raise ValueError(f"{path} is damaged (not the JSON a run writes); allowed: "
                         "checkpoint=last (--checkpoint last), or delete it")
    return record


def clear_best(run_dir: str | Path) -> None:
    """Remove ``best.json`` (a run that starts over has no best yet)."""
    (Path(run_dir) / CHECKPOINTS_DIR / BEST_FILE).unlink(missing_ok=True)


def _is_leftover(folder: Path) -> bool:
    if leftover := LEFTOVER_DIR.fullmatch(folder.name):
        pid = int(leftover.group(2))
        return pid == os.getpid() or not _alive(pid)
    return bool(STEP_DIR.fullmatch(folder.name)) and checkpoint_step(folder) is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- finding -------------------------------------------------------------------------------

def checkpoint_step(folder: str | Path) -> int | None:
    """The step of a complete checkpoint folder; ``None`` if it is not one."""
    folder = Path(folder)
    name = STEP_DIR.fullmatch(folder.name)
    try:
        record = json.loads((folder / MARKER).read_text())
        files = record["files"]
        step = record["step"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(step, int) or (name and int(name.group(1)) != step):
        return None
    if not isinstance(files, dict):
        return None
    for relative, entry in files.items():
        path = folder / relative
        if not path.is_file() or path.stat().st_size != _listed_size(entry):
            return None
    return step


def _step_folders(root: Path) -> list[Path]:
    """The ``step_N`` folders of a ``checkpoints/`` folder, complete or not."""
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.is_dir() and STEP_DIR.fullmatch(p.name)]


def _folder_step(folder: Path) -> int:
    """N of a ``step_N`` folder's name."""
    return int(STEP_DIR.fullmatch(folder.name).group(1))


def _listed_size(entry: Any) -> int | None:
    """A manifest entry's size: ``{"bytes": n, "sha256": ...}``, or ``n`` (older manifests)."""
    return entry.get("bytes") if isinstance(entry, dict) else entry


_WARNED: set[tuple[Path, str]] = set()
_VERIFIED: dict[tuple, str | None] = {}
"""checkpoint_problem's answers, by folder and the size and mtime of each file in it."""


def checkpoint_problem(folder: str | Path) -> str | None:
    """What is wrong with a checkpoint folder, in words (``None``: intact): no or a bad
    manifest, a listed file missing, of another size, or with another SHA-256 checksum."""
    folder = Path(folder)
    if not folder.is_dir():
        return "no such folder"
    try:
        record = json.loads((folder / MARKER).read_text())
    except OSError:
        return f"no {MARKER} manifest (saved half-way, or not a checkpoint)"
    except ValueError:
        return f"its {MARKER} manifest is not valid JSON"
    key = (folder.resolve(), *((p.relative_to(folder).as_posix(), p.stat().st_size,
                                p.stat().st_mtime_ns)
                               for p in sorted(folder.rglob("*")) if p.is_file()))
    if key not in _VERIFIED:
        _VERIFIED[key] = _manifest_problem(folder, record)
    return _VERIFIED[key]


def _manifest_problem(folder: Path, record: Any) -> str | None:
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not isinstance(record.get("step"), int):
        return f"its {MARKER} manifest lacks 'step' or 'files'"
    name = STEP_DIR.fullmatch(folder.name)
    if name and int(name.group(1)) != record["step"]:
        return f"its manifest names step {record['step']}"
    for relative, entry in files.items():
        path = folder / relative
        if not path.is_file():
            return f"{relative} is missing"
        if path.stat().st_size != _listed_size(entry):
            return f"{relative} has {path.stat().st_size} bytes, the manifest {_listed_size(entry)}"
        if isinstance(entry, dict) and entry.get("sha256") not in (None, _sha256(path)):
            return f"{relative} does not match its checksum (changed or corrupted)"
    return None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run, oldest step first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir()
             if STEP_DIR.fullmatch(p.name) and (step := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or ``None``."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def newest_intact_checkpoint(checkpoints: str | Path) -> Path | None:
    """The newest intact ``step_*`` folder of a ``checkpoints/`` folder, damaged newer ones
    named in a warning; ``None`` when it holds none; ``ValueError`` when every one is damaged."""
    root = Path(checkpoints)
    folders = sorted(_step_folders(root), key=_folder_step, reverse=True)
    damaged = []
    for folder in folders:
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder
        if (folder, problem) not in _WARNED:  # once, though a run looks before and in fit()
            _WARNED.add((folder, problem))
            log.warning("checkpoint %s is damaged (%s): skipped, trying an older one", folder,
                        problem)
        damaged.append(f"{folder.name} ({problem})")
    if damaged:
        raise ValueError(f"no intact checkpoint in {root}: {'; '.join(damaged)}")
    return None


def checkpoint_choice(checkpoint: str | None) -> tuple[str, int | None]:
    """``checkpoint=`` as (``best`` | ``last`` | ``step_N``, N or None); ``None`` is ``best``.
    Another text: ``ValueError`` naming the allowed ones."""
    which = "best" if checkpoint is None else str(checkpoint)
    step = STEP_CHOICE.fullmatch(which)
    if which not in ("best", "last") and step is None:
        raise ValueError(f"checkpoint={which!r} is not allowed; allowed: {CHECKPOINT_CHOICES}")
    return which, None if step is None else int(step.group(1))


def run_checkpoint(path: str | Path, checkpoint: str | None = None) -> Path:
    """The checkpoint folder a run folder stands for: ``checkpoint`` = ``best`` (the default:
    the one ``best.json`` names, else the newest intact one), ``last`` (the newest intact one)
    or ``step_N`` / ``N``; verified intact. A run folder's ``agentrl sft`` checkpoints
    (``sft/checkpoints/``) come before its own ``checkpoints/`` (see :func:`model_folder`).
    ``ValueError`` saying what is wrong and what is allowed."""
    path = Path(path).expanduser()
    which, step = checkpoint_choice(checkpoint)
    allowed = "allowed: a run folder with checkpoints/"
    root = _checkpoints_root(path)
    if root is None:
        raise ValueError(f"{path} holds no checkpoints/ to choose checkpoint={which!r} from; "
                         f"{allowed}")
    best = read_best(root) if which == "best" else None
    if step is None and best is None:  # last, or a run that has no best
        found = newest_intact_checkpoint(root)
        if found is None:
            raise ValueError(f"{root} holds no checkpoint; {allowed}")
        return found
    folder = root / (best.folder_name if best else f"step_{step:06d}")
    if (problem := checkpoint_problem(folder)) is not None:
        named = f"the best checkpoint {folder} ({BEST_FILE})" if best else f"checkpoint {folder}"
        kept = ", ".join(p.name for p in list_checkpoints(root.parent)) or "none"
        raise ValueError(f"{named}: {problem}; allowed: checkpoint=last, or step_N of one "
                         f"kept ({kept})")
    return folder


def _checkpoints_root(run: Path) -> Path | None:
    """A run folder's checkpoints: ``sft/checkpoints/`` (an ``agentrl sft`` run) first, else
    ``checkpoints/``; ``None`` when neither holds anything."""
    runs = [run / "sft" / CHECKPOINTS_DIR, run / CHECKPOINTS_DIR]
    return next((r for r in runs if r.is_dir() and any(r.iterdir())), None)


def model_folder(path: str | Path, checkpoint: str | None = None) -> Path:
    """The model folder ``path`` stands for, verified: a model folder (``config.json``, or a
    peft adapter) or ``.gguf`` file itself; a checkpoint folder's ``actor/``; a run folder's
    best checkpoint's ``actor/`` (:func:`run_checkpoint`: ``checkpoint`` = best, the default,
    last or step_N; ``agentrl sft``'s ``sft/checkpoints/`` first, else its own
    ``checkpoints/``: ``agentrl train model=<sft run> run_dir=<the same folder>`` then starts
    from the same model on every relaunch, not from its own PPO checkpoints); a verl run
    folder's actor as a Hugging Face folder (:func:`~agentrl.trainers.verl_checkpoints.
    verl_model`). ``checkpoint`` applies to run folders only. ``ValueError`` saying what
    ``path`` is and what is allowed."""
    path = Path(path).expanduser()
    allowed = ("allowed: a model folder (config.json), a checkpoint folder (checkpoints/step_N) "
               "or a run folder with checkpoints/")
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder; {allowed}")
    is_run = path.is_dir() and not any((path / name).is_file() for name in MODEL_FILES) \
        and not (path / MARKER).exists()
    if checkpoint is not None and not is_run:
        raise ValueError(f"checkpoint={checkpoint!r} chooses among a run folder's checkpoints, "
                         f"and {path} is not a run folder; allowed: a run folder, or no choice")
    if path.is_file():
        if path.suffix == ".gguf":
            return path
        raise ValueError(f"{path} is a file, not a .gguf model; {allowed}")
    if any((path / name).is_file() for name in MODEL_FILES):
        return path
    if is_run and _is_verl_run(path):
        return verl_model(path, checkpoint)
    checkpoint_dir = path
    if (path / MARKER).exists():
        if (problem := checkpoint_problem(path)) is not None:
            raise ValueError(f"checkpoint {path} is damaged ({problem}); allowed: an intact "
                             "checkpoint, or its run folder (its best or newest intact one)")
    else:
        if _checkpoints_root(path) is None:
            raise ValueError(f"{path} holds no model, checkpoint or checkpoints/; {allowed}")
        checkpoint_dir = run_checkpoint(path, checkpoint)
    actor = checkpoint_dir / "actor"
    if not any((actor / name).is_file() for name in MODEL_FILES):
        raise ValueError(f"checkpoint {checkpoint_dir} has no model in actor/; {allowed}")
    return actor


def chosen_model(model: str, checkpoint: str | None) -> str:
    """``--model`` with ``--checkpoint``: the checkpoint folder of the run folder ``model``
    names (:func:`run_checkpoint`); ``model`` itself when no checkpoint is chosen."""
    if checkpoint is None:
        return model
    path = Path(model).expanduser()
    if not path.is_dir() or (path / MARKER).exists() \
            or any((path / name).is_file() for name in MODEL_FILES):
        raise ValueError(f"--checkpoint {checkpoint} chooses among a run folder's checkpoints, "
                         f"and --model {model} is not a run folder; allowed: --model <run "
                         "folder>, or no --checkpoint")
    try:
        if _is_verl_run(path):
            return str(verl_model(path, checkpoint))
        return str(run_checkpoint(path, checkpoint))
    except ValueError as error:
        raise ValueError(f"--checkpoint: {error}") from None


def _is_verl_run(run: Path) -> bool:
    """A run folder verl checkpointed into (``checkpoints/global_step_N``) whose model is verl's
    actor: an ``agentrl sft`` run's ``sft/checkpoints/`` still comes first (see
    :func:`model_folder`)."""
    return is_verl_run(run) and _checkpoints_root(run) == run / CHECKPOINTS_DIR


# --- loading -------------------------------------------------------------------------------

def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu",
                    weights_only: bool = True) -> LoadedCheckpoint:
    """Read a complete checkpoint (tensors onto ``map_location``); an incomplete one is an
    error. ``weights_only=False`` admits arbitrary pickled objects: only for trusted files."""
    path = Path(path)
    step = checkpoint_step(path)
    if step is None:
        raise ValueError(f"{path} is not a complete checkpoint (no valid {MARKER} marker)")
    tensors = {p.stem: _load_tensors(p, map_location, weights_only)
               for p in sorted(path.glob("*.pt"))}
    config_path = path / CONFIG_FILE
    config = (yaml.safe_load(config_path.read_text()) if config_path.exists() else None) or {}
    model_dirs = {p.name: p for p in sorted(path.iterdir()) if p.is_dir()}
    return LoadedCheckpoint(path, step, tensors, config, model_dirs)


def _load_tensors(path: Path, map_location: Any, weights_only: bool) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {first}): the "
                         f"checkpoint {path.parent} is damaged; allowed: resume from an older "
                         "one (resume=<its folder>)") from None


def restore_weights(model: Any, folder: str | Path) -> None:
    """Load the weights saved by ``save_pretrained`` into an already built ``model``, in place
    (an optimizer built on its parameters stays valid). A peft adapter folder loads into a peft
    model's adapter; a full model folder must cover every parameter (tied copies excepted)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / "adapter_config.json").exists():
        if not hasattr(model, "peft_config"):
            raise ValueError(f"{folder} holds a peft adapter but the model has no adapters")
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        if result.unexpected_keys:
            raise ValueError(f"{folder}: adapter weights the model lacks: {result.unexpected_keys[:5]}")
        return
    state: dict[str, torch.Tensor] = {}
    index = folder / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    for shard in shards:
        state.update(load_file(folder / shard))
    result = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded_storage = {own[k].data_ptr() for k in state if k in own}
    missing = [k for k in result.missing_keys if own[k].data_ptr() not in loaded_storage]
    if missing or result.unexpected_keys:
        raise ValueError(f"{folder} does not match the model: missing {missing[:5]}, "
                         f"unexpected {result.unexpected_keys[:5]}")
