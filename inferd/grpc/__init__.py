"""The Open Inference Protocol (KServe v2) over gRPC, on its own port in the same process and on the same
event loop as HTTP (`[server] grpc_port`). Its messages and service come from the stubs `tritonclient`
ships (`inference.GRPCInferenceService`), the ones Triton's own Python clients are built on."""
