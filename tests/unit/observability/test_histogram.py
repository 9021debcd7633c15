"""The fixed-bucket histogram: `le` buckets, cumulative counts as Prometheus has them."""

from inferd.observability.histogram import Histogram


def test_observations_land_in_the_first_bucket_at_or_above_them():
    h = Histogram((0.1, 0.5, 1.0))
    for value in (0.05, 0.1, 0.3, 2.0):
        h.observe(value)
    assert h.counts == [2, 1, 0, 1] and h.count == 4
    assert h.cumulative() == [("0.1", 2), ("0.5", 3), ("1.0", 3), ("+Inf", 4)]
    assert h.sum == 2.45 and h.mean == 2.45 / 4
    assert Histogram().mean is None
