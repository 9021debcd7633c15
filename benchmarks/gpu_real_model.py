"""A real model on a real GPU: served by inferd vs the same model called directly, on one device, in one run.

Three encoders:
  (a) all-MiniLM-L6-v2 in fp16, ~16-token inputs;
  (b) a BERT-large-shaped encoder (24 layers, hidden 1024, random weights made on the spot) in bf16,
      ~190-token inputs;
  (c) a ViT-small-shaped image encoder (12 layers, hidden 384, 224 px, random weights made on the spot)
      in fp16, one 224 x 224 PNG per request as JSON base64 (issue 30: the image model on a GPU).
For each: the model called directly (the backend's own batch function in a loop, eager and with its
CUDA graphs) at the batch sizes the server ends up using; then inferd serving it (batched; batched with
`launch_ahead = false`, one batch in flight, for the gain of launching one while another computes; and
with max_batch_size = 1) under closed-loop load from `inferd bench` (Python engine, several processes),
with the server's CPU per request, its mean batch, its warm-up (graph capture) time and the GPU's
utilisation sampled by nvidia-smi beside it; for MiniLM also /v1/embeddings with 32 inputs per call.
Goals (issue 13): (b) served >= 0.90 x direct, GPU busy >= 85%; (a) >= 12,000 single-input req/s and,
through /v1/embeddings x 32, >= 0.8 x direct.

Usage on a GPU host (no registry needed: torch, transformers, aiohttp, uvloop, prometheus-client there;
bring orjson's wheel, Pillow's and pybase64's for the image model, and the fp16 MiniLM, see `gpu_carry.py`):
    python benchmarks/gpu_real_model.py --minilm-dir DIR --out-dir $OUT
On an H200 the MiniLM half took about 5 minutes with 15 s steps (the BERT-large half more: its CUDA graphs);
with a 15-minute device budget run one model per call (`--models`), or both with the default 10 s steps.
On the CPU, as a check of the script itself: python benchmarks/gpu_real_model.py --quick --device cpu
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHORT = "request {i}: how do servers batch"  # ~16 tokens with [CLS]/[SEP]
LONG = " ".join(["a longer passage about dynamic batching servers that gather requests"] * 15) + " {i}"  # ~190 tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--minilm-dir", help="MiniLM weights (fp16 safetensors + tokenizer); default: the packaged fp32 ones")
    parser.add_argument("--out-dir", default=os.environ.get("OUT") or str(REPO / "benchmarks" / "results"))
    parser.add_argument("--quick", action="store_true", help="small batches, short steps: a check of the script")
    parser.add_argument("--models", default="minilm_fp16,bert_large_bf16",
                        help="which to run, in order (default both; the results are written after each)")
    parser.add_argument("--duration", type=int, default=10, help="seconds of load per served step (default 10)")
    parser.add_argument("--replay-every-shape", metavar="MODEL_JSON", help=argparse.SUPPRESS)  # (the check's child)
    args = parser.parse_args()
    if args.replay_every_shape:
        return replay_every_shape(json.loads(args.replay_every_shape), args.device)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="inferd-gpu-"))
    quick, on_gpu = args.quick, args.device.startswith("cuda")
    minilm = prepare_minilm(args.minilm_dir, work, half=on_gpu)
    models = {
        "minilm_fp16": lambda: {"path": minilm, "dtype": "float16" if on_gpu else "float32",
                                "text": SHORT, "max_tokens": 32, "edges": [16, 32], "max_batch": 16 if quick else 256,
                                "clients": 64 if quick else 1024},
        "bert_large_bf16": lambda: {"path": make_bert_large(work, minilm, tiny=quick),
                                    "dtype": "bfloat16" if on_gpu else "float32", "text": LONG, "max_tokens": 256,
                                    "edges": [64, 128, 256], "max_batch": 8 if quick else 128,
                                    # (a third direct curve: graphs at lengths between the edges; the second
                                    # H200 run had the 256-token graph slower than eager for ~190 tokens)
                                    "fine_lengths": [64, 128, 192, 256],
                                    "clients": 32 if quick else 512},
        "vit_small_fp16": lambda: {"kind": "image", "path": make_vit_small(work, tiny=quick),
                                   "dtype": "float16" if on_gpu else "float32", "size": 32 if quick else 224,
                                   "max_batch": 8 if quick else 64, "clients": 32 if quick else 256},
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"device": device_name(args.device), "quick": quick, "models": {}}
    for name in args.models.split(","):
        print(f"\n== {name}", flush=True)
        m = models[name]()
        check = check_graphs(name, m, args.device, out)
        try:
            served = serve_and_load(name, m, args.device, 3 if quick else args.duration, out, graphs=check["ok"])
            sizes = sorted({1, max(1, round(served["batched"]["mean_batch"] or 1)), m["max_batch"]})
            direct = direct_curve(m, args.device, sizes, quick, graphs=check["ok"])
        except Exception as exc:  # noqa: BLE001 - the next model may still run: say what stopped this one
            progress(f"{name} failed: {type(exc).__name__}: {exc}")
            results["models"][name] = {"graphs_check": check, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            (out / "gpu_real_model.json").write_text(json.dumps(results, indent=2) + "\n")
            pack_logs(out, work)
            continue
        mean = max(1, round(served["batched"]["mean_batch"] or 1))
        row = {"graphs_check": check, "direct": direct, "served": served}
        row["served_over_direct_eager"] = ratio(served["batched"]["rps"], direct["eager"].get(str(mean), {}).get("items_per_s"))
        row["served_over_direct_graphed"] = ratio(served["batched"]["rps"], direct["graphed"].get(str(mean), {}).get("items_per_s"))
        row["launch_ahead_gain"] = ratio(served["batched"]["rps"], served["one_step"]["rps"])
        if "embeddings_x32" in served:
            row["embeddings_x32_over_direct_eager"] = ratio(served["embeddings_x32"]["items_per_s"],
                                                            direct["eager"].get(str(mean), {}).get("items_per_s"))
        results["models"][name] = row
        print(json.dumps(row, indent=1), flush=True)
        # Written after each model: a device's time runs out mid-run, and what was measured must survive it.
        (out / "gpu_real_model.json").write_text(json.dumps(results, indent=2) + "\n")
        (out / "gpu_real_model.md").write_text(table(results))
        pack_logs(out, work)
    print(table(results))
    shutil.rmtree(work, ignore_errors=True)
    return 0


STARTED = time.monotonic()


def pack_logs(out: Path, work: Path) -> None:
    """The finished model's logs moved into `logs.tar.gz` (with the earlier models'): the device tool
    returns 8 files at most, and the second H200 run lost three server logs past that. The model being
    measured keeps its logs in `out` as plain files, so a run cut off mid-model still shows them."""
    kept = work / "logs"
    kept.mkdir(exist_ok=True)
    for log in out.glob("*.log"):
        shutil.move(str(log), kept / log.name)
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for log in sorted(kept.iterdir()):
            tar.add(log, arcname=log.name)


def progress(what: str) -> None:
    """One line per step with the seconds since the start: a device's budget runs out mid-run, and the
    printed steps say where the time went."""
    print(f"[{time.monotonic() - STARTED:7.1f} s] {what}", flush=True)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"


def prepare_minilm(given: str | None, work: Path, half: bool) -> str:
    """The MiniLM folder to serve: the one given, else the packaged fp32 one (converted to fp16 on a GPU)."""
    if given:
        return given
    from inferd.backends.transformer import default_model_path

    source = default_model_path()
    if not half:
        return source
    import torch
    from transformers import AutoModel, AutoTokenizer

    target = work / "minilm_fp16"
    AutoModel.from_pretrained(source, dtype=torch.float16).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return str(target)


def make_bert_large(work: Path, minilm: str, tiny: bool) -> str:
    """A BERT-large-shaped encoder with random weights (tiny: 2 small layers, for a CPU check), with
    MiniLM's tokenizer (the same vocabulary), taken from the MiniLM folder in use (a GPU host has no
    packaged MiniLM)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel


    torch.manual_seed(0)
    shape = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256) if tiny else \
        dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    target = work / "bert_large"
    BertModel(BertConfig(**shape), add_pooling_layer=False).to(torch.bfloat16).save_pretrained(target)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(target)
    return str(target)


