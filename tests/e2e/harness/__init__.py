"""The e2e harness: real runtimes found on disk, a busybox image, private containerd daemons, a CRI
client that speaks like the kubelet, and cgroup readers."""
