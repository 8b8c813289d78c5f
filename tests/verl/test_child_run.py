"""agentrl.verl.child_run without verl: a child that outlives its time is ended with what it
started (as Ray's daemons would be), a failed child's output tail is in the error, and verl's
console lines are read as the real trainer prints them."""

from __future__ import annotations

import sys

import pytest

from agentrl.verl import child_run

GRANDCHILD = ("import subprocess, sys, time; print('up', flush=True); "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "time.sleep(60)")


def test_a_child_past_its_time_is_ended_with_everything_it_started(tmp_path):
    process = child_run.start([sys.executable, "-c", GRANDCHILD], tmp_path / "run.log")
    with pytest.raises(child_run.ChildRunError, match="ran past 2 s") as error:
        child_run.finish(process, tmp_path / "run.log", timeout_s=2)
    assert "up" in str(error.value)
    assert child_run.session_pids(process.pid) == []   # the grandchild too


def test_a_failed_child_raises_with_its_output(tmp_path):
    command = [sys.executable, "-c", "print('verl said no'); raise SystemExit(3)"]
    process = child_run.start(command, tmp_path / "run.log")
    with pytest.raises(child_run.ChildRunError, match="exited 3") as error:
        child_run.finish(process, tmp_path / "run.log", timeout_s=60)
    assert "verl said no" in str(error.value)
    ok = child_run.start([sys.executable, "-c", "print('fine')"], tmp_path / "ok.log")
    assert child_run.finish(ok, tmp_path / "ok.log", timeout_s=60) == "fine\n"


def test_console_steps_reads_verls_lines_and_keeps_a_redone_steps_last():
    output = "\n".join([
        "(TaskRunner pid=7) step:1 - actor/entropy:np.float64(0.5) - timing_s/gen:12.25 - "
        "critic/vf_loss:-1.5e-03",
        "(TaskRunner pid=7) Training Progress: 50%",
        "(TaskRunner pid=7) step:2 - timing_s/gen:np.float64(3.0) - timing_s/step:4",
        "(TaskRunner pid=9) step:2 - timing_s/gen:2.0 - timing_s/step:3.5"])
    assert child_run.console_steps(output) == {
        1: {"actor/entropy": 0.5, "timing_s/gen": 12.25, "critic/vf_loss": -1.5e-3},
        2: {"timing_s/gen": 2.0, "timing_s/step": 3.5}}
    assert child_run.console_steps(output, keys=("timing_s/gen",)) == {
        1: {"timing_s/gen": 12.25}, 2: {"timing_s/gen": 2.0}}


def test_the_cpu_verl_interpreter_is_the_named_one_else_the_venvs_never_this_one(
        tmp_path, monkeypatch):
    """One lookup for ``agentrl train hardware=cpu-verl`` (which re-runs itself there) and the
    runs the tests and benchmarks start: the named interpreter, else the venv's."""
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    named = tmp_path / "named-python"
    named.write_text("")
    monkeypatch.setenv("AGENTRL_VERL_CPU_VENV", str(tmp_path / "venv"))
    monkeypatch.setenv("AGENTRL_VERL_CPU_PYTHON", str(named))
    assert child_run.verl_cpu_venv_python() == named
    monkeypatch.setenv("AGENTRL_VERL_CPU_PYTHON", str(tmp_path / "missing"))
    assert child_run.verl_cpu_venv_python() == venv_python
    assert child_run.verl_cpu_python() == str(tmp_path / "missing")  # as named, for the runs
    monkeypatch.delenv("AGENTRL_VERL_CPU_PYTHON")
    assert child_run.verl_cpu_python() == str(venv_python)
    monkeypatch.setenv("AGENTRL_VERL_CPU_PYTHON", sys.executable)  # this one: nothing to re-run
    assert child_run.verl_cpu_venv_python() == venv_python
    monkeypatch.setenv("AGENTRL_VERL_CPU_VENV", str(tmp_path / "no-venv"))
    assert child_run.verl_cpu_venv_python() is None
    monkeypatch.delenv("AGENTRL_VERL_CPU_PYTHON")
    has_vllm = child_run.importlib.util.find_spec("vllm") is not None
    assert child_run.verl_cpu_python() == (sys.executable if has_vllm else None)


def test_a_child_never_shares_this_processs_wandb_service(monkeypatch):
    """Any ``wandb.init`` here leaves ``WANDB_SERVICE`` set: a child connected to that service
    and killed would leave its run open there, and its resume refused as "in use"."""
    monkeypatch.setenv("WANDB_SERVICE", "3-1-unix-/tmp/wandb-1/socket")
    monkeypatch.setenv("HOME_FOR_TEST", "kept")
    env = child_run.child_env({"EXTRA": "1"})
    assert "WANDB_SERVICE" not in env
    assert (env["HOME_FOR_TEST"], env["EXTRA"], env["WANDB_MODE"]) == ("kept", "1", "disabled")
