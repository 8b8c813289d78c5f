"""An on-disk pool of TextWorld games: generated once per (parameters, seed), then reused.

Compiling a game with Inform7 takes about a second; playing one starts in milliseconds. So games
are made ahead of time (``GamePool.ensure``, in parallel processes) or on first use
(``GamePool.get``), and kept under::

    <root>/<key>/params.json          generation parameters, textworld version, pool format
    <root>/<key>/<seed>/game.z8       the compiled story
    <root>/<key>/<seed>/game.json     TextWorld's game data (walkthrough, quests, objective)
    <root>/<key>/<seed>/manifest.json sha256 of the two files above (and the generator seed
                                      used), written last

``<key>`` is a short stable hash of ``params.json``; ``<root>`` is ``$AGENTRL_CACHE/textworld``,
else ``~/.cache/agentrl/textworld``. A game enters the pool only if its walkthrough wins it
(``generate_game``), so the env's oracle can always finish a pooled game.

Crash and race safety: a game is written into a private temporary directory beside its final
place and renamed into place in one atomic step, so a reader sees a whole game or none. Every
load checks the manifest; a missing, truncated or altered file means "regenerate". When two
processes make the same seed at once, the first rename wins and the other discards its copy
(both copies are the same game: generation is deterministic in the seed). A process killed
mid-generation leaves a ``.tmp-*`` directory behind: harmless, and safe to delete when no
generation is running.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from importlib.metadata import version
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

POOL_FORMAT = 1
"""Bump when the layout or the generation recipe changes: old pools are then left alone."""
GAME_FILES = ("game.z8", "game.json")
MANIFEST = "manifest.json"
PARAMS_FILE = "params.json"
MAX_SEED = 2**32 - 1
"""TextWorld seeds a numpy RandomState with the seed, which takes 0 ... 2**32 - 1."""
INSTALL_ATTEMPTS = 5
MAX_GENERATION_ATTEMPTS = 10
"""Generator seeds tried per game seed (about 1 in 50 games needs a second one)."""


def default_root() -> Path:
    cache = os.environ.get("AGENTRL_CACHE")
    base = Path(cache) if cache else Path.home() / ".cache" / "agentrl"
    return base / "textworld"


@dataclass(frozen=True)
class GameParams:
    """What textworld's generator is asked for; with a seed it fixes the game."""

    nb_rooms: int
    nb_objects: int
    quest_length: int

    def identity(self) -> dict:
        """The parameters plus what else decides the game bytes (textworld's version)."""
        return {**asdict(self), "textworld": version("textworld"), "pool_format": POOL_FORMAT}

    def key(self) -> str:
        text = json.dumps(self.identity(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def generate_game(params: GameParams, seed: int, directory: Path) -> int:
    """Make and compile game ``seed`` into ``directory`` (game.z8, game.json).

    textworld's generator sometimes gives two objects names the parser cannot tell apart
    ("safe" and "Canadian limited edition safe"): the walkthrough then stops at "Which do you
    mean...?". Such a game (or a generator error) is discarded and the next generator seed of
    ``generator_seeds(seed)`` is tried, so every pooled game is won by its walkthrough and the
    choice stays a function of the seed. Returns the generator seed used.
    """
    errors = []
    for generator_seed in generator_seeds(seed):
        try:
            make_and_compile(params, generator_seed, directory)
        except Exception as error:  # noqa: BLE001 - any generator failure means "next seed"
            errors.append(f"{generator_seed}: {type(error).__name__}: {error}")
            continue
        if walkthrough_wins(directory / GAME_FILES[0], max_steps=4 * params.quest_length + 8):
            return generator_seed
        errors.append(f"{generator_seed}: its walkthrough does not win")
    raise RuntimeError(f"TextWorld pool: no playable game for seed {seed} with {params}: "
                       + "; ".join(errors))


def generator_seeds(seed: int) -> list[int]:
    """The seed itself, then MAX_GENERATION_ATTEMPTS - 1 seeds derived from it."""
    derived = np.random.SeedSequence(seed).generate_state(MAX_GENERATION_ATTEMPTS - 1)
    return [seed, *(int(value) for value in derived)]


def make_and_compile(params: GameParams, generator_seed: int, directory: Path) -> None:
    """textworld's ``make_game`` + ``compile_game``.

    An int seed makes textworld derive its map, objects, quest and grammar generators from
    ``RandomState(seed)`` alone (no global RNG), so the game depends on the seed and parameters
    only: the test suite checks this across processes.
    """
    import textworld
    from textworld.generator import compile_game, make_game

    options = textworld.GameOptions()
    options.nb_rooms = params.nb_rooms
    options.nb_objects = params.nb_objects
    options.quest_length = params.quest_length
    options.seeds = int(generator_seed)  # textworld tests `type(seed) is int`: no numpy ints
    options.path = str(directory / GAME_FILES[0])
    options.force_recompile = True
    compile_game(make_game(options), options)
    (directory / "game.ni").unlink(missing_ok=True)  # Inform7 source, not needed to play


def walkthrough_wins(game_file: Path, max_steps: int) -> bool:
    """Play TextWorld's walkthrough (``policy_commands``, re-read after every step) to the end."""
    import textworld

    infos = textworld.EnvInfos(policy_commands=True, admissible_commands=True, won=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jericho: "not fully supported" (textworld copes)
        engine = textworld.start(str(game_file), request_infos=infos)
    try:
        state = engine.reset()
        for _ in range(max_steps):
            plan = state["policy_commands"]
            if state["won"] or not plan or plan[0] not in state["admissible_commands"]:
                break
            state, _, _ = engine.step(plan[0])
        return bool(state["won"])
    finally:
        engine.close()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, seed: int, key: str, generator_seed: int) -> None:
    files = {name: sha256_file(directory / name) for name in GAME_FILES}
    manifest = {"seed": seed, "generator_seed": generator_seed, "key": key, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def manifest_ok(directory: Path, seed: int, key: str) -> bool:
    """Whether ``directory`` holds the complete, unaltered game ``seed`` of pool ``key``."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest["seed"] != seed or manifest["key"] != key or set(files) != set(GAME_FILES):
            return False
        return all(sha256_file(directory / name) == files[name] for name in GAME_FILES)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_seed(seed) -> int:
    """``seed`` as a plain int in [0, MAX_SEED], or a ValueError."""
    try:
        number = None if isinstance(seed, bool) else operator.index(seed)
    except TypeError:
        number = None
    if number is None or not 0 <= number <= MAX_SEED:
        raise ValueError(f"TextWorld game seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    return number


class GamePool:
    """The games of one parameter set, one directory per game seed."""

    def __init__(self, params: GameParams, root: str | os.PathLike | None = None):
        self.params = params
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.key = params.key()
        self.directory = self.root / self.key

    def game_dir(self, seed: int) -> Path:
        return self.directory / str(check_seed(seed))

    def game_file(self, seed: int) -> Path:
        """Where game ``seed`` lives (it may not be there yet: see ``get``)."""
        return self.game_dir(seed) / GAME_FILES[0]

    def is_valid(self, seed: int) -> bool:
        return manifest_ok(self.game_dir(seed), check_seed(seed), self.key)

    def get(self, seed: int) -> Path:
        """Game ``seed``'s .z8 file, generated here first if missing or corrupt."""
        if not self.is_valid(seed):
            self.generate(seed)
        return self.game_file(seed)

    def ensure(self, seeds: Iterable[int], workers: int | None = None,
               progress: bool = True) -> list[Path]:
        """Generate every missing or corrupt game of ``seeds`` (see ``ensure_games``).

        Returns the .z8 paths in the order of ``seeds``.
        """
        seeds = [check_seed(seed) for seed in seeds]
        ensure_games([(self, seed) for seed in seeds], workers, progress)
        return [self.game_file(seed) for seed in seeds]

    def generate(self, seed: int) -> None:
        """(Re)make game ``seed`` and install it atomically, unless a valid copy appears first."""
        seed = check_seed(seed)
        self._write_params()
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{seed}-", dir=self.directory))
        staging.chmod(0o755)  # mkdtemp makes it private; the pool may be shared
        try:
            generator_seed = generate_game(self.params, seed, staging)
            write_manifest(staging, seed, self.key, generator_seed)
            self._install(staging, seed)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already if it was installed

    def _install(self, staging: Path, seed: int) -> None:
        final = self.game_dir(seed)
        for _ in range(INSTALL_ATTEMPTS):
            try:
                os.rename(staging, final)  # atomic; fails if ``final`` exists and is not empty
                return
            except OSError:
                if manifest_ok(final, seed, self.key):
                    return  # another process installed it first: ours is discarded
                self._discard(final)  # corrupt or half-written: move aside, then retry
        raise RuntimeError(f"TextWorld pool: could not install game {seed} at {final}")

    def _discard(self, path: Path) -> None:
        trash = self.directory / f".trash-{path.name}-{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        if trash.is_dir():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)

    def _write_params(self) -> None:
        """params.json says what a pool directory holds (for people; loading ignores it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / PARAMS_FILE
        if target.exists():
            return
        staging = self.directory / f".tmp-params-{uuid.uuid4().hex}"
        staging.write_text(json.dumps(self.params.identity(), indent=1, sort_keys=True))
        os.replace(staging, target)


def ensure_games(games: Iterable[tuple[GamePool, int]], workers: int | None = None,
                 progress: bool = True) -> None:
    """Generate every missing or corrupt (pool, seed) game in ``workers`` processes.

    One process pool for all the games, whatever their parameters: a worker pays textworld's
    start-up (~1 s: import, knowledge base) once. ``workers`` defaults to the CPU count; 1
    generates in this process. A tqdm bar shows progress.
    """
    jobs = {(pool.directory, check_seed(seed)): (pool, check_seed(seed)) for pool, seed in games}
    missing = [(pool, seed) for pool, seed in jobs.values() if not pool.is_valid(seed)]
    if not missing:
        return
    workers = max(1, min(workers or os.cpu_count() or 1, len(missing)))
    with tqdm(total=len(missing), desc="TextWorld games", unit="game",
              disable=not progress) as bar:
        if workers == 1:
            for pool, seed in missing:
                pool.generate(seed)
                bar.update()
            return
        # spawn, not fork: a forked child of a threaded parent (a trainer) can deadlock.
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as executor:
            futures = [executor.submit(_get, pool.params, pool.root, seed)
                       for pool, seed in missing]
            for future in as_completed(futures):
                future.result()
                bar.update()


def _get(params: GameParams, root: Path, seed: int) -> str:
    """Worker entry point (module level so it pickles)."""
    return str(GamePool(params, root).get(seed))
