"""Generated protobuf and gRPC modules (scripts/gen-proto): the kubelet's PodResources API v1. Do not edit."""
