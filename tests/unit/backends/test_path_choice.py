"""Graph or eager per batch, on measured curves: BERT-large's on an H200 (a 256-token graph slower than
an eager forward at 126 inputs of ~190 tokens, graphs far faster for small batches), learned from the
calls that run, with a close call checked the other way now and then."""

from __future__ import annotations

import pytest

from inferd.backends.path_choice import EXPLORE_EVERY, PathChoice


def bert_large() -> PathChoice:
    paths = PathChoice()
    graphs = [(4, 32, 0.0008), (8, 64, 0.0012), (128, 256, 0.0465), (32, 256, 0.0125)]
    eager = [(8, 64, 0.003), (128, 256, 0.042), (32, 256, 0.0125)]  # eager launches cost ~2.4 ms a call
    paths.learn_warmup(graphs, eager)
    return paths


def test_a_graph_slower_than_eager_at_a_large_batch_is_not_used_there():
    paths = bert_large()
    assert paths.eager_s(126, 190) == pytest.approx(0.0311, rel=0.1)  # the H200's 31.1 ms
    assert not paths.use_graph((128, 256), 126, 190)  # 46.5 ms as the padded graph: eager
    assert paths.use_graph((4, 32), 3, 20)  # a small batch: the graph, several times faster
    assert not paths.use_graph(None, 300, 512)  # no captured shape holds it
    assert paths.chosen == {"graph": 1, "eager": 1}


def test_the_choice_follows_the_calls_that_run():
    paths = bert_large()
    assert not paths.use_graph((128, 256), 126, 190)
    for _ in range(40):  # eager turns out twice as slow as fitted (another process on the GPU, say)
        paths.ran_eager(126, 190, 2 * paths.eager_s(126, 190) / paths._eager_ratio)
    assert paths.use_graph((128, 256), 126, 190)
    for _ in range(40):  # and the graph's replays slow down in turn
        paths.ran_graph((128, 256), 0.2)
    assert not paths.use_graph((128, 256), 126, 190)


def test_a_close_call_goes_the_other_way_now_and_then_so_both_stay_measured():
    paths = bert_large()
    picks = [paths.use_graph((32, 256), 32, 250) for _ in range(EXPLORE_EVERY * 2)]  # 12.5 against ~12.1 ms
    assert picks.count(True) == 2 and picks.count(False) == 2 * EXPLORE_EVERY - 2


def test_without_eager_measurements_a_captured_shape_runs_as_its_graph():
    paths = PathChoice()
    paths.learn_warmup([(8, 64, 0.001)], [])
    assert paths.use_graph((8, 64), 8, 60) and not paths.use_graph((16, 64), 9, 60)
