"""inferd: a dynamic-batching inference server.

The data path, one package per stage: http (in) -> admission -> models (the request's future and
deadline) -> scheduling (preprocessing, queue, batcher) -> execution (one thread per GPU) -> models
(delivery: futures resolved on the loop) -> http (response). docs/architecture.md
follows one request through it, function by function.
"""

__version__ = "0.1.0"
