"""Generated protobuf and gRPC modules (scripts/gen-proto): the kubelet's device plugin API v1beta1. Do not edit."""
