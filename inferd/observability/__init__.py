"""What the server tells about itself: metrics (recorded cheaply, exported by prometheus-client from
snapshots the models provide) and sampled access logs."""
