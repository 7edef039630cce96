"""The OCI state and spec a runtime hands ``nri-numa hook``, through the real command line on a
fake host: any state on stdin (any id, lone surrogates included, any pid, bundle and
annotations), any spec in the bundle or on precreate's stdin. Each run exits 0, or 1 with one
bounded line on stderr; the hook log stays one line per record and readable; ``nri-numa state``
still reads the state folder; nothing is written outside the state folder and the cgroup tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from nri_numa.hook.entry import LOG_NAME
from nri_numa.state.checkpoint import FILE_NAME
from nri_numa.topology.synthetic import preset_topology
from tests.integration.hook.fake_host import FakeHost, topology_file, write_bundle
from tests.property.bad_input import TEXT, VALUE, check_lines, cli, examples, files_under

TOPOLOGY = preset_topology("intel-2s-ht")
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,48",
          "topologyManagerPolicy": "single-numa-node"}
SPEC_FIELDS = [("linux",), ("linux", "cgroupsPath"), ("linux", "resources"),
               ("linux", "resources", "cpu"), ("linux", "resources", "cpu", "quota"),
               ("linux", "resources", "cpu", "cpus"), ("linux", "resources", "memory", "limit"),
               ("linux", "resources", "hugepageLimits"), ("linux", "devices"),
               ("process", "env"), ("annotations",),
               ("annotations", "io.kubernetes.cri-o.Labels"),
               ("annotations", "numa.nri.io/devices"),
               ("annotations", "numa.nri.io/topology-policy"), ("hooks",)]


class Host:
    """One fake host for every example: its cgroup tree, /proc, bundles and state folder."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.fake = FakeHost(base / "host", 2, TOPOLOGY.online_cpus)
        self.state = base / "state"
        config = base / "config.json"
        config.write_text(json.dumps(CONFIG))
        # --timeout counts from the start of the process, here pytest's: a day, the most.
        self.args = ["--state-dir", str(self.state), "--config", str(config),
                     "--topology", str(topology_file(base, TOPOLOGY)),
                     "--cgroup-root", str(self.fake.cgroup_root), "--proc-root",
                     str(self.fake.proc), "--timeout", "86400"]
        self.runs = 0

    def bundle(self, spec_field: tuple, value: Any, folder: str) -> Path:
        bundle = write_bundle(self.fake.base, folder, cpus=2)
        spec = json.loads((bundle / "config.json").read_text())
        set_field(spec, spec_field, value)
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle

    def run(self, stage: str, stdin: bytes) -> tuple[int, str, str]:
        """The hook run, checked: its exit, its one line, its log, the state it leaves, and
        that it wrote nothing outside the state folder and the cgroup tree."""
        outside = files_under(self.base, skip=[self.state, self.fake.cgroup_root])
        code, out, err = cli(["hook", stage, *self.args], stdin=stdin)
        event(f"{stage} exit {code}")
        if code:
            event(err[:60])
        assert code in (0, 1), (code, err)
        lines = check_lines(err, f"nri-numa hook {stage}: ")
        assert (code == 1) == bool(lines), (code, err)
        if stage != "precreate" or code == 1:
            assert out == "", out[:500]
        else:
            json.loads(out)
        assert files_under(self.base, skip=[self.state, self.fake.cgroup_root]) == outside
        log = (self.state / LOG_NAME).read_bytes().decode("utf-8")  # strict: no surrogate
        assert all(line[:4].isdigit() for line in log.splitlines()), log[-2000:]
        if (self.state / FILE_NAME).exists():
            code_, out_, err_ = cli(["state", "--state-dir", str(self.state),
                                     "--cgroup-root", str(self.fake.cgroup_root)])
            assert code_ == 0 and err_ == "", err_
        return code, out, err


def set_field(document: dict, path: tuple, value: Any) -> None:
    target = document
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[path[-1]] = value


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Host:
    return Host(tmp_path_factory.mktemp("hook"))


IDS = st.one_of(TEXT, st.integers(0, 10 ** 6).map(lambda n: f"c{n}"))
STATE_CHANGES = st.one_of(st.none(), st.tuples(
    st.sampled_from(["pid", "bundle", "annotations", "status"]), VALUE))
SPEC_CHANGES = st.one_of(st.none(), st.tuples(st.sampled_from(SPEC_FIELDS), VALUE))


@settings(max_examples=examples(25))
@given(IDS, STATE_CHANGES, SPEC_CHANGES, st.sampled_from(["createRuntime", "poststop"]))
def test_any_state_and_spec_is_placed_or_refused_in_one_line(host, cid, state_change,
                                                             spec_change, stage):
    host.runs += 1
    pid = 10_000 + host.runs
    folder = f"b{host.runs}"
    bundle = host.bundle(*(spec_change or (("annotations",), {})), folder)
    host.fake.start(pid, f"/pods/{folder}")
    state: dict[str, Any] = {"ociVersion": "1.0.2", "id": cid, "status": "creating",
                             "pid": pid, "bundle": str(bundle)}
    if state_change is not None:
        state[state_change[0]] = state_change[1]
    code, _, _ = host.run(stage, json.dumps(state).encode())
    if stage == "createRuntime" and code == 0:  # what was placed is released again
        state.update(status="stopped")
        host.run("poststop", json.dumps(state).encode())


@settings(max_examples=examples(25))
@given(st.sampled_from(SPEC_FIELDS), VALUE)
def test_any_spec_on_precreate_stdin_is_placed_or_refused_in_one_line(host, field, value):
    host.runs += 1
    spec = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]},
            "linux": {"cgroupsPath": f"/libpod_parent/libpod-{host.runs:064x}",
                      "resources": {"cpu": {"quota": 200_000, "period": 100_000},
                                    "memory": {"limit": 1 << 26}}},
            "hooks": {"createRuntime": [{"path": "/x", "args": ["nri-numa", "hook",
                                                                 "createRuntime"]}]}}
    set_field(spec, field, value)
    host.run("precreate", json.dumps(spec).encode())


@settings(max_examples=examples(25))
@given(st.one_of(st.binary(max_size=200), TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
                 VALUE.map(lambda v: json.dumps(v).encode()),
                 st.integers(60, 5000).map(lambda n: b'{"id": ' + b"[" * n)))
def test_any_bytes_on_stdin_are_refused_in_one_line(host, stdin):
    host.run("poststop", stdin)
