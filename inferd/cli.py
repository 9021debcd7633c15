"""`inferd serve` and `inferd bench`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from .config import ConfigError, default_config, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferd", description="A dynamic-batching inference server.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--config", help="TOML config file (default: the built-in seed workload)")
    serve.add_argument("--host", help="override [server] host")
    serve.add_argument("--port", type=int, help="override [server] port (0: any free port)")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return _serve(args)
    return 2


def _serve(args: argparse.Namespace) -> int:
    from .server import run

    try:
        config = load_config(args.config) if args.config else default_config()
    except ConfigError as exc:
        print(f"inferd: {exc}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    run(dataclasses.replace(config, **overrides))
    return 0
