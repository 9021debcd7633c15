"""HAProxy agent-check: a TCP port beside the HTTP API that answers each connection with one line and
closes it.

`ready NN%` while serving, the weight falling from 100% as the worst predicted wait across models grows
(1% at `agent_full_wait_ms`), so HAProxy sends less to a host whose queue is filling; `drain` from
SIGTERM on, or while a model is not ready, so it sends nothing new.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..models.registry import Models

log = logging.getLogger("inferd.agent")


def agent_reply(models: Models, ready: bool, full_wait_s: float) -> str:
    if not ready:
        return "drain\n"
    worst = max((m.predicted_wait_s() for m in models.instances() if m.takes_traffic), default=0.0)
    weight = 100 - int(99 * min(1.0, worst / full_wait_s)) if full_wait_s > 0 else 100
    return f"ready {weight}%\n"


async def start_agent_check(
    host: str, port: int, models: Models, ready: Callable[[], bool], full_wait_ms: float
) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(agent_reply(models, ready(), full_wait_ms / 1000.0).encode())
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, host, port)
    log.info("agent-check on %s:%d", host, server.sockets[0].getsockname()[1])
    return server