def make_vit_small(work: Path, tiny: bool) -> str:
    """A ViT-small-shaped image encoder with random weights (tiny: 2 small layers at 32 px, for a CPU
    check). No preprocessor file: the backend then normalises with ViT's own 0.5 mean and std."""
    import torch
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    shape = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128) if tiny else \
        dict(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
             intermediate_size=1536)
    target = work / "vit_small"
    ViTModel(ViTConfig(**shape)).to(torch.float16).save_pretrained(target)
    return str(target)


def png_of(size: int) -> bytes:
    """A size x size PNG of noise (what the image model is sent)."""
    import io

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def options(m: dict[str, Any], graphs: bool = True, lengths: list[int] | None = None) -> dict[str, Any]:
    """The backend's options; `m["graph_batch_sizes"]` (the graphs check's narrowing) overrides the sizes;
    `lengths`: the text backend's `graph_lengths`."""
    image = m.get("kind") == "image"
    sizes = m.get("graph_batch_sizes") or graph_sizes(m["max_batch"], image=image)
    if image:
        return {"model_path": m["path"], "dtype": m["dtype"], "image_sizes": [m["size"]], "cuda_graphs": graphs,
                "graph_batch_sizes": sizes}
    return {"model_path": m["path"], "dtype": m["dtype"], "max_tokens": m["max_tokens"], "bucket_edges": m["edges"],
            "cuda_graphs": graphs, "graph_batch_sizes": sizes, **({"graph_lengths": lengths} if lengths else {})}


