"""``python -m nri_numa.fake_device_plugin``: serve made-up devices to a kubelet until stopped."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from nri_numa.fake_device_plugin import DEFAULT_PLUGIN_DIR
from nri_numa.fake_device_plugin.devices import (DeviceListError, device_from_flag, device_list,
                                                 read_device_file)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nri_numa.fake_device_plugin",
        description="Serve the kubelet's device plugin API v1beta1 for made-up devices and "
                    "register with the kubelet; until SIGTERM or Ctrl-C. Allocate hands each "
                    "container FAKE_DEVICE_<n>=<id> variables and no host device.")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--devices", metavar="FILE", type=Path,
                       help="resource and devices in YAML or JSON, read again when it changes "
                            "(see nri_numa/fake_device_plugin/devices.py)")
    given.add_argument("--resource", metavar="NAME",
                       help="the extended resource, e.g. example.com/gpu (with --device)")
    parser.add_argument("--device", action="append", default=[], metavar="ID[@NUMA,...]",
                        help="a healthy device and its NUMA nodes, e.g. gpu0@0; repeat it")
    parser.add_argument("--plugin-dir", default=DEFAULT_PLUGIN_DIR, metavar="DIR",
                        help=f"the kubelet's device plugin folder, holding its kubelet.sock "
                             f"(default {DEFAULT_PLUGIN_DIR}, fixed in kubelet 1.20)")
    parser.add_argument("--endpoint", metavar="NAME",
                        help="the plugin's socket file name in that folder "
                             "(default fake-<resource>.sock)")
    parser.add_argument("--no-pre-start", action="store_true",
                        help="do not ask the kubelet for PreStartContainer calls")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.devices is not None:
            if args.device:
                raise DeviceListError("--device goes with --resource, not with --devices")
            devices = read_device_file(args.devices)
        else:
            devices = device_list(args.resource, [device_from_flag(d) for d in args.device])
    except DeviceListError as e:
        print(f"fake device plugin: {e}", file=sys.stderr)
        return 2
    # grpcio is loaded only once the devices are known to be good.
    from nri_numa.fake_device_plugin.plugin import FakeDevicePlugin, PluginError

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        plugin = FakeDevicePlugin(devices, plugin_dir=args.plugin_dir, endpoint=args.endpoint,
                                  device_file=args.devices, pre_start_required=not args.no_pre_start)
        plugin.start()
    except (PluginError, RuntimeError, OSError) as e:  # OSError: the folder not writable
        print(f"fake device plugin: {e}", file=sys.stderr)
        return 2
    print(f"fake device plugin: running (pid {os.getpid()})", file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
