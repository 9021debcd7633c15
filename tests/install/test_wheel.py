"""inferd installed from its wheel into a fresh virtual environment, away from the checkout (`make
test-install`, which `.ci/run` calls after the suite): one `pip install` (with the torch extra), then
`inferd serve` with no config serves the embedded default, and with `make run`'s config file MiniLM too;
and without any extra, the embedded default.
The packages come from wherever the host's pip gets them (its own settings)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.environ.get("INFERD_INSTALL_TEST") != "1",
                                reason="the install test runs with `make test-install` (INFERD_INSTALL_TEST=1)")


def run(*args: str, timeout: float = 900, **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{' '.join(args[:4])}...: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """inferd's wheel, built here."""
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(REPO))
    (built,) = dist.glob("inferd-*.whl")
    return built


def install(wheel: Path, root: Path, extras: str) -> Path:
    """A fresh venv (no site packages of the checkout's) holding inferd from `wheel` (with `extras`,
    e.g. "[torch]", or none); its bin folder."""
    started = time.monotonic()
    run(sys.executable, "-m", "venv", str(root / "venv"))
    run(str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}{extras}", cwd=root)
    print(f"\n{wheel.name}{extras}: installed in {time.monotonic() - started:.0f} s")
    return root / "venv" / "bin"


def test_the_wheel_ships_its_types(wheel: Path) -> None:
    """`py.typed` in the wheel: users' type checkers read inferd's own types (the backend and engine contracts)."""
    with zipfile.ZipFile(wheel) as built:
        assert "inferd/py.typed" in built.namelist()


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(wheel, tmp_path_factory.mktemp("install"), "[torch]")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


@contextmanager
def serving(bin_dir: Path, *args: str, cwd: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([str(bin_dir / "inferd"), "serve", *args, "--port", str(port)], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 300
        while time.monotonic() < give_up and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        else:
            raise AssertionError(f"not ready (exit {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}")
        yield url
    finally:
        proc.terminate()  # (SIGTERM: it drains and exits 0)
        assert proc.wait(60) == 0


def test_the_wheel_serves_the_embedded_default_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    where = run(str(installed / "python"), "-c", "import inferd; print(inferd.__file__)", cwd=tmp_path).stdout
    assert str(REPO) not in where  # the installed package, not the checkout's
    with serving(installed, cwd=tmp_path) as url:
        answer = post(f"{url}/v1/inference", {"input": "hello world"})
        assert answer["model"] == "batchstring" and answer["output"]


def test_the_wheel_without_extras_serves_the_embedded_default(wheel: Path, tmp_path: Path) -> None:
    """`pip install inferd` alone: everything the server imports comes with it (numpy once did not)."""
    bare = install(wheel, tmp_path / "bare", "")
    assert run(str(bare / "python"), "-c", "import importlib.util as u; print(u.find_spec('torch'))", cwd=tmp_path).stdout.strip() == "None"
    with serving(bare, cwd=tmp_path) as url:
        answer = post(f"{url}/v1/inference", {"input": "hello world"})
        assert answer["model"] == "batchstring" and answer["output"]


def test_the_wheel_with_the_torch_extra_serves_make_runs_config(installed: Path, tmp_path: Path) -> None:
    config = tmp_path / "inferd.toml"
    config.write_text((REPO / "config" / "default.toml").read_text())
    with serving(installed, "--config", str(config), cwd=tmp_path) as url:
        vector = post(f"{url}/v1/inference", {"input": "hello world", "model": "minilm"})["output"]
        embedded = post(f"{url}/v1/embeddings", {"input": ["hello world"], "model": "minilm"})["data"][0]["embedding"]
        assert len(vector) == 384 and max(abs(a - b) for a, b in zip(vector, embedded, strict=True)) < 1e-6
