"""The e2e harness's pieces that need no running daemon: the trimmed CRI schema against upstream's,
the kubelet arithmetic of the CRI configs, the containerd configs as each version reads them, the
busybox image, and /proc parsing. They run where the e2e tests run (root, runtimes fetched)."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from tests.e2e.cri import api_pb2 as cri
from tests.e2e.harness.cgroups import AllowedLists, parse_status_allowed
from tests.e2e.harness.containerd import DaemonPaths, config_v2, config_v3, to_toml
from tests.e2e.harness.cri import (
    Pod,
    QoS,
    Resources,
    cgroup_parent,
    cpu_quota,
    cpu_shares,
    oom_score_adj,
    qos_class,
)
from tests.e2e.harness.image import build_image, rootfs_layer
from tests.e2e.harness.runtimes import Runtimes, is_static_elf

pytestmark = pytest.mark.e2e

MiB = 1 << 20
GiB = 1 << 30
GUARANTEED = Resources(cpu_request_m=1000, cpu_limit_m=1000, memory_request=64 * MiB, memory_limit=64 * MiB)


# ---- the CRI schema is upstream's, field for field -------------------------------------------

_TOKEN = re.compile(
    r"(?P<rpc>\brpc\s[^;{]*\{\s*\})"
    r"|(?P<open>\b(?P<block>message|enum|service|oneof)\s+(?P<title>\w+)\s*\{)"
    r"|(?P<close>\})"
    r"|(?P<field>(?P<repeated>\brepeated\s+)?(?P<kind>map\s*<[^>]+>|[\w.]+)\s+(?P<name>\w+)\s*=\s*(?P<number>\d+))"
)
_TYPE_NAMES = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 8: "bool", 9: "string",
               12: "bytes", 13: "uint32", 17: "sint32", 18: "sint64"}


def upstream_fields(proto_text: str) -> dict[str, dict[int, tuple[str, str]]]:
    """message name -> {number: (type as written, name)}; nested messages as Outer.Inner."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", proto_text, flags=re.S)
    messages: dict[str, dict[int, tuple[str, str]]] = {}
    stack: list[str] = []  # enclosing message names; "" for an enum, service or oneof
    for token in _TOKEN.finditer(text):
        if token["open"]:
            stack.append(token["title"] if token["block"] == "message" else "")
            if token["block"] == "message":
                messages[".".join(s for s in stack if s)] = {}
        elif token["close"] and stack:
            stack.pop()
        elif token["field"] and stack and stack[-1]:
            kind = ("repeated " if token["repeated"] else "") + re.sub(r"\s+", "", token["kind"])
            messages[".".join(s for s in stack if s)][int(token["number"])] = (kind, token["name"])
    return messages


def descriptor_type(field) -> str:  # noqa: ANN001 - a protobuf FieldDescriptor
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return f"map<{descriptor_type(key)},{descriptor_type(value)}>"
    named = field.message_type or field.enum_type
    kind = named.name if named is not None else _TYPE_NAMES[field.type]
    return ("repeated " if field.is_repeated else "") + kind


