"""From an admitted request to a batch: preparation off the loop, the per-model queue, deadlines, and
the batcher's rule for when a batch leaves."""
