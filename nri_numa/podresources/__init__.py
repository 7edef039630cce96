"""The kubelet's PodResources API as a source of device NUMA hints (docs/podresources.md).

Importing this package costs nothing: grpcio is imported by ``client`` (and ``fake_server``),
which ``source.KubeletDeviceHints`` loads only once the kubelet's socket exists.
"""

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
