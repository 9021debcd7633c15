"""inferd: a dynamic-batching inference server.

The data path, one module per stage: http_api (HTTP in) -> admission -> batcher / request_queue ->
executor (one thread per GPU) -> served_model (futures resolved on the loop) -> http_api (response).
"""

__version__ = "0.1.0"
