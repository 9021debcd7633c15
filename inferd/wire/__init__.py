"""The wire formats of every dialect: body parsers and answer writers, pure functions over bytes and
records (no network library), shared by the HTTP and gRPC fronts."""
