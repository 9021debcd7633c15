"""The probes and the short answers about the server (`about.py`), in-process (`wiring`): readiness
follows the models and the phase, and the routes other servers' clients probe first (TEI's `/health`
and `/info`, vLLM's `/version`) answer in their shape."""

from __future__ import annotations

from inferd import __version__

from ...helpers import until
from .wiring import sim, wired


async def test_readiness_follows_the_models_and_the_phase():
    async with wired(sim("m"), sim("other"), start=False) as w:
        resp = await w.client.get("/readyz")
        body = await resp.json()
        assert resp.status == 503 and body["ready"] is False and body["models"]["m"]["ready"] is False
        health = await w.client.get("/health")
        assert health.status == 503 and (await health.json())["status"] == "unavailable"
        for model in w.models.values():
            model.start()
        await until(lambda: all(m.ready for m in w.models.values()))
        resp = await w.client.get("/readyz")
        body = await resp.json()
        assert resp.status == 200 and set(body["models"]) == {"m", "other"} and body["phase"] == "serving"
        health = await w.client.get("/health")
        assert health.status == 200 and (await health.json())["status"] == "ok"
        listed = await (await w.client.get("/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == ["m", "other"] and listed["object"] == "list"


async def test_version_and_info_say_what_is_served_with_which_limits():
    async with wired(sim("m", max_batch_size=16, max_inputs_per_call=64), sim("other")) as w:
        version = await w.client.get("/version")
        assert version.status == 200 and (await version.json()) == {"version": __version__}
        info = await (await w.client.get("/info")).json()
        assert info["model_id"] == "m" and info["version"] == __version__
        assert info["max_client_batch_size"] == 64 and info["max_batch_requests"] == 16
        assert [m["id"] for m in info["models"]] == ["m", "other"]
        assert info["models"][0]["kind"] == "batch" and info["models"][0]["max_input_chars"] == 100_000
