"""A fake device plugin: the kubelet's device plugin API v1beta1 served from a list of made-up
devices, for the Kubernetes lab's tests and for trying the kubelet's device assignment where no
real device plugin runs (docs/podresources.md, "The fake device plugin")::

    python -m nri_numa.fake_device_plugin --resource example.com/gpu --device gpu0@0 --device gpu1@1

``devices`` holds what it advertises (read from flags or a file that may change while it runs),
``plugin`` the gRPC server and its registration with the kubelet. Importing this package costs
nothing; grpcio comes with ``plugin``.
"""

# Where a kubelet looks for device plugins and serves its Registration socket. Kubelet 1.20
# uses this folder whatever its --root-dir says.
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET_NAME = "kubelet.sock"
API_VERSION = "v1beta1"
