"""The model catalog of the Open Inference Protocol (KServe v2) and Triton: what its metadata,
repository and statistics routes answer, over HTTP and over gRPC alike."""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..errors import ModelNotFound
from ..models.batch_model import BatchModel
from ..models.registry import Models
from ..observability.metrics import RequestMetrics
from ..wire.open_inference import IMAGE_INPUT, INPUT, OUTPUT


def server_metadata() -> dict[str, Any]:
    return {"name": "inferd", "version": __version__, "extensions": ["binary_tensor_data"]}


def routed_model(models: Models, name: str, version: str | None) -> BatchModel:
    """The batch model a protocol call names (its split when no version is named), else a 404."""
    model = models.route(name, version) if "@" not in name else None
    if model is None:
        served = "a generation model, not served over this protocol" if name in models.generation else "no model"
        raise ModelNotFound(f"{name!r}: {served}; see GET /v1/models")
    return model


def model_metadata(models: Models, model: BatchModel) -> dict[str, Any]:
    embedding = model.output_kind == "embedding"
    versions = list(models.served[model.name].versions) if model.name in models.served else [model.version]
    return {"name": model.name, "versions": versions, "platform": "inferd",
            "inputs": [{"name": input_name(model), "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": OUTPUT, "datatype": "FP32" if embedding else "BYTES",
                         "shape": [-1, embedding_width(model)] if embedding else [-1]}]}


def embedding_width(model: BatchModel) -> int:
    """An embedding model's full vector length once a worker has said it (its `embedding_sizes`: any
    size up to it, or the trained sizes, the largest last), else -1 (unknown), as the protocol writes it."""
    sizes = model.offers.embedding_sizes
    return sizes if isinstance(sizes, int) else max(sizes) if sizes else -1


def repository_index(models: Models, ready_only: bool) -> list[dict[str, str]]:
    """Triton's repository index: every batch model version and its state (a generation model is
    not served over this protocol)."""
    rows = [{"name": name, "version": version, "state": "READY" if found.model.ready else "UNAVAILABLE",
             "reason": found.reason or ""}
            for name, served in models.served.items() for version, found in served.versions.items()]
    return [row for row in rows if row["state"] == "READY"] if ready_only else rows


def input_name(model: BatchModel) -> str:
    return IMAGE_INPUT if model.input_kind == "image" else INPUT


def triton_config(model: BatchModel) -> dict[str, Any]:
    """A model's settings in the shape of Triton's model configuration, as far as they mean the same."""
    config = model.config
    embedding = model.output_kind == "embedding"
    return {"name": model.name, "platform": "inferd", "backend": config.backend, "version_policy": {"specific": {
            "versions": [int(model.version)] if model.version.isdigit() else []}},
            "max_batch_size": config.max_batch_size,
            "input": [{"name": input_name(model), "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": OUTPUT, "data_type": "TYPE_FP32" if embedding else "TYPE_STRING",
                        "dims": [embedding_width(model) if embedding else 1]}],
            "dynamic_batching": {"max_queue_delay_microseconds": int(config.max_wait_ms * 1000),
                                 "default_queue_policy": {"default_timeout_microseconds": config.timeout_ms * 1000}},
            "instance_group": [{"count": config.workers, "kind": "KIND_GPU" if any(d.startswith("cuda") for d in config.worker_devices)
                                else "KIND_MODEL"}]}


def model_statistics(model: BatchModel, metrics: RequestMetrics | None) -> dict[str, Any]:
    """Triton's statistics extension for one model version (`tritonclient`'s get_inference_statistics):
    `success` and `fail` its answers (200s; 5xx), the successes' time as the mean answer time (of every
    answer and version: the one figure kept per model) times their number, `queue`
    and `compute_infer` per computed request (a batch's backend time counted once per request in it), and
    per batch size its batches and backend time. Its inputs are prepared, and outputs written, off the
    device: `compute_input` and `compute_output` stay 0."""
    stats = model.stats

    def spent(count: float, seconds: float) -> dict[str, int]:
        return {"count": int(count), "ns": int(seconds * 1e9)}

    answered = [(status, n) for (name, version, _tier, status, _error), n in (metrics.requests.items() if metrics else ())
                if name == model.name and version == model.version]
    duration = metrics.duration.get(model.name) if metrics is not None else None
    ok = sum(n for status, n in answered if status == 200)
    return {"name": model.name, "version": model.version, "last_inference": int(stats.last_batch_at * 1000),
            "inference_count": stats.requests_computed, "execution_count": stats.batches, "inference_stats": {
                "success": spent(ok, ok * (duration.mean or 0.0) if duration else 0.0),
                "fail": spent(sum(n for status, n in answered if status >= 500), 0.0),
                "queue": spent(stats.queue_wait.count, stats.queue_wait.sum),
                "compute_input": spent(0, 0.0), "compute_infer": spent(stats.requests_computed, stats.compute_request_s),
                "compute_output": spent(0, 0.0)},
            "batch_stats": [{"batch_size": size, "compute_input": spent(n, 0.0), "compute_output": spent(n, 0.0),
                             "compute_infer": spent(n, stats.compute_s_by_size[size])}
                            for size, n in sorted(stats.batch_sizes.items())]}
