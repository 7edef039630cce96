"""The kube-scheduler extender that predicts each node's admission with that node's own engine
(docs/scheduler-extender.md)."""
