"""TextWorld: the on-disk game pool, cross-process determinism, golden play, the oracle.

Generating a game takes ~1-2 s, so the tests share one pool directory (kept in pytest's cache
between runs) whose games are made in 2 processes, once. The oracle run over 20 seeds per preset
(60 games to generate on a first run) is marked slow.
"""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers the games)
from agentrl.envs import textworld_pool
from agentrl.envs.textworld import (
    INVALID_FEEDBACK, PRESETS, TextWorldEnv, clean_feedback, game_seed,
)
from agentrl.envs.textworld_pool import GAME_FILES, MANIFEST, GameParams, GamePool, ensure_games

GOLDEN_SEED = 1826701614
"""An env seed of "easy" (textworld 1.7): put the glove from the rack into the chest."""
GOLDEN_WALKTHROUGH = ["take glove from rack", "insert glove into chest"]
GOLDEN_START_ACTIONS = [
    "close chest", "examine chest", "examine glove", "examine rack", "examine scarf",
    "go north", "inventory", "look", "take glove from rack", "take scarf",
]
FAST_SEEDS = (GOLDEN_SEED, 1)
ORACLE_SEEDS = range(20)
"""The oracle's seeds: the longest walkthrough of each preset is its quest length on almost every
seed (47-49 of the first 50), so 20 show it at 40% of the generation."""
NONSENSE = ["", "   ", "x" * 100_000, "🤖 ünïcødé ⛄", "\x00\n\t", None, 42, "<answer>"]
ENGINE_WORDS = ["quit", "restart", "undo", "save", "restore", "xyzzy", "insert glove into chest",
                "go south", "take glove", "take the glove from the rack", "tw-trace-actions"]
"""Real interpreter verbs, and near-misses of admissible commands: none may reach the engine."""


@pytest.fixture(scope="session")
def pool_dir(request, tmp_path_factory):
    """The session's game pool, kept across runs in pytest's cache directory.

    The pool checks every game's manifest on load and keys games by textworld's version, so a
    kept pool is as good as a new one; tests about generation itself use fresh directories.
    """
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    if cache is None:
        return tmp_path_factory.mktemp("textworld-pool")
    return cache.mkdir("agentrl-textworld-pool")


def pregenerate(pool_dir, seeds) -> None:
    """The games of ``seeds`` for every preset, made in 2 processes (one process pool)."""
    games = [game for preset in PRESETS
             for game in make(pool_dir, preset=preset).pool_games(seeds)]
    ensure_games(games, workers=2, progress=False)


@pytest.fixture(scope="session")
def fast_games(pool_dir):
    pregenerate(pool_dir, FAST_SEEDS)
    return pool_dir


@pytest.fixture(scope="session")
def oracle_games(pool_dir):
    pregenerate(pool_dir, ORACLE_SEEDS)
    return pool_dir


def make(pool_dir, **kwargs) -> TextWorldEnv:
    return TextWorldEnv(pool_dir=pool_dir, **kwargs)


def golden(pool_dir, **kwargs) -> TextWorldEnv:
    env = make(pool_dir, preset="easy", **kwargs)
    env.reset(seed=GOLDEN_SEED)
    return env


def spy_engine(env: TextWorldEnv) -> list[str]:
    """Record every command the interpreter receives from now on."""
    sent, step = [], env._engine.step

    def recording_step(command):
        sent.append(command)
        return step(command)

    env._engine.step = recording_step
    return sent


def forbid_generation(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a game was generated")

    monkeypatch.setattr(textworld_pool, "generate_game", fail)


def play_oracle(env: TextWorldEnv, seed: int) -> list[str]:
    """Play reset(seed)'s walkthrough; assert it wins with rewards summing to max_score."""
    env.reset(seed=seed)
    plan = env.oracle_plan()
    assert plan, f"seed {seed}: no walkthrough"
    assert len(plan) <= env.params.quest_length
    total = 0.0
    for index, action in enumerate(plan):
        assert action in env.valid_actions(), (seed, action)
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        assert info["action_is_valid"] and info["action_is_effective"]
        assert terminated == (index == len(plan) - 1), (seed, index)
        assert not truncated
    assert info["success"] and terminated
    assert total == env.score[0] == env.score[1] >= 1
    assert env.oracle_plan() == [] and env.valid_actions() == []
    return plan


# -- settings and text ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, key", [
    ({"preset": "impossible"}, "preset"),
    ({"nb_rooms": 0}, "nb_rooms"),
    ({"nb_rooms": "3"}, "nb_rooms"),
    ({"nb_objects": -1}, "nb_objects"),
    ({"quest_length": 99}, "quest_length"),
    ({"quest_length": True}, "quest_length"),
    ({"show_admissible": "yes"}, "show_admissible"),
    ({"max_steps": 0}, "max_steps"),
])
def test_bad_settings_raise_naming_the_key(tmp_path, kwargs, key):
    with pytest.raises(ValueError, match=key):
        make(tmp_path, **kwargs)