def direct_inputs(m: dict[str, Any], model: Any, n: int) -> list[Any]:
    """`n` inputs as the backend's batch function takes them: token ids, or a decoded image's pixels."""
    if m.get("kind") == "image":
        prepared = model.prepare_batch([png_of(m["size"])])[0]
        return [prepared.input] * n
    return [model.tokenize(m["text"].format(i=i)) for i in range(n)]


def check_graphs(name: str, m: dict[str, Any], device: str, out: Path) -> dict[str, Any]:
    """Capture the model's CUDA graphs and replay every shape once, smallest first, each against the same
    padded call run eagerly, in a child process: the first GPU run of the image model (H200, 2026-11-27)
    died of a segfault in a replay, and a crash here costs this check, not the run. `ok` false: the
    server and the direct curve then run eagerly; the log (`graphs_check_<name>.log`) names the shape."""
    if not device.startswith("cuda"):
        return {"ok": True, "skipped": "no CUDA: nothing is captured"}
    check = replay_in_child(m, device, out / f"graphs_check_{name}.log")
    if not check["ok"]:  # one graph alone, smallest and largest: does the failure need several graphs?
        sizes = options(m)["graph_batch_sizes"]
        check["alone"] = {str(b): replay_in_child({**m, "graph_batch_sizes": [b]}, device,
                                                  out / f"graphs_check_{name}_only_{b}.log")
                          for b in sorted({sizes[0], sizes[-1]})}
    progress(f"{name}: graphs check {json.dumps(check)}")
    return check


CHECK_LIMIT_S = 150  # a check's child that takes longer is stopped (a hung capture must not spend the device's budget)


def replay_in_child(m: dict[str, Any], device: str, log: Path) -> dict[str, Any]:
    """`replay_every_shape` in a child process, its output in `log`: how it ended, and its last step."""
    progress(f"capturing and replaying every graph shape of {log.stem} (a child process)")
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # (a crash prints every thread's stack)
    try:
        with log.open("w") as sink:
            code = subprocess.run([sys.executable, __file__, "--device", device, "--replay-every-shape", json.dumps(m)],
                                  cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=CHECK_LIMIT_S).returncode
    except subprocess.TimeoutExpired:
        code = None
    said = log.read_text().splitlines()
    last = next((line for line in reversed(said) if line.startswith(("replay", "captured", "graphs off", "every", "inferd.backends"))),
                said[-1] if said else "")  # (no step reached: the error's last line)
    return {"ok": code == 0, "exit": code, "last_step": last}


