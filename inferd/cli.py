"""`inferd serve`, `inferd check-config`, `inferd bench` and `inferd plan`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import __version__
from .admission.auth import key_digest
from .config import ConfigError, ServerConfig, TenantConfig, default_config, load_config
from .config.borrowed_flags import add_borrowed_flags, borrowed_models, borrowed_settings, refuse_unknown
from .config.model_folders import TASKS, FolderModel, folder_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferd", description="A dynamic-batching inference server.")
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check-config", help="validate a config file and build nothing")
    check.add_argument("config", help="TOML config file")

    serve = sub.add_parser("serve", help="run the server", description="Serve a config file, model folders "
                           "(--model, no file needed), or with neither the built-in seed workload.")
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--config", help="TOML config file (default: the built-in seed workload)")
    source.add_argument("--model", action="append", metavar="PATH", help="a model folder to serve with inferd's "
                        "defaults (repeatable; the first is the default model)")
    serve.add_argument("--task", action="append", choices=TASKS, help="what the N-th --model does, where its "
                       "config.json does not say (repeatable, in --model's order)")
    serve.add_argument("--name", action="append", help="the N-th --model's name (default: its folder's name, or "
                       "its Hub name where it came from the Hub)")
    serve.add_argument("--print-config", action="store_true", help="print the config --model makes (TOML) and exit")
    serve.add_argument("--api-key", help="requests must present this key (Authorization: Bearer KEY), as with "
                       "`vllm serve --api-key`; the environment's INFERD_API_KEY is read when this is not given")
    serve.add_argument("--admin-key", help="the admin API's key (/v1/admin/...: versions, traffic splits, adapters); "
                       "the environment's INFERD_ADMIN_KEY is read when this is not given")
    serve.add_argument("--host", help="override [server] host")
    serve.add_argument("--port", type=int, help="override [server] port (0: any free port)")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    add_borrowed_flags(serve)  # (as `vllm serve` and TEI's launcher spell them)

    bench = sub.add_parser("bench", help="load-test a server (open or closed loop)")
    bench.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8000/v1/inference")
    body = bench.add_mutually_exclusive_group()
    body.add_argument("--body-file", help="request body; {i} is replaced by a per-request counter")
    body.add_argument("--body", help="request body given inline")
    bench.add_argument("--method", default="POST")
    bench.add_argument("--header", action="append", default=[], help="'Name: value', repeatable")
    load = bench.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", help="open loop: requests/s (Poisson); a comma list is a sweep")
    load.add_argument("--concurrency", help="closed loop: clients; a comma list is a sweep")
    bench.add_argument("--duration", type=float, default=10.0, help="seconds per step")
    bench.add_argument("--warmup", type=float, default=0.0, help="seconds of unrecorded load before each step")
    bench.add_argument("--timeout", type=float, default=30.0, help="seconds before a request counts as timed out")
    bench.add_argument("--processes", type=int, default=1, help="load processes (wrk: threads)")
    bench.add_argument("--engine", choices=("python", "wrk"), default="python")
    bench.add_argument("--stats-url", help="inferd's /v1/stats (default: derived from --url; 'none' to skip)")
    bench.add_argument("--ceiling-rps", type=float, help="drawn in plots, and %% of it reported")
    bench.add_argument("--floor-ms", type=float, help="drawn in plots, and latency over it reported")
    bench.add_argument("--out", help="RESULT.json (a .md table and, with matplotlib, .png plots beside it)")
    bench.add_argument("--no-plots", action="store_true")

    plan = sub.add_parser("plan", help="simulate a day of traffic on an autoscaled fleet: SLO, refusals and "
                          "GPU-hours per scaling policy", description="A fleet of simulated replicas (inferd's own "
                          "batcher, cost model and admission on a virtual clock) behind a least-connections balancer, "
                          "scaled by Kubernetes' HPA algorithm on each policy's signal, against an oracle. A whole "
                          "default day takes minutes a policy; each run says when it ends.",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    plan.add_argument("--day-s", type=float, default=4 * 3600.0, help="the day's length in seconds (compressed: "
                      "start delays and windows stay in real seconds)")
    plan.add_argument("--trough-rps", type=float, default=40.0, help="the day's lowest request rate")
    plan.add_argument("--peak-rps", type=float, default=320.0, help="the day's highest request rate, spikes aside")
    plan.add_argument("--spike-factor", type=float, default=4.0, help="three spikes multiply the rate by this")
    plan.add_argument("--long-share", type=float, default=0.1, help="share of inputs in the long length bucket")
    plan.add_argument("--latency-ms", type=float, default=100.0, help="a batch's fixed time on the device")
    plan.add_argument("--per-item-ms", type=float, default=2.0, help="a batch's time per input")
    plan.add_argument("--long-factor", type=float, default=2.0, help="a long-bucket batch costs this many times more")
    plan.add_argument("--max-batch-size", type=int, default=16)
    plan.add_argument("--slo-ms", type=float, default=1000.0, help="the latency objective (admission's too)")
    plan.add_argument("--start-s", type=float, default=60.0, help="a new replica's start-up (weights, warm-up)")
    plan.add_argument("--tiers", metavar="NAME:SHARE[:SLO_MS],...", help="tiers and their shares of the requests, "
                      "each with its own objective if given (e.g. enterprise:0.2:300,free:0.8); default: one tier")
    plan.add_argument("--policies", help="comma list of utilisation, waiting, predicted_wait, objective, ahead, rate, "
                                         "shipped (default: all)")
    plan.add_argument("--demand-target", type=float,
                      help="`shipped`: the request rate a replica is scaled to, as a share of its capacity "
                           "(default: the shipped ScaledObject's)")
    plan.add_argument("--out", help="RESULT.json: every policy's figures, replicas and samples")
    plan.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                      help="runs at once, a process each (default: one per core; a whole day is ~2 GB a run)")
    plan.add_argument("--access-log", metavar="PATH", help="plan the day a server recorded (its access log's JSON "
                      "lines) instead of a synthetic one; needs --served-model")
    plan.add_argument("--served-model", metavar="PATH", help="GET /v1/models/NAME's answer, saved: the model's batch "
                      "settings and measured batch costs (its own objective where it has one, else --slo-ms)")
    plan.add_argument("--sample-rate", type=float, default=1.0, help="the access log's access_log_sample_rate: "
                      "each line stands for 1/rate requests (record with 1.0 where you can)")

    args, extra = parser.parse_known_args(argv)
    refuse_unknown(parser, extra, args.command)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "check-config":
        return _check_config(args.config)
    if args.command == "plan":
        return _plan(args)
    return 2


def _check_config(path: str) -> int:
    """Every mistake of the file at once, and what `serve` would refuse short of loading weights: each
    backend imported, its factory or function found, its options checked by the backend itself."""
    from .backends import module_check_options, resolve_backend
    from .errors import describe

    problems: list[str] = []
    try:
        config = load_config(path)
        models = [(m.name, m.version, m.kind, m.backend, m.options) for m in config.models]
    except ConfigError as exc:  # (its backends are checked all the same, as far as the tables can be read)
        problems.extend(exc.problems)
        models = _readable_models(path)
    for name, version, _kind, backend, options in models:
        try:
            resolve_backend(backend)  # (a batch function or factory; a generation engine's `create`)
            module_check_options(backend, options)
        except Exception as exc:  # noqa: BLE001 - whatever importing or checking raised is the file's problem
            problems.append(f"[[models]] {name!r} version {version}: backend {backend!r}: {describe(exc)}")
    for problem in problems:
        print(f"inferd: {problem}", file=sys.stderr)
    if problems:
        return 2
    served = ", ".join(f"{m.name} ({m.kind}, {m.backend})" for m in config.models)
    print(f"{path}: valid; listens on {config.host}:{config.port}; models: {served}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .observability.access_log import configure_access_logger
    from .server import run

    try:
        api_key = given_key(args.api_key, "--api-key", "INFERD_API_KEY")
        admin_key = given_key(args.admin_key, "--admin-key", "INFERD_ADMIN_KEY")
        args.model = borrowed_models(args)  # (--model, vLLM's positional model, TEI's --model-id)
        if args.model and args.config:
            raise ConfigError("serve a --config file or model folders, not both")
        if args.model:
            config = _folders_config(args, api_key, admin_key)
            if config is None:
                return 0
        else:
            if args.task or args.name or args.print_config:
                raise ConfigError("--task, --name and --print-config go with --model")
            config = load_config(args.config) if args.config else default_config()
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"inferd: {problem}", file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {k: v for k, v in (("host", args.host or args.hostname), ("port", args.port),
                                                   ("grpc_port", args.grpc_port)) if v is not None}
    keys = (None, None) if args.model else (api_key, admin_key)  # (--model's config has them already)
    reread = (lambda: with_keys(dataclasses.replace(load_config(args.config), **overrides), *keys)) if args.config else None
    configure_access_logger()
    return run(with_keys(dataclasses.replace(config, **overrides), *keys), reread)


def given_key(flag_value: str | None, flag: str, variable: str) -> str | None:
    """A key given by `flag` (else the environment's `variable`), as requests present it: stripped, as
    `presented_key` strips a client's (hashed with its newline, it refused its own operator). None: none
    given. Given blank (`--api-key "$KEY"` with KEY unset), it would start the server open: refused."""
    raw, source = (flag_value, flag) if flag_value is not None else (os.environ.get(variable), variable)
    if raw is None:
        return None
    key = raw.strip()
    if not key:
        raise ConfigError(f"{source} is empty (an unset shell variable?): refusing to start a server without the key "
                          f"it was asked to require; give the key, or leave {source} out")
    return key


def _folders_config(args: argparse.Namespace, api_key: str | None, admin_key: str | None) -> ServerConfig | None:
    """The config of `--model` folders (None: it was printed, as `--print-config` asks)."""
    tasks, names = args.task or [], args.name or []
    if len(tasks) > len(args.model) or len(names) > len(args.model):
        raise ConfigError("more --task or --name than --model: each applies to the --model of its place")
    models = [FolderModel(path, tasks[i] if i < len(tasks) else None, names[i] if i < len(names) else None,
                          (lambda task: borrowed_settings(args, task)) if i == 0 else None)  # (their flags: the first's)
              for i, path in enumerate(args.model)]
    digest, admin_digest = (None if key is None else key_digest(key) for key in (api_key, admin_key))
    config, text = folder_config(models, args.host or args.hostname or "127.0.0.1", 8000 if args.port is None else args.port,
                                 digest, admin_digest, args.grpc_port)
    if args.print_config:
        print(text, end="")
        return None
    return config


def with_keys(config: ServerConfig, api_key: str | None, admin_key: str | None = None) -> ServerConfig:
    """`--api-key` over a config file: one more tenant (in the highest tier), auth on if it was off, and
    the operations endpoints (`/v1/models`, `/v1/stats`, `/metrics`, `/info`) under a key where the file
    left them open, as `vllm serve --api-key` guards every `/v1` route (the probes stay open);
    `--admin-key`: the admin API's key, in place of the file's."""
    if admin_key is not None:
        config = dataclasses.replace(config, auth=dataclasses.replace(config.auth, admin_key_sha256=key_digest(admin_key)))
    if api_key is None:
        return config
    tenant = TenantConfig(name="api-key", tier=config.tiers[0].name, key_sha256=key_digest(api_key))
    auth = dataclasses.replace(config.auth, enabled=True,
                               operations="key" if config.auth.operations == "open" else config.auth.operations)
    return dataclasses.replace(config, auth=auth, tenants=(*config.tenants, tenant))


def _bench(args: argparse.Namespace) -> int:
    from .bench.command import command

    return command(args)


def _readable_models(path: str) -> list[tuple[str, str, str, str, Mapping[str, Any]]]:
    """(name, version, kind, backend, options) of each [[models]] table that names a backend, read from a
    file that did not parse whole: its backends are worth checking all the same."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    tables = raw.get("models")
    found: list[tuple[str, str, str, str, Mapping[str, Any]]] = []
    for t in tables if isinstance(tables, list) else []:
        if isinstance(t, dict) and isinstance(t.get("backend"), str):
            options = t.get("options")
            found.append((str(t.get("name", "?")), str(t.get("version", "1")), str(t.get("kind", "batch")),
                          t["backend"], options if isinstance(options, dict) else {}))
    return found


def _plan(args: argparse.Namespace) -> int:
    from .planning.plan import command

    return command(args)
