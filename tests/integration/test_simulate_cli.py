"""`nri-numa simulate` and `nri-numa explain` end to end: the examples, their decisions, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nri_numa.cli import main
from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.synthetic import preset_topology
from nri_numa.views.simulate import BadEntry, DeleteEntry, load_pods, parse_entry

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SINGLE = str(EXAMPLES / "config-single-numa.yaml")
BEST_EFFORT = str(EXAMPLES / "config-best-effort.yaml")
DGX_PODS = str(EXAMPLES / "pods-dgx.yaml")
EPYC_PODS = str(EXAMPLES / "pods-epyc.yaml")

DGX = preset_topology("dgx-h100")
GPU_NODE = {g.uuid: g.numa_node for g in DGX.gpus}
NODE_OF_CPU = {c.id: c.numa for c in DGX.cpus}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def dgx_steps(capsys, config: str = SINGLE, pods: str = DGX_PODS) -> list[dict]:
    rc, out, err = run(capsys, "simulate", "--preset", "dgx-h100", "--config", config,
                       "--pods", pods, "--json")
    assert (rc, err) == (0, "")
    return json.loads(out)["steps"]


def steps_of(steps: list[dict], pod: str) -> list[dict]:
    """The admission steps of ``pod``."""
    return [s for s in steps if s["pod"] == pod and s["action"] == "admit"]


def nodes_of(placement: dict) -> tuple[set, set, set]:
    cpus = {NODE_OF_CPU[c] for c in parse_list(placement["cpus"])}
    gpus = {GPU_NODE[g] for g in placement["devices"].get("nvidia.com/gpu", [])}
    return cpus, gpus, set(parse_list(placement["mems"]))


# --- decisions --------------------------------------------------------------------------


def test_training_pod_gets_cpus_gpus_and_memory_on_node_0(capsys):
    (step,) = steps_of(dgx_steps(capsys), "ml/train")
    (placement,) = step["decision"]["placements"]
    assert placement["exclusive"] is True
    assert len(parse_list(placement["cpus"])) == 8
    assert len(placement["devices"]["nvidia.com/gpu"]) == 2
    # Both nodes fit; the kubelet's tie-break (the lower mask) picks node 0.
    assert nodes_of(placement) == ({0}, {0}, {0})
    assert placement["hint"] == {"affinity": [0], "preferred": True}


def test_too_big_pod_is_refused_naming_cpu(capsys):
    (step,) = steps_of(dgx_steps(capsys), "default/too-big")
    decision = step["decision"]
    assert decision["admitted"] is False and decision["placements"] == []
    rejection = decision["rejection"]
    assert rejection["reason"] == "TopologyAffinityError"
    assert rejection["policy"] == "single-numa-node"
    assert "cpu: asked 128 exclusive CPUs" in rejection["message"]


def test_pod_that_did_not_fit_fits_after_the_deletion(capsys):
    steps = dgx_steps(capsys)
    first, second = steps_of(steps, "ml/finetune")
    (deletion,) = [s for s in steps if s["action"] == "delete"]
    assert first["step"] < deletion["step"] < second["step"]
    assert deletion["pod"] == "ml/train" and deletion["message"] == "released"
    assert first["decision"]["admitted"] is False
    assert "nvidia.com/gpu: asked 4 devices" in first["decision"]["rejection"]["message"]
    assert second["decision"]["admitted"] is True
    (placement,) = second["decision"]["placements"]
    assert nodes_of(placement) == ({0}, {0}, {0})
    # The two GPUs the training pod gave back are among the four it gets now.
    (train,) = steps_of(steps, "ml/train")[0]["decision"]["placements"]
    assert set(train["devices"]["nvidia.com/gpu"]) <= set(placement["devices"]["nvidia.com/gpu"])


def test_four_gpu_pod_goes_where_four_gpus_are_free(capsys):
    (step,) = steps_of(dgx_steps(capsys), "ml/infer")
    (placement,) = step["decision"]["placements"]
    assert nodes_of(placement) == ({1}, {1}, {1})


def test_shared_cpusets_as_decided_and_at_the_end(capsys):
    rc, out, _ = run(capsys, "simulate", "--preset", "dgx-h100", "--config", SINGLE,
                     "--pods", DGX_PODS, "--json")
    result = json.loads(out)
    steps = result["steps"]
    (web,) = steps_of(steps, "default/web")[0]["decision"]["placements"]
    assert web["exclusive"] is False
    etl = steps_of(steps, "default/etl")[0]["decision"]["placements"]
    etl_cpus = set().union(*(parse_list(p["cpus"]) for p in etl))
    # web's cpuset is the pool at its step: it still holds CPUs etl took later.
    assert etl_cpus <= parse_list(web["cpus"])
    final = parse_list(result["shared_pool"])
    assert not etl_cpus & final
    shared = {(c["pod"], c["container"]): c["cpus"] for c in result["shared_containers"]}
    assert shared == {("default/web", "nginx"): result["shared_pool"],
                      ("default/batch", "cron"): result["shared_pool"]}
    node0 = next(n for n in result["nodes"] if n["node"] == "0")
    assert node0["free_nvidia.com/gpu"] == "0 of 4"


def test_text_table_has_one_row_per_container_and_the_summaries(capsys):
    rc, out, err = run(capsys, "simulate", "--preset", "dgx-h100", "--config", SINGLE,
                       "--pods", DGX_PODS)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["STEP", "POD", "CONTAINER", "QOS", "RESULT"]
    etl_rows = [line for line in lines if " default/etl " in f" {line} "]
    assert [r.split()[2] for r in etl_rows] == ["fetch", "log-shipper", "transform"]
    (refused,) = [line for line in lines if "default/too-big" in line]
    assert " refused " in refused and "asked 128 exclusive CPUs" in refused
    (train,) = [line for line in lines if " ml/train " in line and "admitted" in line]
    assert "nvidia.com/gpu=GPU0,GPU1" in train and "{0}*" in train
    assert any(line.startswith("shared pool: ") for line in lines)
    assert any(line.split()[:3] == ["default/web", "nginx", out.split("shared pool: ")[1].split()[0]]
               for line in (x.strip() for x in lines))
    assert any(line.split()[:2] == ["NODE", "CPUS"] for line in lines)


@pytest.mark.parametrize("preset, config, pods", [
    ("dgx-h100", SINGLE, DGX_PODS),
    ("dgx-h100", BEST_EFFORT, DGX_PODS),
    ("amd-epyc-2s-nps4", BEST_EFFORT, EPYC_PODS),
    ("amd-epyc-2s-nps4", SINGLE, EPYC_PODS),
])
def test_every_example_runs_cleanly(capsys, preset, config, pods):
    for extra in ([], ["--json"]):
        rc, out, err = run(capsys, "simulate", "--preset", preset, "--config", config,
                           "--pods", pods, *extra)
        assert (rc, err) == (0, ""), err
    result = json.loads(out)
    assert result["errors"] == 0
    assert {s["action"] for s in result["steps"]} == {"admit", "delete"}


def test_epyc_example_reads_lists_and_prefers_close_nodes(capsys):
    rc, out, _ = run(capsys, "simulate", "--preset", "amd-epyc-2s-nps4", "--config",
                     BEST_EFFORT, "--pods", EPYC_PODS, "--json")
    steps = json.loads(out)["steps"]
    assert [s["where"] for s in steps[:6]] == ["document 1 item 1", "document 1 item 2",
                                               "document 1 item 3", "document 1 item 4",
                                               "document 2 item 1", "document 2 item 2"]
    (wide,) = steps_of(steps, "default/wide")[0]["decision"]["placements"]
    assert wide["hint"] == {"affinity": [4, 5], "preferred": True}
    (fill4,) = steps_of(steps, "default/fill-4")[0]["decision"]["placements"]
    (fill2,) = steps_of(steps, "default/fill-2")[0]["decision"]["placements"]
    assert fill4["cpus"] == fill2["cpus"]  # the deleted pod's node, freed


def test_subprocess_runs_the_module(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "nri_numa", "simulate", "--preset", "dgx-h100", "--config",
         SINGLE, "--pods", DGX_PODS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "ml/finetune" in done.stdout and "shared pool:" in done.stdout


# --- deletions and repeats --------------------------------------------------------------

POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  containers: [{{name: app, resources: {{limits: {{cpu: "{cpu}", memory: 1Gi}}}}}}]
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_delete_by_bare_name_means_default_namespace(tmp_path, capsys):
    pods = write(tmp_path, "p.yaml", POD.format(name="a", cpu=100) + "---\ndelete: a\n---\n"
                 + POD.format(name="b", cpu=100))
    steps = dgx_steps(capsys, pods=pods)
    assert [s["action"] for s in steps] == ["admit", "delete", "admit"]
    assert steps[1]["pod"] == "default/a"
    assert steps[2]["decision"]["admitted"] is True


def test_a_pod_admitted_twice_and_an_unknown_deletion_are_errors(tmp_path, capsys):
    pods = write(tmp_path, "p.yaml", POD.format(name="a", cpu=2) + "---\n"
                 + POD.format(name="a", cpu=2) + "---\ndelete: other/x\n")
    rc, out, err = run(capsys, "simulate", "--preset", "dgx-h100", "--config", SINGLE,
                       "--pods", pods)
    assert rc == 1
    assert err.splitlines() == [
        f"nri-numa: error: {pods} document 2: pod default/a is already admitted; delete it first",
        f"nri-numa: error: {pods} document 3: delete: no pod other/x earlier in the file"]


def test_deleting_a_refused_pod_is_fine(tmp_path, capsys):
    pods = write(tmp_path, "p.yaml", POD.format(name="a", cpu=500) + "---\ndelete: a\n")
    steps = dgx_steps(capsys, pods=pods)
    assert steps[1]["message"] == "was not admitted; nothing to release"


# --- bad input: one clear line, exit 1 --------------------------------------------------


def one_error(capsys, *argv: str) -> str:
    rc, _, err = run(capsys, *argv)
    assert rc == 1
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nri-numa: error: ")
    return lines[0]


def test_bad_yaml_names_the_file_and_line(tmp_path, capsys):
    pods = write(tmp_path, "bad.yaml", "kind: Pod\nmetadata: [unclosed\n")
    line = one_error(capsys, "simulate", "--preset", "dgx-h100", "--config", SINGLE, "--pods", pods)
    assert f"{pods}: not valid YAML: line " in line


def test_bad_manifest_names_document_and_field_and_the_rest_still_runs(tmp_path, capsys):
    bad = POD.format(name="broken", cpu="lots")
    pods = write(tmp_path, "p.yaml", POD.format(name="ok", cpu=2) + "---\n" + bad + "---\n"
                 + POD.format(name="after", cpu=2))
    rc, out, err = run(capsys, "simulate", "--preset", "dgx-h100", "--config", SINGLE,
                       "--pods", pods, "--json")
    assert rc == 1
    (line,) = err.splitlines()
    assert line.startswith(f"nri-numa: error: {pods} document 2: pod default/broken: "
                           "spec.containers[0].resources.limits.cpu: ")
    steps = json.loads(out)["steps"]
    assert [s["action"] for s in steps] == ["admit", "error", "admit"]
    assert steps[2]["decision"]["admitted"] is True


def test_unknown_preset(capsys):
    line = one_error(capsys, "simulate", "--preset", "nope", "--config", SINGLE, "--pods", DGX_PODS)
    assert "unknown preset 'nope'" in line


@pytest.mark.parametrize("which", ["--config", "--pods"])
def test_missing_file(tmp_path, capsys, which):
    files = {"--config": SINGLE, "--pods": DGX_PODS, which: str(tmp_path / "absent.yaml")}
    line = one_error(capsys, "simulate", "--preset", "dgx-h100", *[x for kv in files.items() for x in kv])
    assert f"{tmp_path / 'absent.yaml'}: No such file or directory" in line


def test_bad_config_lists_every_problem_on_one_line(tmp_path, capsys):
    config = write(tmp_path, "c.yaml", "topologyManagerPolicy: single\ncpuManagerPolicy: statc\n")
    line = one_error(capsys, "simulate", "--preset", "dgx-h100", "--config", config, "--pods", DGX_PODS)
    assert line.startswith(f"nri-numa: error: {config}: topologyManagerPolicy: ")
    assert "cpuManagerPolicy: 'statc'" in line


def test_config_that_does_not_fit_the_machine(tmp_path, capsys):
    config = write(tmp_path, "c.json", json.dumps({"cpuManagerPolicy": "static",
                                                  "reservedSystemCPUs": "0,9999"}))
    line = one_error(capsys, "simulate", "--preset", "dgx-h100", "--config", config, "--pods", DGX_PODS)
    assert f"{config}: does not fit this machine: reservedSystemCPUs" in line


def test_pods_file_without_pods(tmp_path, capsys):
    pods = write(tmp_path, "p.yaml", "---\n---\n")
    line = one_error(capsys, "simulate", "--preset", "dgx-h100", "--config", SINGLE, "--pods", pods)
    assert line.endswith(f"{pods}: holds no pods")


# --- explain ----------------------------------------------------------------------------


def test_explain_refused_pod_names_the_resource(capsys):
    rc, out, err = run(capsys, "explain", "--preset", "dgx-h100", "--config", SINGLE,
                       "--pods", DGX_PODS, "--pod", "ml/finetune")
    assert (rc, err) == (0, "")
    assert out.startswith("pod ml/finetune (document 8): Guaranteed, policy single-numa-node")
    assert "nvidia.com/gpu  none: no NUMA node can hold it" in out
    assert "and there is none: refused" in out
    assert "decision: refused: TopologyAffinityError" in out


def test_explain_json_for_a_bare_name(capsys):
    rc, out, _ = run(capsys, "explain", "--preset", "amd-epyc-2s-nps4", "--config", BEST_EFFORT,
                     "--pods", EPYC_PODS, "--pod", "wide", "--json")
    assert rc == 0
    result = json.loads(out)
    assert result["pod"] == "default/wide" and result["entries_before"] == 4
    (merge,) = result["merges"]
    assert merge["merged"] == {"affinity": [4, 5], "preferred": True}
    assert merge["why"]["rule"] == "lower-mask"
    assert "{0,4} is lower still but farther" in merge["why"]["reason"]


def test_explain_unknown_pod_lists_the_pods(capsys):
    line = one_error(capsys, "explain", "--preset", "dgx-h100", "--config", SINGLE,
                     "--pods", DGX_PODS, "--pod", "nosuch")
    assert "no pod default/nosuch in" in line and "ml/train, default/db" in line


# --- reading entries --------------------------------------------------------------------


@pytest.mark.parametrize("raw, error", [
    ({"delete": "a/b/c"}, 'delete: expected "namespace/name" or "name", not \'a/b/c\''),
    ({"delete": ""}, 'delete: expected "namespace/name" or "name", not \'\''),
    ({"delete": 5}, 'delete: expected "namespace/name" or "name", not 5'),
    ({"delete": "/x"}, 'delete: expected "namespace/name" or "name", not \'/x\''),
    ("just text", "pod: must be a map, not str"),
    ({"kind": "Deployment"}, "kind: expected Pod, not 'Deployment'"),
    # A value of an unexpected kind deep in the manifest is an error, not a crash.
    ({"metadata": {"name": "p"}, "spec": {"initContainers": [{"name": "i", "restartPolicy": []}],
                                         "containers": [{"name": "c"}]}}, None),
])
def test_bad_entries_become_error_steps(raw, error):
    entry = parse_entry(raw, "document 9")
    assert isinstance(entry, BadEntry) and entry.where == "document 9"
    if error is not None:
        assert entry.error == error


def test_list_documents(tmp_path):
    pods = write(tmp_path, "p.yaml", "kind: List\nitems:\n- {delete: x}\n- {delete: ns/y}\n"
                 "---\nkind: List\nitems: 3\n---\n- {delete: z}\n")
    entries = load_pods(Path(pods))
    assert entries == [DeleteEntry("document 1 item 1", "default/x"),
                       DeleteEntry("document 1 item 2", "ns/y"),
                       BadEntry("document 2", "kind: List needs items: a list of pods"),
                       DeleteEntry("document 3 item 1", "default/z")]


def test_without_the_memory_manager_memory_nodes_are_left_alone(tmp_path, capsys):
    """The issue's reproduction: 400Gi on a node of 256 GiB would be OOM-killed if its memory were
    pinned to its CPUs' node; like the kubelet, nothing pins it without the Memory Manager."""
    config = tmp_path / "config.yaml"
    config.write_text('cpuManagerPolicy: static\nreservedSystemCPUs: "0"\n'
                      "memoryManagerPolicy: None\ntopologyManagerPolicy: none\n")
    pods = tmp_path / "pods.yaml"
    pods.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: big}\nspec:\n  containers:\n"
                    "  - name: c\n    resources:\n      requests: {cpu: '2', memory: 400Gi}\n"
                    "      limits: {cpu: '2', memory: 400Gi}\n")
    assert main(["simulate", "--preset", "pcie-4gpu", "--config", str(config), "--pods",
                 str(pods), "--json"]) == 0
    [placement] = json.loads(capsys.readouterr().out)["steps"][0]["decision"]["placements"]
    assert placement["exclusive"] and len(parse_list(placement["cpus"])) == 2
    assert placement["mems"] is None