def replay_every_shape(m: dict[str, Any], device: str) -> int:
    """The check's child: capture, then each captured shape replayed once and compared with the same
    padded call run eagerly; one line per shape before it runs (a crash leaves the shape as the last line)."""
    import logging

    import numpy as np

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
    logging.getLogger("inferd.backends").setLevel(logging.DEBUG)  # (each shape as it is captured)
    model = model_class(m)(device, options(m, True))
    print(f"captured: {json.dumps(model.warmup())}", flush=True)
    shaped = model.shaped
    if not shaped.use_graphs:
        print(f"graphs off: {shaped.error}", flush=True)
        return 1
    rng = np.random.default_rng(0)
    differences = []
    for b, s in shaped.captured_shapes():
        print(f"replaying ({b}, {s})", flush=True)
        if m.get("kind") == "image":
            inputs = [rng.integers(0, 256, (s, s, 3), dtype=np.uint8) for _ in range(b)]  # (decoded RGB)
        else:
            inputs = [rng.integers(1000, 2000, size=s, dtype=np.int64) for _ in range(b)]
        graphed = shaped.run(inputs)
        shaped.use_graphs = False  # (the same padded, fixed-shape call, eagerly)
        eager = shaped.run(inputs)
        shaped.use_graphs = True
        differences.append(float(np.max(np.abs(graphed - eager))))  # type: ignore[operator]
        print(f"replayed ({b}, {s}): max difference from eager {differences[-1]:.3g}", flush=True)
    far = [d for d in differences if not d <= 1e-2]  # (NaN included)
    print(f"every shape replayed; {len(far)} of {len(differences)} differ from eager by more than 0.01", flush=True)
    return 1 if far else 0


def model_class(m: dict[str, Any]) -> Any:
    if m.get("kind") == "image":
        from inferd.backends.vision import ImageModel

        return ImageModel
    from inferd.backends.transformer import TextModel

    return TextModel


def direct_curve(m: dict[str, Any], device: str, sizes: list[int], quick: bool, graphs: bool = True) -> dict[str, Any]:
    """Items/s of the backend's own batch function called in a loop (no server), eager and (when the
    graphs check passed) graphed, and graphed at `m["fine_lengths"]` where the model has them."""
    Model = model_class(m)  # noqa: N806 - a class
    curves: dict[str, Any] = {"graphed": {}}
    runs: list[tuple[str, bool, list[int] | None]] = [("eager", False, None)]
    if graphs:
        runs.append(("graphed", True, None))
        if m.get("fine_lengths"):
            runs.append((f"graphed at lengths {m['fine_lengths']}", True, m["fine_lengths"]))
    for label, graphed, lengths in runs:
        progress(f"direct {label}: loading, warm-up")
        model = Model(device, options(m, graphed, lengths))
        model.warmup()
        progress(f"direct {label}: measuring {sizes}")
        rows = direct_inputs(m, model, max(sizes))
        curve = {}
        for size in sizes:
            batch = rows[:size]
            for _ in range(3):
                model(batch)
            calls, started = 0, time.perf_counter()
            while time.perf_counter() - started < (0.5 if quick else 3.0):
                model(batch)
                calls += 1
            seconds = (time.perf_counter() - started) / calls
            curve[str(size)] = {"ms_per_call": round(seconds * 1000, 3), "items_per_s": round(size / seconds, 1)}
        curves[label] = curve
        del model
    return curves


def config_toml(m: dict[str, Any], device: str, max_batch: int, graphs: bool = True, launch_ahead: bool = True) -> str:
    if m.get("kind") == "image":  # (every request sends the same image: collapsing off, each one computed)
        backend, model_lines, options = "vision", "collapse = false\n", (
            f"image_sizes = [{m['size']}]\ngraph_batch_sizes = {graph_sizes(max_batch, image=True)}")
    else:
        edges = ", ".join(str(e) for e in m["edges"])
        backend, model_lines, options = "transformer", "", (
            f"max_tokens = {m['max_tokens']}\nbucket_edges = [{edges}]\ngraph_batch_sizes = {graph_sizes(max_batch)}")
    options += f"\ncuda_graphs = {'true' if graphs else 'false'}"  # (the image backend's default is off)
    options += f"\nlaunch_ahead = {'true' if launch_ahead else 'false'}"  # (a GPU's default: on)
    return f"""
[server]
access_log = "off"

[[models]]
name = "model"
backend = "inferd.backends.{backend}:create"
devices = ["{device}"]
max_batch_size = {max_batch}
max_wait_ms = 2
max_queue = 100000
timeout_ms = 60000
{model_lines}[models.options]
model_path = "{m['path']}"
dtype = "{m['dtype']}"
{options}
"""


def graph_sizes(max_batch: int, image: bool = False) -> list[int]:
    """The captured batch sizes up to the largest batch the run uses: each graph of a large model costs
    seconds of warm-up, and sizes above `max_batch_size` are never replayed."""
    from inferd.backends import image_graphs, static_shapes

    sizes = (image_graphs if image else static_shapes).DEFAULT_BATCH_SIZES
    return sorted({size for size in sizes if size < max_batch} | {max_batch})


