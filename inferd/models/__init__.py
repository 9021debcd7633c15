"""Served models: a batch model (its queue, batcher, worker pool and results), a generation model (a
vLLM engine in the loop), what a model's load predicts, and the set a server serves."""