def test_cri_schema_matches_upstream_field_for_field(runtimes: Runtimes) -> None:
    upstream_text = runtimes.cri_schema.read_text()
    upstream = upstream_fields(upstream_text)
    ours = {**cri.DESCRIPTOR.message_types_by_name}
    for message in list(ours.values()):
        ours.update({f"{message.name}.{n.name}": n for n in message.nested_types if not n.GetOptions().map_entry})
    assert len(ours) > 60
    for name, message in ours.items():
        assert name in upstream, f"{name} is not an upstream message"
        for field in message.fields:
            written = upstream[name].get(field.number)
            assert written is not None, f"{name}.{field.name} = {field.number} is not upstream"
            assert written[1] == field.name, f"{name} field {field.number}: {field.name} vs upstream {written[1]}"
            assert re.sub(r"\w+\.", "", written[0]) == descriptor_type(field), \
                f"{name}.{field.name}: {descriptor_type(field)} vs upstream {written[0]}"
    upstream_rpcs = dict(re.findall(r"\brpc\s+(\w+)\s*\((\w+\)\s*returns\s*\(\s*\w+)", upstream_text))
    for service in cri.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            assert re.sub(r"\s+", "", upstream_rpcs[method.name]) == \
                f"{method.input_type.name})returns({method.output_type.name}", method.name
    # Trimmed: only the Windows fields may be missing from the messages we kept.
    missing = {f"{n}.{upstream[n][k][1]}" for n, m in ours.items() for k in upstream[n]
               if k not in {f.number for f in m.fields}}
    assert missing == {"PodSandboxConfig.windows", "ContainerConfig.windows", "ContainerResources.windows",
                       "UpdateContainerResourcesRequest.windows"}


# ---- the harness's own pieces, without a daemon ------------------------------------------------


def test_kubelet_cpu_arithmetic() -> None:
    assert cpu_shares(Resources()) == 2  # MinShares, also for a BestEffort container
    assert cpu_shares(Resources(cpu_request_m=1)) == 2
    assert cpu_shares(Resources(cpu_request_m=250)) == 256
    assert cpu_shares(Resources(cpu_limit_m=500)) == 512  # the request defaults to the limit
    assert cpu_quota(Resources(cpu_request_m=500)) == 0  # no limit, no quota
    assert cpu_quota(Resources(cpu_limit_m=5)) == 1_000  # never under 1 ms per 100 ms period
    assert cpu_quota(Resources(cpu_limit_m=1500)) == 150_000


