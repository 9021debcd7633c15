"""The call layer under both networks: a call's start, admission's one question, its inputs' answers
awaited and withdrawn, and the model catalog (KServe v2 / Triton metadata) HTTP and gRPC both answer."""
