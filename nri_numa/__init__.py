"""nri-numa: NUMA-aligned CPUs, memory and devices for containers."""

__version__ = "0.1.0"
