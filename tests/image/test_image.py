"""The CPU image as shipped, built and run (`make test-image`, which `.ci/run` calls after the suite).

No container registry is reachable here, so the base image is made from Debian's own packages
(debootstrap; kept in the Docker daemon's store between runs as `inferd-test-base:bookworm`) and handed
to the Dockerfile's `BASE`; the image's `pip install` reaches what the host's pip reaches: the build
runs on the host's network with the host's pip settings passed in (local folders served on loopback,
the host's certificate bundle in the base image). Then the container runs as the README shows, on the
host's network and a port of the test's choosing, and is talked to over HTTP: readiness, the README's
curl lines, the OpenAI client, /metrics (checked against what the KEDA queries ask for), its user and
read-only filesystem, and a `docker stop` that drains and exits 0.

Skipped, with the reason, where no Docker daemon can be had (not root, no dockerd, no debootstrap).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "inferd-test-base:bookworm"
IMAGE = "inferd:latest"  # the tag deploy/k8s's Deployment runs
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

pytestmark = pytest.mark.skipif(os.environ.get("INFERD_IMAGE_TEST") != "1",
                                reason="the image test runs with `make test-image` (INFERD_IMAGE_TEST=1)")


def run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args[:4])}... exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def daemon_answers() -> bool:
    return shutil.which("docker") is not None and run("docker", "info", check=False, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def docker() -> Iterator[None]:
    """A Docker daemon: the one running, or one started here (and stopped after)."""
    if daemon_answers():
        yield
        return
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip("no Docker daemon can be started here (needs root and dockerd: apt-get install docker.io)")
    log = open(tempfile.mktemp(prefix="dockerd-", suffix=".log"), "w")  # noqa: SIM115 (for the daemon's life)
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(120):
            if daemon_answers():
                break
            if daemon.poll() is not None:
                pytest.skip(f"dockerd exited {daemon.returncode} at start (see {log.name})")
            time.sleep(0.5)
        else:
            pytest.skip(f"dockerd did not answer within 60 s (see {log.name})")
        yield
    finally:
        daemon.terminate()  # (the one this fixture started, by its PID)
        daemon.wait(60)
        log.close()


@pytest.fixture(scope="module")
def base_image(docker: None) -> str:
    """Debian bookworm with Python 3.11 and its venv module, and the host's certificate bundle (what
    its pip trusts): made once, then found in the daemon's store."""
    tag = f"{BASE_IMAGE}-{hashlib.sha256(HOST_CA.read_bytes()).hexdigest()[:12]}" if HOST_CA.exists() else BASE_IMAGE
    if run("docker", "image", "inspect", tag, check=False).returncode == 0:
        return tag
    if shutil.which("debootstrap") is None:
        pytest.skip("no base image and no debootstrap to make one (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="inferd-base-") as root:
        made = run("debootstrap", "--variant=minbase", "--include=python3,python3-venv,python-is-python3,ca-certificates",
                   "bookworm", root, "http://deb.debian.org/debian", timeout=900, check=False)
        if made.returncode != 0:
            pytest.skip(f"no base image, and debootstrap could not make one (Debian's mirror?): {made.stderr[-500:]}")
        if HOST_CA.exists():
            shutil.copy(HOST_CA, Path(root) / "etc/ssl/certs/host-ca-bundle.crt")
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, capture_output=True, text=True, timeout=300)
        tar.wait()
        assert imported.returncode == 0, imported.stderr
    return tag


