"""scripts/bench/verl_startup.py without verl (a stand-in child prints the markers): the lines
are dated as they come, each phase by its first marker, verl's step metrics parsed; and every
variant's overrides pass verl's own config checks (a dry run), so a typo fails here, not after
minutes of start-up."""

from __future__ import annotations

import json
import sys

import pytest
from omegaconf import OmegaConf

from agentrl import cli
from agentrl.verl.child_run import verl_cpu_python


def test_the_fake_run_dates_each_phase_and_reads_verls_step_metrics(load_script, tmp_path,
                                                                    capsys):
    bench = load_script("scripts/bench/verl_startup.py")
    out = tmp_path / "startup.json"
    assert bench.main(["--fake", "--variants", "current", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["variants"]["current"]
    phases = result["phases"]
    assert list(phases) == ["agentrl", "verl", "ray", "task runner", "workers", "models",
                            "vllm server", "vllm engine", "training", "agent loop", "step 1",
                            "step 2", "end"]
    assert list(phases.values()) == sorted(phases.values()) and phases["end"] > 0.3
    assert result["steps"] == {"1": {"timing_s/gen": 0.5, "timing_s/step": 0.75},
                               "2": {"timing_s/gen": 0.25, "timing_s/step": 0.5}}
    printed = capsys.readouterr().out
    assert "current began / lasted" in printed and "step 2 timing_s/gen" in printed


def test_a_phase_is_dated_by_its_first_marker_and_unseen_phases_are_left_out(load_script):
    bench = load_script("scripts/bench/verl_startup.py")
    step = "(TaskRunner pid=1) step:1 - actor/entropy:np.float64(0.5) - timing_s/step:2.5"
    lines = [(1.0, "starting verl: x"), (2.0, "(WorkerDict pid=7) a"),
             (3.0, "(WorkerDict pid=7) b"), (9.5, step)]
    assert bench.phase_starts(lines) == {"agentrl": 0.0, "verl": 1.0, "workers": 2.0,
                                         "task runner": 9.5, "step 1": 9.5}
    assert bench.step_metrics(lines) == {1: {"actor/entropy": 0.5, "timing_s/step": 2.5}}


@pytest.mark.skipif(verl_cpu_python() is None, reason="a cpu-verl dry run needs vLLM's CPU "
                    "build: bash env_setup.sh --verl-cpu")
@pytest.mark.slow  # verl's config composed and checked once per variant (~5 s each)
def test_every_variant_passes_verls_config_checks(load_script, tmp_path, capsys):
    bench = load_script("scripts/bench/verl_startup.py")
    for name, overrides in bench.VARIANTS.items():
        command = bench.train_command(sys.executable, tmp_path / name, 2, overrides)
        assert command[2:4] == ["agentrl.cli", "train"]
        assert cli.main(["train", "--dry-run", *command[4:]]) == 0, name
        capsys.readouterr()
        verl_config = composed(command[4:])
        # the keys vLLM and Ray read, spelled out here: a misspelt override key would land
        # beside them in these free-form sections and leave them as they were
        for key, value in EXPECTED[name].items():
            assert str(OmegaConf.select(verl_config, key)) == value, (name, key)


EXECUTOR = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"
MULTIPROCESSING = "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_ENABLE_V1_MULTIPROCESSING"
EXPECTED = {"current": {EXECUTOR: "uni", MULTIPROCESSING: "0"},
            "worker_process": {EXECUTOR: "mp", MULTIPROCESSING: "1"}}


def composed(train_arguments: list[str]):
    """verl's config as a launch with these ``agentrl train`` arguments composes it."""
    from agentrl.config import compose_config
    from agentrl.verl.launch import compose_verl_config
    from agentrl.verl.overrides import task_paths, verl_overrides

    config = compose_config(train_arguments)
    return compose_verl_config(verl_overrides(config, task_paths(config)))


def test_a_run_that_hangs_silently_is_ended_at_its_timeout(load_script):
    """The timeout holds while the child prints nothing (a hung verl run)."""
    import sys
    import time

    bench = load_script("scripts/bench/verl_startup.py")
    started = time.monotonic()
    lines, code = bench.stamped_run([sys.executable, "-c",
                                     "import time; print('up', flush=True); time.sleep(30)"],
                                    timeout_s=2)
    assert time.monotonic() - started < 15 and code == -9
    assert [text for _, text in lines] == ["up", "# end of run"]
