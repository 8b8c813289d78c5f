"""`agentrl play` driven through standard input, as a person would play."""

import subprocess
import sys

import gymnasium
import pytest

from agentrl.envs import GAMES, env_id


def agentrl(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args], input=stdin, capture_output=True, text=True
    )


@pytest.mark.parametrize("game", GAMES)
def test_person_solves_by_typing_the_oracle_moves(game):
    env = gymnasium.make(env_id(game))
    env.reset(seed=3)
    plan = env.unwrapped.oracle_plan()
    typed = "help\n" + "\n".join(action.upper() for action in plan) + "\n"
    result = agentrl("play", game.lower(), "--seed", "3", stdin=typed)
    assert result.returncode == 0, result.stderr
    assert "valid actions:" in result.stdout
    assert result.stdout.count("action> ") == len(plan) + 1  # one prompt per line typed
    assert "== SOLVED: success=True" in result.stdout


@pytest.mark.parametrize("game", [  # typing the oracle above covers every game quickly
    game if game == "Sokoban" else pytest.param(game, marks=pytest.mark.slow) for game in GAMES])
def test_oracle_mode_solves(game):
    result = agentrl("play", game, "--seed", "5", "--oracle")
    assert result.returncode == 0, result.stderr
    assert "== SOLVED: success=True" in result.stdout


def test_nonsense_input_then_end_of_input_stops_cleanly():
    result = agentrl("play", "sokoban", stdin="jump!!\n\n🤖\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(INVALID)") == 3
    assert "== stopped: success=False" in result.stdout