def test_qos_class_cgroup_parent_and_oom_score() -> None:
    burstable = Resources(cpu_request_m=100, memory_request=GiB // 10)  # 1000*req//cap = 99 (Go's division)
    assert qos_class([GUARANTEED]) is QoS.GUARANTEED
    assert qos_class([GUARANTEED, Resources()]) is QoS.BURSTABLE
    assert qos_class([Resources(), Resources()]) is QoS.BESTEFFORT
    assert qos_class([Resources(cpu_limit_m=1000, memory_limit=GiB)]) is QoS.GUARANTEED  # requests = limits
    assert cgroup_parent(QoS.GUARANTEED, "u1") == "/kubepods/podu1"
    assert cgroup_parent(QoS.BURSTABLE, "u1") == "/kubepods/burstable/podu1"
    assert cgroup_parent(QoS.BESTEFFORT, "u1") == "/kubepods/besteffort/podu1"
    assert oom_score_adj(QoS.GUARANTEED, GUARANTEED, GiB) == -997
    assert oom_score_adj(QoS.BESTEFFORT, Resources(), GiB) == 1000
    assert oom_score_adj(QoS.BURSTABLE, burstable, GiB) == 901
    assert oom_score_adj(QoS.BURSTABLE, burstable, 10 * burstable.memory_request) == 900
    assert oom_score_adj(QoS.BURSTABLE, Resources(cpu_request_m=1), GiB) == 999
    assert oom_score_adj(QoS.BURSTABLE, Resources(memory_request=GiB), GiB) == 3


def test_pod_configs_carry_the_kubelet_labels_and_resources() -> None:
    pod = Pod("web", (GUARANTEED, Resources(cpu_limit_m=500, memory_limit=MiB)), uid="u2")
    sandbox = pod.sandbox_config()
    assert sandbox.linux.cgroup_parent == "/kubepods/podu2"
    assert sandbox.hostname == ""  # host network: runc refuses a hostname without a UTS namespace
    assert sandbox.linux.security_context.namespace_options.network == cri.NODE
    assert sandbox.linux.resources.cpu_quota == 150_000 and sandbox.linux.resources.memory_limit_in_bytes == 65 * MiB
    container = pod.container_config("side", "img", index=1)
    assert container.labels == {"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "default",
                                "io.kubernetes.pod.uid": "u2", "io.kubernetes.container.name": "side"}
    assert (container.linux.resources.cpu_shares, container.linux.resources.cpu_quota,
            container.linux.resources.cpu_period) == (512, 50_000, 100_000)


def test_daemon_configs_put_every_setting_where_each_version_reads_it(tmp_path: Path) -> None:
    paths = DaemonPaths(tmp_path, tmp_path / "log")
    v2 = config_v2(paths, "img:1")
    cri_v2 = v2["plugins"]["io.containerd.grpc.v1.cri"]
    assert v2["version"] == 2 and cri_v2["sandbox_image"] == "img:1" and cri_v2["restrict_oom_score_adj"]
    assert cri_v2["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == "/usr/sbin/runc"
    v3 = config_v3(paths, "img:1")
    plugins = v3["plugins"]
    assert v3["version"] == 3 and plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "img:1"
    assert plugins["io.containerd.cri.v1.runtime"]["restrict_oom_score_adj"]
    assert plugins["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]["options"]["Root"] == \
        str(paths.runc_root)
    for config in (v2, v3):
        assert tomllib.loads(to_toml(config)) == config
        nri = config["plugins"]["io.containerd.nri.v1.nri"]
        assert nri["disable"] is False and nri["socket_path"] == str(paths.nri_socket)
        assert config["grpc"]["address"] == str(paths.grpc_socket) and config["root"] == str(paths.root)


def leaves(table: dict[str, object], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    found: dict[tuple[str, ...], object] = {}
    for key, value in table.items():
        found.update(leaves(value, (*path, key)) if isinstance(value, dict) else {(*path, key): value})
    return found


def test_containerd_reads_every_setting_where_we_wrote_it(runtimes: Runtimes, runtime_versions: list[str],
                                                          tmp_path: Path) -> None:
    """`containerd config dump` re-serialises what each plugin decoded: a key written in the wrong
    place or format (v2 vs v3) is missing from it or keeps its default."""
    for version in runtime_versions:
        binaries = runtimes.containerd[version]
        paths = DaemonPaths(tmp_path / version, tmp_path / f"{version}.log")
        ours = (config_v2 if binaries.major == 1 else config_v3)(paths, "img:1")
        written = tmp_path / f"{version}.toml"
        written.write_text(to_toml(ours))
        dump = subprocess.run([str(binaries.containerd), "--config", str(written), "config", "dump"],
                              capture_output=True, text=True, timeout=30, check=True)
        assert "unknown key" not in dump.stderr, dump.stderr
        dumped = leaves(tomllib.loads(dump.stdout))
        for key, value in leaves(ours).items():
            assert dumped.get(key) == value, f"containerd {version} reads {'.'.join(key)} as {dumped.get(key)!r}"


def test_proc_status_parsing() -> None:
    status = "Name:\tcat\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n"
    assert parse_status_allowed(status) == AllowedLists("0-1", "0")
    with pytest.raises(RuntimeError, match="Mems_allowed_list"):
        parse_status_allowed("Cpus_allowed_list:\t0\n")


def test_busybox_image_is_static_complete_and_reproducible(runtimes: Runtimes, tmp_path: Path) -> None:
    assert is_static_elf(runtimes.busybox)
    assert not is_static_elf(Path("/usr/bin/env"))  # dynamically linked on Debian
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = build_image(runtimes.busybox, tmp_path / "a")
    second = build_image(runtimes.busybox, tmp_path / "b")
    assert first.config_digest == second.config_digest
    assert first.tarball.read_bytes() == second.tarball.read_bytes()
    layer = tarfile.open(fileobj=io.BytesIO(rootfs_layer(runtimes.busybox)))
    members = {m.name: m for m in layer.getmembers()}
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode == 0o755
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "/bin/busybox"
    assert members["bin/cat"].issym() and members["tmp"].mode == 0o1777