def test_overrides_change_the_pool_key(tmp_path):
    easy = make(tmp_path, preset="easy")
    bigger = make(tmp_path, preset="easy", nb_rooms=3)
    assert easy.params == GameParams(**PRESETS["easy"])
    assert bigger.params.nb_rooms == 3 and bigger.pool.key != easy.pool.key
    assert easy.pool.key == make(tmp_path, preset="easy").pool.key  # stable


def test_pool_root_from_env_var_or_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    assert make(None).pool.root == tmp_path / "textworld"
    monkeypatch.delenv("AGENTRL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert make(None).pool.root == tmp_path / "home" / ".cache" / "agentrl" / "textworld"


def test_clean_feedback_drops_banner_prompt_and_objective():
    raw = ("\n\n   ________  __\n  |        \\|  \\\n   \\$$$$$$$$| $$ >$$\n\n"
           "Welcome! Find the key.\n\n-= Kitchen =-\nA kitchen.\n\n\n\n"
           ">                  -= Kitchen =-0/1")
    assert clean_feedback(raw, "Find the key.") == "Welcome!\n\n-= Kitchen =-\nA kitchen."
    end = ("\nYou eat it.\n\n       *** The End ***\n\nWould you like to RESTART, RESTORE a saved"
           " game, QUIT or UNDO the last command?\n>        -= Kitchen =-0/3")
    assert clean_feedback(end) == "You eat it.\n\n*** The End ***"


# -- golden play -------------------------------------------------------------------------------
def test_golden_game_start(fast_games):
    env = golden(fast_games)
    obs = env.render()
    assert env.game_seed == game_seed(GOLDEN_SEED)
    assert env.oracle_plan() == GOLDEN_WALKTHROUGH
    assert env.valid_actions() == GOLDEN_START_ACTIONS
    assert env.score == (0, 1)
    assert "retrieve the glove from the rack" in env.objective
    assert obs.startswith("Goal: " + env.objective)
    assert obs.count(env.objective) == 1  # shown once, not again inside the opening text
    assert "$$" not in obs and "-= Pantry =-" in obs and "On the rack you can see a glove" in obs
    assert obs.endswith("Admissible commands: " + ", ".join(GOLDEN_START_ACTIONS))
    assert "Admissible" not in golden(fast_games, show_admissible=False).render()


def test_golden_walkthrough_wins(fast_games):
    env = gymnasium.make("agentrl/TextWorld-v0", preset="easy", pool_dir=fast_games)
    env.reset(seed=GOLDEN_SEED)
    obs, reward, terminated, truncated, info = env.step("take glove from rack")
    assert (reward, terminated, info["action_is_valid"], info["action_is_effective"]) == (
        0.0, False, True, True)
    assert "You take the glove from the rack." in obs
    assert env.unwrapped.oracle_plan() == ["insert glove into chest"]
    obs, reward, terminated, truncated, info = env.step("insert glove into chest")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert "*** The End ***" in obs and "RESTART" not in obs and "Admissible" not in obs
    assert env.unwrapped.oracle_plan() == [] and env.unwrapped.valid_actions() == []
    assert env.step("look")[1:4] == (0.0, True, False)  # past the end: a no-op


def test_look_and_examine_are_valid_but_not_effective(fast_games):
    env = golden(fast_games)
    for action in ["look", "examine rack", "inventory"]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_is_valid"] and not info["action_is_effective"], action
        assert reward == 0.0 and not terminated
    assert "You are carrying nothing." in obs
    for action in ["take scarf", "close chest", "go north"]:
        info = env.step(action)[-1]
        assert info["action_is_valid"] and info["action_is_effective"], action


def test_oracle_plans_from_the_current_state(fast_games):
    env = golden(fast_games)
    env.step("take scarf")
    obs = env.step("go north")[0]
    assert "-= Shower =-" in obs
    assert env.oracle_plan() == ["go south"] + GOLDEN_WALKTHROUGH
    for action in env.oracle_plan():
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and info["success"] and reward == 1.0


def test_non_admissible_text_is_a_noop_and_never_reaches_the_engine(fast_games):
    env = golden(fast_games, max_steps=1000)
    sent = spy_engine(env)
    start_obs, start_actions = env.render(), env.valid_actions()
    for action in NONSENSE + ENGINE_WORDS:
        obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated) == (0.0, False, False), action
        assert not info["action_is_valid"] and not info["action_is_effective"], action
        assert INVALID_FEEDBACK in obs
        assert env.valid_actions() == start_actions
    assert sent == []
    assert env.oracle_plan() == GOLDEN_WALKTHROUGH and env.score == (0, 1)
    room = "-= Pantry =-\nWell I'll be, you are in the place we're calling the pantry."
    assert obs.split("\n\n")[:3] == [f"Goal: {env.objective}", INVALID_FEEDBACK, room]
    assert obs.endswith(start_obs.split("\n\n")[-1])  # same admissible commands
    # Case and spacing do not matter; the engine gets the canonical command.
    info = env.step("  TAKE   Glove from RACK ")[-1]
    assert info["action_is_valid"] and info["action_is_effective"]
    assert sent == ["take glove from rack"]


