"""What every scenario does: start inferd on a scenario config, run load steps, write the results.

Each scenario is one command (`python benchmarks/scenarios/seed.py --scenario S1`); `make bench` runs them all.
`--quick` shortens every step (for a before/after check, not for the committed figures).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from inferd.bench.loadgen import LoadSpec  # noqa: E402
from inferd.bench.report import markdown_table, write_results  # noqa: E402
from inferd.bench.runner import run_step  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SCENARIOS = Path(__file__).resolve().parent
BODY = b'{"input": "E equals {i}"}'


def own_option(name: str) -> str | None:
    """The value of a scenario's own option (`--rounds 4`), taken out of argv before `parse_args` reads
    the common ones; None when it is not given."""
    if name not in sys.argv:
        return None
    at = sys.argv.index(name)
    value = sys.argv[at + 1]
    del sys.argv[at:at + 2]
    return value


def parse_args(description: str, baseline: bool = False, scenarios: tuple[str, ...] = ()) -> argparse.Namespace:
    """The scenarios' shared flags; `scenarios`: the ones one script runs, chosen with `--scenario`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="short steps: a smoke run, not for committing")
    parser.add_argument("--out-dir", default=str(RESULTS))
    if baseline:
        parser.add_argument("--baseline-tree", help="a checkout of an earlier inferd (git worktree add DIR REF), "
                                                    "measured in the same run for a before/after")
    if scenarios:
        parser.add_argument("--scenario", action="append", choices=scenarios, help="run this one (repeatable; default: all)")
    args = parser.parse_args()
    if scenarios and not args.scenario:
        args.scenario = list(scenarios)
    return args


@contextmanager
def inferd_server(config_toml: str, env: dict[str, str] | None = None, tree: Path | str = REPO,
                  python: str = sys.executable) -> Iterator[str]:
    """`inferd serve` on a free loopback port; yields its base URL; drained with SIGTERM afterwards.

    `tree`: the checkout whose inferd serves (another one for a before/after); `python`: the interpreter
    that runs it. The benchmark-only backends in this folder (e.g. `gpu_standin`) are importable by the
    server."""
    with inferd_process(config_toml, env, tree, python) as (url, _):
        yield url


