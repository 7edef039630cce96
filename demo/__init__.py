"""The README's first command (`./scripts/demo`): a private containerd with NRI on, the real
`nri-numa run` plugin attached to it, and a Guaranteed, a Burstable and a BestEffort pod run
through CRI; where each container landed is read back from its cgroup's cpuset files and from
`/proc/self/status` inside it.

The demo and the end-to-end tests share one harness: `tests.e2e.harness` (runtimes on disk, the
busybox image, the private containerd, the kubelet-like CRI client, the cgroup readers) and
`tests.e2e.nri_agent` (how `nri-numa run` is started and watched). Nothing here is shipped in
the `nri-numa` package.

Run it from the repository root: `.venv/bin/python -m demo [--smoke] [--containerd 1.7|2.1]`."""
