"""The vLLM engine's settings from a model's options, per device: CUDA graphs where there is CUDA, the
operator's `engine_args` over every default, and nothing given twice."""

from __future__ import annotations

import pytest

from inferd.backends.vllm import check_options, engine_settings, memory_bytes


def test_cuda_keeps_cuda_graphs_and_sizes_the_kv_cache_by_vllms_own_rule(tmp_path):
    on_gpu = engine_settings({"model_path": str(tmp_path)}, cuda=True)
    assert on_gpu["enforce_eager"] is False and "kv_cache_memory_bytes" not in on_gpu  # (gpu_memory_utilization decides)
    on_cpu = engine_settings({"model_path": str(tmp_path)}, cuda=False)
    assert on_cpu["enforce_eager"] is True and on_cpu["kv_cache_memory_bytes"] == 64 << 20
    assert on_gpu["model"] == on_cpu["model"] == str(tmp_path) and on_gpu["scheduling_policy"] == "priority"


def test_engine_args_win_over_every_default_without_a_duplicate_keyword(tmp_path):
    options = {"model_path": str(tmp_path), "max_num_seqs": 8, "kv_cache_memory_bytes": 1 << 30, "engine_args": {
        "enforce_eager": True, "gpu_memory_utilization": 0.8, "enable_prefix_caching": True, "max_num_seqs": 16,
        "tensor_parallel_size": 2}}
    settings = engine_settings(options, cuda=True)
    assert settings["enforce_eager"] is True and settings["max_num_seqs"] == 16  # engine_args over the option
    assert settings["kv_cache_memory_bytes"] == 1 << 30 and settings["gpu_memory_utilization"] == 0.8
    assert settings["tensor_parallel_size"] == 2 and settings["enable_prefix_caching"] is True


def test_the_model_comes_from_model_path_only(tmp_path):
    with pytest.raises(ValueError, match="model_path"):
        check_options({"model_path": str(tmp_path), "engine_args": {"model": "/elsewhere"}})
    with pytest.raises(ValueError, match="table"):
        check_options({"model_path": str(tmp_path), "engine_args": ["enforce_eager"]})


def test_the_memory_need_counts_the_weights_and_the_kv_cache(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 5000)
    (tmp_path / "tokenizer.json").write_bytes(b"\0" * 999)  # (not weights)
    options = {"model_path": str(tmp_path)}
    assert memory_bytes(options, cuda=False) == 5000 * 6 // 5 + (64 << 20)  # the CPU build's 64 MiB KV cache
    assert memory_bytes({**options, "kv_cache_memory_bytes": 1 << 30}, cuda=False) == 5000 * 6 // 5 + (1 << 30)
    fixed = {**options, "engine_args": {"kv_cache_memory_bytes": 2 << 30}}
    assert memory_bytes(fixed, cuda=True) == 5000 * 6 // 5 + (2 << 30)  # on CUDA too, when the KV cache is fixed