@contextmanager
def inferd_process(config_toml: str, env: dict[str, str] | None = None, tree: Path | str = REPO,
                   python: str = sys.executable) -> Iterator[tuple[str, int]]:
    """`inferd_server`, yielding its process id beside its URL (for its CPU, read from /proc)."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_toml)
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), str(SCENARIOS), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [python, "-m", "inferd", "serve", "--config", f.name, "--port", "0", "--log-level", "WARNING"],
        cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        url = None
        assert proc.stdout is not None
        for line in proc.stdout:
            match = re.search(r"inferd listening on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        if url is None:
            raise RuntimeError("inferd did not start")
        # Keep draining its output (access log lines), or a full pipe would stall the server; its last
        # lines say why, should it stop before it is ready.
        tail: deque[str] = deque(maxlen=20)
        threading.Thread(target=lambda: tail.extend(proc.stdout or ()), daemon=True).start()
        _wait_ready(url, proc, tail)
        yield url, proc.pid
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(f.name)


def _wait_ready(url: str, proc: subprocess.Popen, tail: deque[str], timeout_s: float = 300) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if proc.poll() is not None:  # (a model that failed to start stops the server: no use waiting)
            time.sleep(0.2)  # (its last lines read)
            raise RuntimeError(f"inferd stopped before it was ready (exit {proc.returncode}):\n{''.join(tail)}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError("inferd never became ready")


def step(url: str, *, rate: float | None = None, clients: int | None = None, duration_s: float, quick: bool,
         engine: str | None = None, warmup_s: float = 2.0, body: bytes = BODY, processes: int = 1,
         headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),), timeout_s: float = 30.0,
         path: str = "/v1/inference", stats_path: str | None = "/v1/stats") -> dict[str, Any]:
    """One load step against inferd's /v1/inference, with the server's own view from /v1/stats."""
    if quick:
        duration_s, warmup_s = min(duration_s, 3.0), min(warmup_s, 1.0)
    spec = LoadSpec(url=f"{url}{path}", body=body, rate=rate, concurrency=clients, duration_s=duration_s,
                    processes=processes, headers=headers, timeout_s=timeout_s)
    engine = engine or ("wrk" if clients is not None else "python")
    result = run_step(spec, engine, f"{url}{stats_path}" if stats_path else None, warmup_s)
    return result


def free_port() -> int:
    """A loopback port free now (for a server the benchmark starts itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mosec_server(quick: bool, batch_ms: float = 10) -> Iterator[tuple[str, int] | None]:
    """Mosec 0.9.8 with benchmarks/mosec/upper.py (`batch_ms` a batch) on a free port, in
    benchmarks/.mosec-venv (made on first use with pip); yields (base URL, pid), or None when Mosec
    cannot be installed here."""
    venv = REPO / "benchmarks" / ".mosec-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode == 0 and subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "mosec==0.9.8"]).returncode == 0
        if not made:
            print("Mosec could not be installed: measured without it", file=sys.stderr)
            yield None
            return
    port = free_port()
    proc = subprocess.Popen([str(python), str(REPO / "benchmarks" / "mosec" / "upper.py"), "--port", str(port),
                             "--address", "127.0.0.1", "--timeout", "30000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "UPPER_BATCH_MS": str(batch_ms)})
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            try:
                request = urllib.request.Request(f"{url}/inference", data=b'{"input": "up"}', method="POST")
                with urllib.request.urlopen(request, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url, proc.pid
    finally:
        stop_group(proc)


@contextmanager
def infinity_server(model_path: str, batch_size: int) -> Iterator[str | None]:
    """Infinity 0.0.78 (`infinity-emb`, torch engine, float32 on the CPU) serving `model_path` as "minilm"
    on a free port, in benchmarks/.infinity-venv (made on first use with pip, about 3 minutes); yields its
    base URL (OpenAI's `/embeddings`), or None when it cannot be installed here."""
    venv = REPO / "benchmarks" / ".infinity-venv"
    binary = venv / "bin" / "infinity_emb"
    if not binary.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode == 0 and subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "infinity-emb[server,torch]==0.0.78",
             "torch==2.13.0"]).returncode == 0
        if not made:
            print("Infinity could not be installed: measured without it", file=sys.stderr)
            yield None
            return
    port = free_port()
    proc = subprocess.Popen([str(binary), "v2", "--model-id", model_path, "--served-model-name", "minilm",
                             "--batch-size", str(batch_size), "--device", "cpu", "--engine", "torch", "--dtype",
                             "float32", "--no-bettertransformer", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
                                 "DO_NOT_TRACK": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 180
        while True:
            try:
                request = urllib.request.Request(f"{url}/embeddings", data=b'{"model": "minilm", "input": ["up"]}',
                                                 headers={"Content-Type": "application/json"}, method="POST")
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if time.monotonic() > give_up or proc.poll() is not None:
                    raise RuntimeError("Infinity did not start") from None
                time.sleep(0.5)
        yield url
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """End a server started in its own process group (`start_new_session`): SIGINT, then SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_answering(url: str, what: str, timeout_s: float = 30) -> None:
    """Until the server at `url` answers `GET /` (with anything, a 404 too); RuntimeError after `timeout_s`."""
    give_up = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/", timeout=1)
            return
        except urllib.error.HTTPError:
            return  # (it answers)
        except OSError:
            if time.monotonic() > give_up:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


def measured_step(url: str, pid: int, *, clients: int, duration_s: float, quick: bool, path: str, body: bytes = BODY,
                  processes: int = 2) -> dict[str, Any]:
    """A wrk step against any server, its CPU per request read from /proc for its whole process tree
    (for servers without inferd's /v1/stats). Warmed up first by a short step of its own."""
    step(url, clients=clients, duration_s=2, warmup_s=0, quick=quick, path=path, stats_path=None, body=body,
         processes=processes)
    before = process_tree_cpu_s(pid)
    result = step(url, clients=clients, duration_s=duration_s, warmup_s=0, quick=quick, path=path, stats_path=None,
                  body=body, processes=processes)
    cpu = process_tree_cpu_s(pid) - before
    result["server"] = {"cpu_us_per_request": round(cpu / max(1, result["completed"]) * 1e6, 1), "cpu_seconds": round(cpu, 3)}
    return result


def ideal_curve(rates: list[float], batch_s: float, max_batch: int, linger_s: float, n: int = 20000) -> list[dict[str, float]]:
    """p50/p99 an ideal zero-overhead server would give (one GPU, Poisson arrivals, linger from the oldest)."""
    import random

    points = []
    for rate in rates:
        rng = random.Random(7)
        arrivals, t = [], 0.0
        for _ in range(n):
            t += rng.expovariate(rate)
            arrivals.append(t)
        latencies, i, gpu_free = [], 0, 0.0
        while i < n:
            ready = max(gpu_free, arrivals[i])
            # wait for the linger from the oldest, or a full batch, whichever first
            full_at = arrivals[i + max_batch - 1] if i + max_batch - 1 < n else float("inf")
            start = max(ready, min(arrivals[i] + linger_s, full_at))
            j = i
            while j < n and j - i < max_batch and arrivals[j] <= start:
                j += 1
            done = start + batch_s
            latencies.extend((done - a) * 1000 for a in arrivals[i:j])
            i, gpu_free = j, done
        latencies.sort()
        points.append({"rate": rate, "p50": latencies[len(latencies) // 2], "p99": latencies[int(len(latencies) * 0.99)]})
    return points


def save(name: str, title: str, steps: list[dict[str, Any]], out_dir: str, **kw: Any) -> None:
    path = Path(out_dir) / f"{name}.json"
    write_results(path, steps, meta={"title": title, "scenario": name, "machine": _machine()}, **kw)
    print(f"\n### {title}\n\n" + markdown_table(steps, kw.get("ceiling_rps"), kw.get("floor_ms")))
    print(f"written: {path}")


def save_table(name: str, title: str, rows: list[dict[str, Any]], lines: list[str], out_dir: str | Path) -> None:
    """A scenario's own table: its rows as JSON and its lines as markdown under its title, in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"title": title, "machine": _machine(), "rows": rows}, indent=1) + "\n")
    (out / f"{name}.md").write_text(f"### {title}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


def median_of(steps: list[dict[str, Any]], key: str) -> float:
    """The median of a figure over repeated steps ("achieved_rps", or "cpu_us_per_request" from the server view)."""
    from statistics import median

    values = [s["achieved_rps"] if key == "achieved_rps" else (s.get("server") or {}).get(key) for s in steps]
    return round(median(v for v in values if v is not None), 1)


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants, from /proc (Linux)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += _stat_cpu_s(Path(f"/proc/{p}/stat"))
            todo += [int(c) for t in Path(f"/proc/{p}/task").iterdir()
                     for c in (t / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process's main thread alone (an inferd server's event loop)."""
    return _stat_cpu_s(Path(f"/proc/{pid}/task/{pid}/stat"))


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a /proc `stat` file after the command name (a process's or one thread's)."""
    return stat.read_text().rsplit(")", 1)[1].split()


def _stat_cpu_s(stat: Path) -> float:
    """User + system CPU seconds from a /proc `stat` file (a process's or one thread's)."""
    fields = _stat_fields(stat)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine() -> str:
    return f"{os.cpu_count()} cores, {sys.platform}, Python {sys.version.split()[0]}"


def sim_config(*, latency_ms: float, workers: int = 1, max_batch: int = 100, max_wait_ms: float = 20,
               max_queue: int = 4000, extra_server: str = "", extra_model: str = "") -> str:
    return f"""
[server]
{extra_server}

[[models]]
name = "batchstring"
backend = "inferd.backends.sim:create"
max_batch_size = {max_batch}
max_wait_ms = {max_wait_ms}
workers = {workers}
max_queue = {max_queue}
{extra_model}
[models.options]
latency_ms = {latency_ms}
max_batch_size = {max_batch}
"""


def _spin() -> None:
    while True:
        pass


def start_hogs(per_core: int) -> list[multiprocessing.Process]:
    """Busy processes beside the server: `per_core` for each of this machine's cores."""
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(per_core * (os.cpu_count() or 1))]
    for hog in hogs:
        hog.start()
    return hogs


def stop_hogs(hogs: list[multiprocessing.Process]) -> None:
    for hog in hogs:
        hog.terminate()
        hog.join(5)
