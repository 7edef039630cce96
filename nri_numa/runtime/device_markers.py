"""How a container's spec shows the devices it was given, as far as finding them needs: NVIDIA's
device major and environment variable, and CDI's annotation prefix.

Apart from the modules that give devices (``device_grant``) and read CDI names (``cdi_names``),
which re-export these, so that a container without devices is looked at without loading them:
each OCI hook process pays for every module it imports."""

NVIDIA_MAJOR = 195  # /dev/nvidiaN; minors 254 and 255 are nvidia-modeset and nvidiactl
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