def serve_and_load(name: str, m: dict[str, Any], device: str, seconds: int, out: Path,
                   graphs: bool = True) -> dict[str, Any]:
    served: dict[str, Any] = {"cuda_graphs": graphs}
    duration = str(seconds)
    processes = "2" if seconds < 5 else "8"
    # (one_step: the same batches without launching one while the one before computes, `device_steps`)
    for label, max_batch, ahead in (("batched", m["max_batch"], True), ("one_step", m["max_batch"], False), ("unbatched", 1, True)):
        progress(f"{name} {label}: starting the server (max_batch_size {max_batch}, launch_ahead {ahead})")
        with inferd(config_toml(m, device, max_batch, graphs, ahead), out / f"server_{name}_{label}.log") as (url, pid):
            warmup = get_json(f"{url}/v1/models")["data"][0].get("warmup", {})
            progress(f"{name} {label}: ready, warm-up {json.dumps(warmup)[:300]}")
            body = Path(tempfile.mkstemp(suffix=".json")[1])
            one = {"image": base64.b64encode(png_of(m["size"])).decode()} if m.get("kind") == "image" else m["text"]
            body.write_text(json.dumps({"model": "model", "input": one}))
            clients = str(m["clients"] if label != "unbatched" else 64)
            with GpuSampler(device) as gpu, Profile(pid, seconds, out / f"profile_{name}_{label}.log"):
                result = bench(url + "/v1/inference", body, clients, duration, processes)
            served[label] = summary(result, gpu.mean(), warmup)
            progress(f"{name} {label}: {json.dumps(served[label])[:400]}")
            if label == "batched" and name.startswith("minilm"):
                items = [m["text"].format(i=i) for i in range(32)]
                body.write_text(json.dumps({"model": "model", "input": items}))
                with GpuSampler(device) as gpu:
                    result = bench(url + "/v1/embeddings", body, str(max(4, m["clients"] // 32)), duration, processes)
                served["embeddings_x32"] = summary(result, gpu.mean(), warmup)
                served["embeddings_x32"]["items_per_s"] = round(result["achieved_rps"] * 32, 1)
            body.unlink()
    return served


def summary(result: dict[str, Any], gpu_busy: float | None, warmup: dict[str, Any]) -> dict[str, Any]:
    view = result.get("server") or {}
    return {"rps": result["achieved_rps"], "errors": result["errors"], "p50_ms": result["latency_ms"]["p50"],
            "p99_ms": result["latency_ms"]["p99"], "mean_batch": view.get("mean_batch_size"),
            "server_cpu_us_per_request": view.get("cpu_us_per_request"), "gpu_busy_pct": gpu_busy,
            "connect_ms": result.get("connect_ms"), "warmup": warmup,
            # The load generator's own loop lag: busy means the client, not the server, may set the figure.
            "generator": result.get("generator")}


def bench(url: str, body: Path, clients: str, duration: str, processes: str) -> dict[str, Any]:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    subprocess.run([sys.executable, "-m", "inferd", "bench", "--url", url, "--body-file", str(body), "--concurrency", clients,
                    "--duration", duration, "--warmup", "3", "--processes", processes, "--out", str(out), "--no-plots",
                    "--stats-url", url.rsplit("/v1/", 1)[0] + "/v1/stats"], cwd=REPO, check=True, capture_output=True)
    result = json.loads(out.read_text())
    out.unlink()
    return result


class inferd:  # noqa: N801 - a context manager named for what it runs
    """The server in a child process; everything it prints goes to `log` as it comes (flushed per line:
    a run cut off by the device's budget still shows how far the server got)."""

    def __init__(self, config: str, log: Path) -> None:
        self.config = config
        self.log = log

    def __enter__(self) -> tuple[str, int]:
        self.file = Path(tempfile.mkstemp(suffix=".toml")[1])
        self.file.write_text(self.config)
        self.proc = subprocess.Popen([sys.executable, "-m", "inferd", "serve", "--config", str(self.file), "--port", "0",
                                      "--log-level", "INFO"], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONFAULTHANDLER="1"))  # (a crash prints the stacks)
        assert self.proc.stdout is not None
        said: list[str] = []
        sink = self.log.open("a")
        for line in self.proc.stdout:
            said.append(line)
            sink.write(f"[{time.monotonic() - STARTED:7.1f} s] {line}")
            sink.flush()
            match = re.search(r"inferd listening on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        else:
            raise RuntimeError("inferd did not start:\n" + "".join(said[-40:]))
        threading.Thread(target=self._copy, args=(self.proc.stdout, sink), daemon=True).start()
        give_up = time.monotonic() + 600
        while time.monotonic() < give_up:
            # A server that died (the first image run's segfaulted at warm-up) is not waited for: that
            # wait took a whole device budget once.
            if self.proc.poll() is not None:
                raise RuntimeError(f"inferd exited with {self.proc.returncode} before it was ready (see {self.log.name})")
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return url, self.proc.pid
            except OSError:
                time.sleep(0.2)
        self.proc.kill()
        raise TimeoutError("inferd never became ready")

    @staticmethod
    def _copy(lines: Any, sink: Any) -> None:
        for line in lines:
            sink.write(f"[{time.monotonic() - STARTED:7.1f} s] {line}")
            sink.flush()

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.file.unlink()


def py_spy_binary() -> str | None:
    """py-spy on PATH, beside this interpreter (a venv), or where `pip install --target` put it (the
    `bin/` of a PYTHONPATH entry, as on the GPU host); None: the steps are not profiled."""
    candidates = [Path(sys.executable).parent / "py-spy"]
    candidates += [Path(entry) / "bin" / "py-spy" for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return shutil.which("py-spy") or next((str(c) for c in candidates if c.is_file()), None)


class Profile:
    """py-spy on the server while a step's load runs (where a py-spy binary is found: `gpu_carry.py` carries
    its wheel): every thread's stacks, idle ones included, 100 times a second, without pausing the
    process, as collapsed stacks in `out` (packed with the logs). The second H200 run had BERT-large's GPU
    65% busy against ~90% with the forward stood in on a CPU: where the rest goes is the question."""

    def __init__(self, pid: int, seconds: int, out: Path) -> None:
        self.binary = py_spy_binary()
        self.args = ["record", "--pid", str(pid), "--duration", str(seconds), "--rate", "100", "--format", "raw",
                     "--threads", "--idle", "--nonblocking", "--output", str(out)]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profile:
        if self.binary is not None:
            self.proc = subprocess.Popen([self.binary, *self.args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


class GpuSampler:
    """nvidia-smi's utilisation every 500 ms while a step runs (None without nvidia-smi)."""

    def __init__(self, device: str) -> None:
        self.index = device.partition(":")[2] or "0"
        self.samples: list[float] = []

    def __enter__(self) -> GpuSampler:
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "-i", self.index, "--query-gpu=utilization.gpu",
                                          "--format=csv,noheader,nounits", "-lms", "500"],
                                         stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def mean(self) -> float | None:
        busy = self.samples[2:-2] or self.samples  # the middle of the step
        return round(statistics.mean(busy), 1) if busy else None


def table(results: dict[str, Any]) -> str:
    lines = [f"### A real model served vs called directly ({results['device']}{', quick check' if results['quick'] else ''})",
             "", "| model | direct eager items/s (at served mean batch) | served req/s | served / direct | "
             "mean batch | GPU busy % | server CPU µs/req | batch-1 served req/s | /v1/embeddings x32 items/s | warm-up s | "
             "CUDA graphs captured | without launching ahead: req/s, GPU busy % | launch-ahead gain |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in results["models"].items():
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error'][:200]} (graphs check: {row['graphs_check']}) |")
            continue
        served, direct = row["served"], row["direct"]
        mean = str(max(1, round(served["batched"]["mean_batch"] or 1)))
        emb = served.get("embeddings_x32", {}).get("items_per_s", "–")
        warm = next(iter(served["batched"]["warmup"].values()), {}).get("warmup_s", "–")
        graphs = next(iter(served["batched"]["warmup"].values()), {}).get("cuda_graphs", "–")  # (captured: 0 on a CPU)
        lines.append(f"| {name} | {direct['eager'].get(mean, {}).get('items_per_s', '–')} | {served['batched']['rps']} | "
                     f"{row['served_over_direct_eager']} | {served['batched']['mean_batch']} | "
                     f"{served['batched']['gpu_busy_pct']} | {served['batched']['server_cpu_us_per_request']} | "
                     f"{served['unbatched']['rps']} | {emb} | {warm} | {graphs} | "
                     f"{served['one_step']['rps']}, {served['one_step']['gpu_busy_pct']} | {row['launch_ahead_gain']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