def test_truncation_is_not_termination(fast_games):
    env = golden(fast_games, max_steps=2)
    assert env.step("look")[2:4] == (False, False)
    assert env.step("dance")[2:4] == (False, True)


def test_losing_terminates_without_success(tmp_path, monkeypatch):
    """The generator makes no losable quests, so build one: eating the carrot loses."""
    import textworld
    from textworld.generator.game import Event, Quest

    maker = textworld.GameMaker()
    kitchen = maker.new_room("kitchen")
    maker.set_player(kitchen)
    chest = maker.new(type="c", name="chest")
    kitchen.add(chest)
    maker.add_fact("open", chest)
    carrot = maker.new(type="f", name="carrot")
    maker.inventory.add(carrot)
    maker.quests = [Quest(win_events=[Event(conditions={maker.new_fact("in", carrot, chest)})],
                          fail_events=[Event(conditions={maker.new_fact("eaten", carrot)})])]
    maker.build()
    path = maker.compile(str(tmp_path / "lose" / "game.z8"))
    env = make(tmp_path)
    monkeypatch.setattr(env.pool, "get", lambda seed: path)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("eat carrot")
    assert terminated and not truncated and not info["success"] and reward == 0.0
    assert "*** You lost! ***" in obs
    assert env.oracle_plan() is None and env.valid_actions() == []


# -- engine lifecycle ----------------------------------------------------------------------------
def test_reset_reuses_the_engine_for_the_same_game_and_closes_it_for_another(fast_games):
    env = golden(fast_games)
    first_obs, engine = env.render(), env._engine
    env.step("take scarf")
    env.reset(seed=GOLDEN_SEED)
    assert env._engine is engine and env.render() == first_obs
    closed = []
    engine_close = engine.close
    engine.close = lambda: (closed.append(True), engine_close())
    env.reset(seed=1)
    assert closed == [True] and env._engine is not engine
    env.close()
    assert env._engine is None


# -- the pool ------------------------------------------------------------------------------------
def test_reset_reuses_a_pooled_game(fast_games, monkeypatch):
    env = golden(fast_games)
    folder = env.game_path.parent
    stamps = {name: (folder / name).stat().st_mtime_ns for name in (*GAME_FILES, MANIFEST)}
    forbid_generation(monkeypatch)
    again = golden(fast_games)
    assert again.game_path == env.game_path
    assert {name: (folder / name).stat().st_mtime_ns for name in stamps} == stamps
    assert again.oracle_plan() == GOLDEN_WALKTHROUGH


def pooled_copy(source: GamePool, seed: int, root) -> GamePool:
    """A new pool root holding a copy of ``source``'s game ``seed`` (no generation)."""
    pool = GamePool(source.params, root)
    shutil.copytree(source.game_dir(seed), pool.game_dir(seed))
    return pool


@pytest.mark.parametrize("damage", ["truncate z8", "garble json", "drop manifest",
                                    "garble manifest", "drop z8", "extra seed in manifest"])