def test_quit_stops():
    result = agentrl("play", "tetris", stdin="quit\nLeft\n")
    assert "== stopped" in result.stdout and "> Left" not in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [(["chess"], "unknown game 'chess'"), (["sokoban", "--preset", "9x9"], "unknown preset='9x9'")],
)
def test_bad_arguments_fail_with_a_message(args, message):
    result = agentrl("play", *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_constrained_play_refuses_what_is_not_a_valid_action():
    """--constrained: the answer grammar refuses a line that is no valid action (the game is
    not stepped: the refused lines cost no reward); valid ones, in any case, are played."""
    typed = "jump\nmove 9 to 9\nLEFT\n"
    free = agentrl("play", "tetris", "--seed", "3", stdin=typed)
    constrained = agentrl("play", "tetris", "--seed", "3", "--constrained", stdin=typed)
    assert constrained.returncode == 0, constrained.stderr
    assert constrained.stdout.count("refused:") == 2
    assert constrained.stdout.count("reward ") == 1 and "> LEFT" in constrained.stdout
    assert free.stdout.count("reward ") == 3 and "refused:" not in free.stdout


# -- watching a model (--model) ---------------------------------------------------------------------
@pytest.mark.slow  # loads a model in a subprocess; the whole episode below is the quick one
def test_a_model_plays_turn_by_turn_until_q_on_standard_input():
    result = agentrl("play", "sokoban", "--model", "tiny", "--seed", "3", "--max-new-tokens", "8",
                     "--pause", stdin="\n\nq\nnever read\n")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "tiny plays as simpleSokobanAgent" in out
    assert [f"-- turn {n} --" in out for n in (1, 2, 3, 4)] == [True, True, True, False]
    assert out.count("reply: ") == 3 and out.count("#") > 20  # replies and boards
    assert "== stopped: success=False" in out and "turns=3" in out


def test_a_model_plays_a_whole_episode_without_pauses():
    result = agentrl("play", "bandit", "--model", "tiny", "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "-- turn 1 --" in result.stdout
    assert "== over: success=False" in result.stdout or "== SOLVED" in result.stdout


def test_an_agent_preset_of_another_game_is_named():
    result = agentrl("play", "sokoban", "--model", "tiny", "--agent-preset", "banditAgent")
    assert result.returncode == 2
    assert "not a Sokoban preset; allowed: simpleSokobanAgent" in result.stderr


def test_the_watched_agent_shows_each_actions_validity_and_the_board():
    import dataclasses

    from agentrl.agents import Agent, load_agent_presets
    from agentrl.cli.watch import WatchedAgent

    lines, waits = [], []
    one_move = dataclasses.replace(load_agent_presets()["simpleSokobanAgent"],
                                   max_actions_per_turn=1)
    agent = Agent(one_move)
    watched = WatchedAgent(agent, lines.append, lambda: waits.append(1))
    watched.reset(seed=3)
    result = watched.step("<think>try</think><answer>Jump</answer>")
    assert not result.done and waits == [1]  # the episode goes on: it waits before the next turn
    assert "Jump (INVALID)" in "\n".join(lines)
    watched.step(agent.oracle_response())
    shown = "\n".join(lines)
    assert "(valid)" in shown and "-- turn 2 --" in shown and agent.observation in shown
    agent.close()


@pytest.mark.slow  # a model in a subprocess; tests/rollout/test_constrained.py is quick
def test_a_constrained_model_takes_only_valid_actions():
    """--constrained with --model: the tiny random model decodes under the answer grammar, so
    every reply is well formed and every action valid (without it, its replies are noise)."""
    result = agentrl("play", "sokoban", "--model", "tiny", "--seed", "3", "--constrained")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "-- turn 1 --" in out and "(valid)" in out
    assert "INVALID" not in out and "format error" not in out.lower()


def test_a_runs_model_plays_with_the_runs_preset_and_decoding(tiny, tmp_path):
    """``--model <run>``: the run's validation preset of the game as the run had it (here 2
    turns), constrained as the run decoded, its reply limit, and a line saying so."""
    import io

    from agentrl.cli import build_parser, watch
    from agentrl.config import compose_config
    from agentrl.trainers.checkpoint import save_checkpoint

    config = compose_config(["model=tiny", "rollout.max_new_tokens=24",
                             "val.presets=[banditAgent,tightBlocksworldTurnsAgent]",
                             "agents.tightBlocksworldTurnsAgent.max_turns=2"])
    save_checkpoint(tmp_path / "run", 1, models={"actor": tiny}, config=config.to_dict())
    args = build_parser().parse_args(["play", "blocksworld", "--model", str(tmp_path / "run"),
                                      "--seed", "3", "--device", "cpu"])
    out = io.StringIO()
    assert watch.run(args, io.StringIO(), out) == 0
    shown = out.getvalue()
    assert "plays as tightBlocksworldTurnsAgent" in shown
    assert ("decoding: greedy, constrained to valid actions, replies up to 24 tokens, context up "
            "to 2048 tokens, history tightBlocksworldTurnsAgent none (each turn its own chat) (the "
            "run's config") in shown
    assert "-- turn 2 --" in shown and "-- turn 3 --" not in shown  # the run's max_turns
    assert "INVALID" not in shown and "format error" not in shown


def test_play_takes_the_checkpoint_asked_for(tmp_path, capsys):
    """A run folder plays its best by default (the resolution eval shares, tested there);
    --checkpoint last|step_N chooses another, and one the run lacks is named."""
    from agentrl.cli import main
    from agentrl.models import load_model
    from agentrl.trainers.checkpoint import BestRecord, save_checkpoint, write_best

    run = tmp_path / "run"
    model, tokenizer = load_model("tiny")
    save_checkpoint(run, 1, models={"actor": (model, tokenizer)})
    write_best(run, BestRecord(step=1, val_success=0.5))
    last = save_checkpoint(run, 2, models={"actor": (model, tokenizer)})
    assert main(["play", "bandit", "--model", str(run), "--checkpoint", "last",
                 "--max-new-tokens", "4", "--device", "cpu"]) == 0
    assert f"{last} plays as banditAgent" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["play", "bandit", "--model", str(run), "--checkpoint", "step_5"])
    assert exit_info.value.code == 2
    assert "step_000005: no such folder" in capsys.readouterr().err
