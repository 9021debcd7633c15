"""`inferd bench`: an open- and closed-loop HTTP load generator that tells the truth about latency.

loadgen (engines: Python, wrk) -> runner (steps, sweeps, the server's own view) -> report (JSON,
markdown, plots). Pointed at any URL and body, so it measures other servers too.
"""
