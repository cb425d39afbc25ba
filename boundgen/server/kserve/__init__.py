"""KServe v2 / Open Inference Protocol over HTTP and gRPC, and Triton's extensions of it."""
