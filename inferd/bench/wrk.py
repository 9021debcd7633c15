"""The wrk engine: a C load generator for closed-loop steps too fast for Python, driven by a Lua script
that counts statuses exactly (latency percentiles come from wrk's own histogram)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

from .loadgen import WORDS_MAX, LoadSpec, Samples

_WRK_SCRIPT = """
local counter = {start}
local template = {template}
local headers = {headers}
statuses = {{}}
local threads = {{}}
local next_id = 0
setup = function(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end
init = function(args) counter = counter + (id or 0) * 1000000000 end
request = function()
  counter = counter + 1
  local body = nil
  if template then
    body = template:gsub("{{i}}", tostring(counter))
    body = body:gsub("{{words}}", string.rep("word ", (counter * 7919) % {words_max}) .. "end")
  end
  return wrk.format("{method}", "{path}", headers, body)
end
response = function(status, hdrs, body)
  statuses[status] = (statuses[status] or 0) + 1
end
done = function(summary, latency, requests)
  local st = {{}}
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for k, v in pairs(s) do st[k] = (st[k] or 0) + v end
  end
  local parts = {{}}
  for k, v in pairs(st) do table.insert(parts, string.format('"%d": %d', k, v)) end
  io.write("WRK_JSON{{")
  io.write(string.format('"requests": %d, "duration_us": %d, ', summary.requests, summary.duration))
  io.write(string.format('"connect": %d, "read": %d, "write": %d, "timeout": %d, ',
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
  io.write(string.format('"p50": %f, "p90": %f, "p99": %f, "p999": %f, "max": %f, "mean": %f, ',
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean))
  io.write('"statuses": {{' .. table.concat(parts, ", ") .. '}}}}\\n')
end
"""


def _lua_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def run_wrk(spec: LoadSpec) -> Samples:
    """Closed loop through wrk (exact per-status counts; percentiles from wrk's histogram)."""
    if spec.concurrency is None:
        raise ValueError("the wrk engine runs closed loop only (--concurrency)")
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk), use --engine python")
    parts = urlsplit(spec.url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = "{" + ", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in spec.headers) + "}"
    template = _lua_string(spec.body.decode()) if spec.body is not None else "nil"
    script = _WRK_SCRIPT.format(start=spec.counter_start, template=template, headers=headers, method=spec.method, path=path,
                                words_max=WORDS_MAX)
    threads = max(1, min(spec.concurrency, spec.processes, os.cpu_count() or 1))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [wrk, f"-t{threads}", f"-c{spec.concurrency}", f"-d{max(1, round(spec.duration_s))}s",
             f"--timeout={max(1, round(spec.timeout_s))}s", "-s", f.name, f"{parts.scheme}://{parts.netloc}"],
            capture_output=True, text=True, timeout=spec.duration_s + spec.timeout_s + 30,
        )
        wall = time.monotonic() - started
    finally:
        os.unlink(f.name)
    match = re.search(r"WRK_JSON(\{.*\})", proc.stdout)
    if match is None:
        raise RuntimeError(f"wrk failed: {proc.stdout}\n{proc.stderr}")
    data: dict[str, Any] = orjson.loads(match.group(1))
    samples = Samples(engine="wrk", wall_s=data["duration_us"] / 1e6 or wall)
    samples.statuses.update({k: v for k, v in data["statuses"].items()})
    errors = {"connect_error": data["connect"], "connection_error": data["read"] + data["write"], "timeout": data["timeout"]}
    samples.statuses.update({k: v for k, v in errors.items() if v})
    samples.sent = sum(samples.statuses.values())
    samples.in_window = samples.sent  # wrk stops at the end of the duration
    samples.percentiles_ms = {k: data[k] / 1000.0 for k in ("p50", "p90", "p99", "p999", "max", "mean")}
    return samples