def host_pip_settings() -> dict[str, str]:
    """The host pip's index settings (its config files and PIP_* environment), as `KEY: value` lines."""
    listed = run("python3", "-m", "pip", "config", "list", check=False).stdout
    settings = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        settings[key.rpartition(".")[2].strip("'")] = value.strip().strip("'")
    for key in ("index-url", "extra-index-url", "find-links"):
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            settings[key] = env
    return settings


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - (the base class's name)
        pass  # (hundreds of lines per build otherwise)


class LocalFolders:
    """Local folders the host's pip reads (file:// indexes, find-links), served on loopback so the build
    reaches them too."""

    def __init__(self) -> None:
        self.servers: list[http.server.ThreadingHTTPServer] = []

    def url_for(self, location: str, index: bool) -> str:
        """`index`: a PEP 503 index, whose pages link to files beside it (`../../files/...`): its parent
        folder is served. Otherwise a find-links folder, whose listing links to its own files."""
        path = Path(location.removeprefix("file://"))
        if not path.is_absolute():
            return location  # (an http(s) index: reached as it is)
        root = path.parent if index else path
        handler = functools.partial(QuietHandler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/" + (f"{path.name}/" if index else "")

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def image(base_image: str) -> Iterator[str]:
    """deploy/docker/Dockerfile built as shipped, on the base above, with the host's pip settings."""
    settings, folders = host_pip_settings(), LocalFolders()
    args = ["--build-arg", f"BASE={base_image}", "--build-arg", "TORCH_INDEX="]
    for key, arg in (("index-url", "PIP_INDEX_URL"), ("extra-index-url", "PIP_EXTRA_INDEX_URL"), ("find-links", "PIP_FIND_LINKS")):
        if settings.get(key):
            urls = [folders.url_for(v, index=key != "find-links") for v in settings[key].split()]
            args += ["--build-arg", f"{arg}={' '.join(urls)}"]
    if HOST_CA.exists():
        args += ["--build-arg", "PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt"]
    try:
        started = time.monotonic()
        run("docker", "build", "--network", "host", "-f", str(REPO / "deploy/docker/Dockerfile"), *args, "-t", IMAGE,
            str(REPO), timeout=1800)
        size = int(run("docker", "image", "inspect", IMAGE, "--format", "{{.Size}}").stdout)
        print(f"\nimage {IMAGE}: built in {time.monotonic() - started:.0f} s, {size / 2**30:.2f} GiB")
    finally:
        folders.close()
    yield IMAGE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[tuple[str, str]]:
    """The image run as the README shows: the host's network, loopback, a read-only root (/tmp apart)."""
    name, port = f"inferd-image-test-{os.getpid()}", free_port()
    run("docker", "run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp", image,
        "serve", "--config", "/etc/inferd/inferd.toml", "--host", "127.0.0.1", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 300
        while time.monotonic() < give_up:
            with contextlib.suppress(OSError):
                if get(f"{url}/readyz")[0] == 200:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError("not ready within 300 s:\n" + run("docker", "logs", name, check=False).stderr[-3000:])
        yield name, url
    finally:
        run("docker", "rm", "-f", name, check=False)


def test_ready_and_the_readmes_curl_lines_answer(container: tuple[str, str]) -> None:
    _, url = container
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- curl-lines -->")[1].split("<!-- /curl-lines -->")[0]
    lines = [line for line in block.strip().strip("`").strip().splitlines() if line.startswith("curl")]
    assert len(lines) == 3
    answers = [json.loads(run("bash", "-c", line.replace("localhost:8000", url.removeprefix("http://"))).stdout)
               for line in lines]
    # The same answers as the checkout's code gives for the same inputs.
    from inferd.backends.sim import expected_output
    from inferd.backends.transformer import TextModel

    direct = TextModel("cpu", {"max_tokens": 256, "bucket_edges": [16, 32, 64, 128, 256]})
    expected = [direct([direct.tokenize(text)])[0].tolist() for text in ("hello world", "good night")]
    assert answers[0]["model"] == "batchstring" and answers[0]["output"] == expected_output("hello world")
    assert answers[1]["model"] == "minilm" and max_diff(answers[1]["output"], expected[0]) < 1e-5
    assert [d["index"] for d in answers[2]["data"]] == [0, 1]
    assert max(max_diff(d["embedding"], e) for d, e in zip(answers[2]["data"], expected, strict=True)) < 1e-5


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_a_broken_config_exits_2_with_one_line_in_docker_logs(image: str, tmp_path: Path) -> None:
    config = tmp_path / "inferd.toml"
    config.write_text('server = 5\n\n[[models]]\nname = "m"\nbackend = "inferd.backends.sim:create"\n')
    config.chmod(0o644)
    name = f"inferd-broken-{os.getpid()}"
    try:
        ran = run("docker", "run", "--name", name, "--network", "host", "-v", f"{config}:/etc/inferd/inferd.toml:ro",
                  image, check=False, timeout=120)
        logs = run("docker", "logs", name).stderr
    finally:
        run("docker", "rm", "-f", name, check=False)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert logs.strip().splitlines() == ["inferd: [server] must be a table, not int"], logs


def test_the_openai_client_embeds_through_it(container: tuple[str, str]) -> None:
    openai = pytest.importorskip("openai")
    _, url = container
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model="minilm", input=["hello world", "good night"])
    assert [len(d.embedding) for d in answer.data] == [384, 384] and answer.usage.prompt_tokens > 0
    same = abs(sum(a * b for a, b in zip(answer.data[0].embedding, answer.data[0].embedding, strict=True)) - 1.0)
    assert same < 1e-3  # normalised, as MiniLM's sentence embeddings are


def test_metrics_export_every_name_the_keda_queries_ask_for(container: tuple[str, str]) -> None:
    import yaml

    _, url = container
    answered = urllib.request.Request(f"{url}/v1/inference", data=json.dumps({"input": "scaled"}).encode(),
                                      headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(answered, timeout=30) as resp:  # (a counter has no sample before its first request)
        assert resp.status == 200
    status, body = get(f"{url}/metrics")
    exported = set(re.findall(r"^(inferd_[a-z_]+)", body.decode(), re.M))
    scaled = yaml.safe_load((REPO / "deploy/k8s/keda-scaledobject.yaml").read_text())
    asked = {name for t in scaled["spec"]["triggers"] for name in re.findall(r"inferd_[a-z_]+", t["metadata"]["query"])}
    assert status == 200 and asked and asked <= exported, asked - exported


def test_it_runs_as_user_10001_on_a_read_only_root(container: tuple[str, str]) -> None:
    name, _ = container
    assert run("docker", "exec", name, "id", "-u").stdout.strip() == "10001"
    assert run("docker", "exec", name, "touch", "/home/inferd/x", check=False).returncode != 0  # read-only
    assert run("docker", "exec", name, "touch", "/tmp/x").returncode == 0  # what it declares writable
    inspected = json.loads(run("docker", "inspect", name).stdout)[0]
    assert inspected["HostConfig"]["ReadonlyRootfs"] and inspected["Config"]["User"] == "10001"


def test_docker_stop_drains_admitted_requests_and_exits_0(container: tuple[str, str]) -> None:
    """Last: the container stops. Requests in flight when SIGTERM comes are answered, not cut."""
    name, url = container
    results: list[int] = []

    def one(i: int) -> None:
        request = urllib.request.Request(f"{url}/v1/inference", data=json.dumps({"input": f"drain {i}"}).encode())
        results.append(get_post(request))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # (sent before the stop: batchstring's batches take 100 ms)
    started = time.monotonic()
    run("docker", "stop", "-t", "40", name, timeout=60)
    took = time.monotonic() - started
    for t in threads:
        t.join(10)
    state = json.loads(run("docker", "inspect", name).stdout)[0]["State"]
    assert state["ExitCode"] == 0 and took < 35, (state, took)  # within inferd's 30 s grace, not killed at 40
    assert results.count(200) == 20, results


def get_post(request: urllib.request.Request) -> int:
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_the_cuda_image_is_linted_not_built_here() -> None:
    pytest.skip("deploy/docker/Dockerfile.cuda starts FROM vllm/vllm-openai, which no registry here can provide; "
                "it is linted with hadolint in tests/e2e/test_deploy.py")
