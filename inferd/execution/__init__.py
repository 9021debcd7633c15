"""Running batches: executor threads (one per GPU), the pool that keeps them alive, and the state the
fault handling keeps (circuit breaker, hang limit, dead letters)."""
