"""The CRI runtime.v1 schema (trimmed) and its generated gRPC modules, for the e2e tests' client only."""