def test_damaged_games_are_detected(fast_games, tmp_path, damage):
    source = golden(fast_games).pool
    seed = game_seed(GOLDEN_SEED)
    pool = pooled_copy(source, seed, tmp_path)
    assert pool.is_valid(seed)
    folder = pool.game_dir(seed)
    z8 = folder / "game.z8"
    if damage == "truncate z8":
        z8.write_bytes(z8.read_bytes()[:1000])
    elif damage == "garble json":
        (folder / "game.json").write_text("{}")
    elif damage == "drop manifest":
        (folder / MANIFEST).unlink()
    elif damage == "garble manifest":
        (folder / MANIFEST).write_text("{not json")
    elif damage == "drop z8":
        z8.unlink()
    else:
        manifest = json.loads((folder / MANIFEST).read_text())
        (folder / MANIFEST).write_text(json.dumps({**manifest, "seed": seed + 1}))
    assert not pool.is_valid(seed)


def test_a_truncated_game_is_regenerated_on_reset(fast_games, tmp_path):
    source = golden(fast_games).pool
    seed = game_seed(GOLDEN_SEED)
    pool = pooled_copy(source, seed, tmp_path)
    z8 = pool.game_file(seed)
    good = z8.read_bytes()
    z8.write_bytes(good[: len(good) // 2])  # a half-written file
    env = golden(tmp_path)
    assert pool.is_valid(seed) and z8.stat().st_size == len(good)
    assert env.oracle_plan() == GOLDEN_WALKTHROUGH
    assert not [p for p in pool.directory.iterdir() if p.name.startswith(".")]  # no leftovers


def test_install_keeps_a_valid_game_and_replaces_a_corrupt_one(fast_games, tmp_path):
    source = golden(fast_games).pool
    seed = game_seed(GOLDEN_SEED)
    pool = pooled_copy(source, seed, tmp_path / "pool")
    staging = tmp_path / "staging"
    shutil.copytree(source.game_dir(seed), staging)
    manifest = pool.game_dir(seed) / MANIFEST
    stamp = manifest.stat().st_mtime_ns
    pool._install(staging, seed)  # the loser of a race: the installed copy stays
    assert manifest.stat().st_mtime_ns == stamp and staging.exists()
    (pool.game_dir(seed) / "game.json").write_text("")
    pool._install(staging, seed)  # a corrupt copy is moved aside and replaced
    assert pool.is_valid(seed) and not staging.exists()
    assert sorted(p.name for p in pool.directory.iterdir()) == [str(seed)]


@pytest.mark.slow  # compiles games in two worker processes
def test_parallel_ensure_with_two_workers(tmp_path, monkeypatch):
    pool = GamePool(GameParams(**PRESETS["easy"]), tmp_path)
    seeds = [11, 7, 11]
    paths = pool.ensure(seeds, workers=2, progress=False)
    assert paths == [pool.game_file(seed) for seed in seeds]
    assert all(pool.is_valid(seed) for seed in seeds)
    assert json.loads((pool.directory / "params.json").read_text())["nb_rooms"] == 2
    assert sorted(p.name for p in pool.directory.iterdir()) == ["11", "7", "params.json"]
    forbid_generation(monkeypatch)
    assert pool.ensure(seeds, workers=2, progress=False) == paths


@pytest.mark.slow  # two spawned processes compile a game
def test_two_processes_generating_the_same_game(tmp_path):
    """Both compile seed 5 at once; one rename wins, the other copy is discarded."""
    pool = GamePool(GameParams(**PRESETS["easy"]), tmp_path)
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as executor:
        for future in [executor.submit(pool.generate, 5) for _ in range(2)]:
            future.result()
    assert pool.is_valid(5)
    assert sorted(p.name for p in pool.directory.iterdir()) == ["5", "params.json"]


AMBIGUOUS_GAME = ("medium", 1079380448)
"""Generator seed whose game names a "safe" and a "Canadian limited edition safe": its
walkthrough's "take ... from safe" gets "Which do you mean...?"."""


def test_a_game_whose_walkthrough_fails_is_rejected(tmp_path):
    preset, seed = AMBIGUOUS_GAME
    params = GameParams(**PRESETS[preset])
    textworld_pool.make_and_compile(params, seed, tmp_path)
    assert not textworld_pool.walkthrough_wins(tmp_path / "game.z8", max_steps=20)


def test_generation_moves_to_the_next_derived_seed(tmp_path, monkeypatch):
    seeds = textworld_pool.generator_seeds(5)
    assert seeds[0] == 5 and len(set(seeds)) == len(seeds) == 10
    assert seeds == textworld_pool.generator_seeds(5)  # a function of the seed

    def fake_make(params, generator_seed, directory):
        for name in GAME_FILES:
            (directory / name).write_text(str(generator_seed))

    monkeypatch.setattr(textworld_pool, "make_and_compile", fake_make)
    monkeypatch.setattr(textworld_pool, "walkthrough_wins",
                        lambda path, max_steps: path.read_text() == str(seeds[2]))
    pool = GamePool(GameParams(**PRESETS["easy"]), tmp_path)
    pool.generate(5)
    manifest = json.loads((pool.game_dir(5) / MANIFEST).read_text())
    assert manifest["generator_seed"] == seeds[2] and pool.is_valid(5)
    monkeypatch.setattr(textworld_pool, "walkthrough_wins", lambda path, max_steps: False)
    with pytest.raises(RuntimeError, match="no playable game for seed 6"):
        pool.generate(6)


def test_pregenerated_games_are_what_reset_plays(fast_games, monkeypatch):
    forbid_generation(monkeypatch)  # the fast_games fixture made them through pool_games
    for preset in PRESETS:
        env = make(fast_games, preset=preset)
        assert env.pool_games(FAST_SEEDS) == [(env.pool, game_seed(s)) for s in FAST_SEEDS]
        for seed in FAST_SEEDS:
            env.reset(seed=seed)
            assert env.game_seed == game_seed(seed)
            assert env.game_path == env.pool.game_file(game_seed(seed))


# -- determinism -------------------------------------------------------------------------------
EPISODE_SCRIPT = """
import json, sys
from agentrl.envs.textworld import TextWorldEnv
preset, pool_dir, seed, *warmup = sys.argv[1:]
env = TextWorldEnv(preset=preset, pool_dir=pool_dir)
for other in warmup:  # generate other games first: the game must not depend on order
    env.reset(seed=int(other))
obs, _ = env.reset(seed=int(seed))
record = {"obs": obs, "objective": env.objective, "plan": env.oracle_plan(),
          "actions": env.valid_actions(),
          "game_json": env.game_path.with_suffix(".json").read_text()}
for action in record["plan"]:
    record.setdefault("steps", []).append(list(env.step(action)))
print(json.dumps(record))
"""


def episode_in_subprocess(preset, pool_dir, seed, warmup=(), hash_seed="0"):
    args = [sys.executable, "-c", EPISODE_SCRIPT, preset, str(pool_dir), str(seed),
            *map(str, warmup)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONHASHSEED": hash_seed})


@pytest.mark.slow  # two fresh processes compile hard games (test_contract checks one seed in a new process)
def test_generation_is_deterministic_across_processes(fast_games, tmp_path):
    """Two fresh processes (different hash seeds, one warmed up on another game) each
    generate hard seed 1 from scratch: same game file, walkthrough, text and episode."""
    runs = [episode_in_subprocess("hard", tmp_path / "a", 1, hash_seed="1"),
            episode_in_subprocess("hard", tmp_path / "b", 1, warmup=[0], hash_seed="2")]
    records = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        records.append(json.loads(out.strip().splitlines()[-1]))
    assert records[0] == records[1]
    here = make(fast_games, preset="hard")
    obs, _ = here.reset(seed=1)
    assert (obs, here.oracle_plan()) == (records[0]["obs"], records[0]["plan"])
    assert here.game_path.with_suffix(".json").read_text() == records[0]["game_json"]
    assert records[0]["steps"][-1][2] is True  # the walkthrough won there too
    other = make(fast_games, preset="hard")
    other.reset(seed=0)
    assert other.objective != here.objective


# -- the oracle ----------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", list(PRESETS))
def test_oracle_solves_fast_seeds(fast_games, preset):
    env = make(fast_games, preset=preset)
    for seed in FAST_SEEDS:
        play_oracle(env, seed)


@pytest.mark.slow  # ~1 min on 2 cores when the 60 games are not in the kept pool yet
@pytest.mark.parametrize("preset", list(PRESETS))
def test_oracle_solves_20_seeds(oracle_games, preset):
    env = make(oracle_games, preset=preset)
    lengths = [len(play_oracle(env, seed)) for seed in ORACLE_SEEDS]
    assert max(lengths) == PRESETS[preset]["quest_length"]
    assert len({game_seed(seed) for seed in ORACLE_SEEDS}) == len(ORACLE_SEEDS)
