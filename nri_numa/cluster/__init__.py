"""The Kubernetes side of the agent: the NodeResourceTopology export (docs/kubernetes.md)."""
