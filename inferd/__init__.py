"""inferd: a dynamic-batching inference server.

The data path, one package per stage: http (in) -> admission -> scheduling (preprocessing, queue,
batcher) -> execution (one thread per GPU) -> models (futures resolved on the loop) -> http (response).
"""

__version__ = "0.1.0"
