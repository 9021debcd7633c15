"""The admin API for model versions (admin key): see each version's state, load one, move traffic,
unload one. The steps themselves, and what they guarantee, are `models.rollout`'s.

    GET    /v1/admin/models                           every model's versions, states and split
    POST   /v1/admin/models                           load a version: a [[models]] table as JSON (202); what
                                                       it leaves out is its model's serving version's
                                                       (listed as `inherited`)
    PUT    /v1/admin/models/{name}/traffic            the split, e.g. {"1": 90, "2": 10}; for a generation
                                                       model, over itself and its adapters: {"llama": 90, "sql": 10}
    DELETE /v1/admin/models/{name}/versions/{version} drain and unload a version (202; the model's last
                                                       one only with ?last=true, else 409)
    GET    /v1/admin/models/{name}/adapters           a generation model's LoRA adapters
    POST   /v1/admin/models/{name}/adapters           load one: {"name", "path", "pinned"} (200 once loaded)
    DELETE /v1/admin/models/{name}/adapters/{adapter} unload one (202): refused to new requests at once,
                                                       removed once the requests using it have finished
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from aiohttp import web

from ..admission.auth import Authenticator
from ..calls.request_ids import RequestIds
from ..config import ConfigError, parse_model
from ..config.parsing import NAME
from ..errors import InferdError, InvalidInput, MethodNotAllowed, NotFound, VersionConflict
from ..models.rollout import Rollouts
from ..models.versions import Version
from ..wire.json_values import json_object
from .body_reader import BodyReader
from .responses import error_response, json_response

PREFIX = "/v1/admin/models"
_OWN = frozenset(("name", "version", "traffic"))  # never inherited


def inherit(table: dict[str, Any], rollouts: Rollouts) -> dict[str, Any]:
    """What a new version of a served model takes from its serving (default) version: every setting the
    table leaves out but its own name, version and traffic. Nothing for a new model's first version."""
    name = table.get("name")
    served = rollouts.models.served.get(name) if isinstance(name, str) else None
    if served is None or served.default is None:
        return {}
    current = served.versions[served.default].model.config
    given = {f.name: getattr(current, f.name) for f in fields(current) if f.name not in _OWN}
    given = {k: list(v) if isinstance(v, tuple) else dict(v) if k == "options" else v for k, v in given.items()}
    return {k: v for k, v in given.items() if k not in table and v is not None}


class AdminApi:
    def __init__(self, *, rollouts: Rollouts, auth: Authenticator, body: BodyReader, ids: RequestIds,
                 file_drift: Callable[[], dict[str, Any]] | None = None) -> None:
        self.rollouts = rollouts
        self.file_drift = file_drift  # where the server and its config file differ (`ConfigReload.drift`)
        self.auth = auth
        self.body = body
        self.ids = ids

    async def route(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        parts = path.removeprefix(PREFIX).strip("/").split("/") if path != PREFIX else []
        try:
            method = _method_for(parts)
            if method is None:
                raise NotFound(f"no route for {request.method} {path}")
            if request.method not in method:
                return error_response(MethodNotAllowed(f"{path} accepts {' or '.join(method)}"), request_id,
                                      allow=", ".join(method))
            self.auth.require_admin(request.headers)
            rollouts = self.rollouts
            if not parts and request.method == "GET":
                return json_response({"models": rollouts.describe(),
                                      "file_drift": self.file_drift() if self.file_drift is not None else {}}, request_id)
            if not parts:
                table = json_object(await self.body.read(request))
                inherited = inherit(table, rollouts)
                try:
                    config = parse_model({**inherited, **table})
                except ConfigError as exc:
                    raise InvalidInput(str(exc)) from None
                await rollouts.check(config)  # (its module imported off the loop: torch takes seconds)
                state = _state(config.name, rollouts.load(config))
                return json_response({**state, "inherited": sorted(inherited)}, request_id, status=202)
            if parts[1] == "adapters":
                return await self._adapters(request, parts, request_id)
            if parts[1] == "traffic" and parts[0] in rollouts.models.generation:  # (the split over its adapters)
                adapters = rollouts.models.generation[parts[0]].adapters
                adapters.set_traffic(json_object(await self.body.read(request)))
                return json_response({"name": parts[0], "traffic": adapters.traffic}, request_id)
            if parts[1] == "traffic":
                weights = json_object(await self.body.read(request))
                rollouts.set_traffic(parts[0], weights)
                return json_response({"name": parts[0], "traffic": rollouts.models.served[parts[0]].traffic}, request_id)
            last_too = request.rel_url.query.get("last") == "true"  # (explicitly: the model goes with it)
            return json_response(_state(parts[0], rollouts.unload(parts[0], parts[2], last_too)), request_id, status=202)
        except InferdError as error:
            return error_response(error, request_id)


    async def _adapters(self, request: web.BaseRequest, parts: list[str], request_id: str) -> web.StreamResponse:
        model = self.rollouts.models.generation.get(parts[0])
        if model is None:
            raise NotFound(f"no generation model named {parts[0]!r}")
        adapters = model.adapters
        if request.method == "GET":
            return json_response({"model": model.name, "adapters": adapters.describe(), "traffic": adapters.traffic},
                                 request_id)
        if request.method == "DELETE":
            adapters.unload(parts[2])
            return json_response({"model": model.name, "adapter": parts[2], "state": "unloading"}, request_id, status=202)
        table = json_object(await self.body.read(request))
        name, path, pinned = table.get("name"), table.get("path"), table.get("pinned", False)
        if not (isinstance(name, str) and NAME.fullmatch(name) and isinstance(path, str) and isinstance(pinned, bool)):
            raise InvalidInput('an adapter is {"name": 1-128 letters, digits, ".", "_", "-" or ":" (as a model\'s), '
                               '"path": a folder, "pinned": true or false}')
        holder = self.rollouts.models.holder(name)
        if holder is not None:  # (a request names an adapter as its model: one name, one thing)
            raise VersionConflict(f"the name {name!r} is taken by {holder}")
        adapter = await adapters.load(name, path, pinned)
        return json_response({"model": model.name, **adapter.describe(model.name), "state": "loaded"}, request_id)


def _method_for(parts: list[str]) -> tuple[str, ...] | None:
    """The methods a path under /v1/admin/models takes (None: no such path)."""
    if not parts:
        return ("GET", "POST")
    if len(parts) == 2 and parts[1] == "traffic":
        return ("PUT",)
    if len(parts) == 3 and parts[1] in ("versions", "adapters"):
        return ("DELETE",)
    if len(parts) == 2 and parts[1] == "adapters":
        return ("GET", "POST")
    return None


def _state(name: str, version: Version) -> dict[str, str | None]:
    return {"name": name, "version": version.model.version, "state": version.state.value, "reason": version.reason}
