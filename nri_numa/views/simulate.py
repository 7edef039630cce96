"""``nri-numa simulate``: a config file and a pods file, run in order through one ledger.

The pods file is YAML with one or more documents. A document is a Pod manifest, a list of
entries, or ``kind: List`` with ``items``; an entry ``{delete: "namespace/name"}`` (or
``{delete: "name"}`` for the ``default`` namespace) releases a pod admitted earlier. A bad entry
becomes an error step and the run goes on, so one typo does not hide what the other pods get;
a file that cannot be read or parsed at all stops everything (``InputError``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nri_numa.agent.inputs import InputFileError, read_config_file, read_text, yaml_documents
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Decision
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.engine.request import PodRequest, QosClass, RequestError
from nri_numa.safeio.bounds import MAX_NAME, clip, join_problems, one_line, quote
from nri_numa.state.ledger import Ledger
from nri_numa.topology.model import Topology


class InputError(ValueError):
    """A config or pods file that cannot be used at all; the message names the file."""


MAX_ENTRY_ERROR = 300  # characters of a bad entry's error, a row of simulate's table


# --- reading the files ------------------------------------------------------------------


def read_yaml_documents(path: Path, what: str) -> list[Any]:
    """Every document of a YAML (or JSON) file; InputError naming the file and the line."""
    try:
        return yaml_documents(read_text(path, what), str(path))
    except InputFileError as e:
        raise InputError(str(e)) from None


def load_config(path: Path) -> EngineConfig:
    try:
        return read_config_file(path)
    except InputFileError as e:
        raise InputError(str(e)) from None


def build_context(topology: Topology, config: EngineConfig, config_path: Path) -> EngineContext:
    try:
        return EngineContext.build(topology, config)
    except ConfigError as e:
        raise InputError(f"{config_path}: does not fit this machine: "
                         f"{join_problems(e.problems)}") from None


@dataclass(frozen=True, slots=True)
class PodEntry:
    where: str  # "document 2", "document 3 item 1": how a person finds it in the file
    pod: PodRequest

    @property
    def key(self) -> str:
        return f"{self.pod.namespace}/{self.pod.name}"


@dataclass(frozen=True, slots=True)
class DeleteEntry:
    where: str
    key: str  # namespace/name


@dataclass(frozen=True, slots=True)
class BadEntry:
    where: str
    error: str


Entry = PodEntry | DeleteEntry | BadEntry


def load_pods(path: Path) -> list[Entry]:
    entries: list[Entry] = []
    for number, document in enumerate(read_yaml_documents(path, "pods"), start=1):
        if document is not None:  # an empty document, e.g. after a trailing ---
            entries += _document_entries(document, f"document {number}")
    if not entries:
        raise InputError(f"{path}: holds no pods")
    return entries


def _document_entries(document: Any, where: str) -> list[Entry]:
    if isinstance(document, Mapping) and document.get("kind") == "List":
        items = document.get("items")
        if not isinstance(items, list):
            return [BadEntry(where, "kind: List needs items: a list of pods")]
        document = items
    if isinstance(document, list):
        return [parse_entry(item, f"{where} item {i}") for i, item in enumerate(document, start=1)]
    return [parse_entry(document, where)]


def parse_entry(raw: Any, where: str) -> Entry:
    """One pod manifest or deletion; a bad one becomes a BadEntry with the engine's message."""
    if isinstance(raw, Mapping) and "delete" in raw:
        return _delete_entry(raw, where)
    # Each error is one line of bounded length: it becomes a row of simulate's table.
    try:
        return PodEntry(where, pod_from_manifest(raw))
    except RequestError as e:
        return BadEntry(where, one_line(str(e), MAX_ENTRY_ERROR))
    except (TypeError, ValueError) as e:  # a value of a kind the reader did not expect
        return BadEntry(where, one_line(f"cannot read this pod: {e}", MAX_ENTRY_ERROR))


def _delete_entry(raw: Mapping[str, Any], where: str) -> Entry:
    target = raw["delete"]
    if set(raw) != {"delete"}:
        extra = clip(", ".join(sorted(str(k) for k in raw if k != "delete")), 80)
        return BadEntry(where, f"a deletion has only the key delete, not {extra}")
    # A pod's name and namespace: printable, as the manifest reader checks them.
    key = pod_key(target) if isinstance(target, str) and target.isprintable() else ""
    namespace, _, name = key.partition("/")
    if not namespace or not name or "/" in name or max(len(namespace), len(name)) > MAX_NAME:
        return BadEntry(where, f'delete: expected "namespace/name" or "name", not '
                               f"{quote(target)}")
    return DeleteEntry(where, key)


def pod_key(text: str) -> str:
    """``name`` → ``default/name``; ``namespace/name`` stays as it is."""
    return text if "/" in text else f"default/{text}"


# --- running them -----------------------------------------------------------------------


class StepKind(StrEnum):
    ADMIT = "admit"
    DELETE = "delete"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Step:
    number: int
    where: str
    kind: StepKind
    pod: str = ""  # namespace/name; empty when the entry could not be read
    decision: Decision | None = None
    qos: QosClass | None = None
    message: str = ""  # the error, or what a deletion did

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.number, "where": self.where, "action": str(self.kind),
                               "pod": self.pod or None}
        if self.decision is not None:
            out["qos"] = str(self.qos)
            out["decision"] = self.decision.to_dict()
        if self.message:
            out["error" if self.kind is StepKind.ERROR else "message"] = self.message
        return out


@dataclass(frozen=True, slots=True)
class Simulation:
    ctx: EngineContext
    steps: tuple[Step, ...]
    allocations: Allocations  # the ledger after the last step
    names: Mapping[str, str] = field(default_factory=dict)  # uid → namespace/name, admitted pods

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", MappingProxyType(dict(self.names)))

    @property
    def errors(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind is StepKind.ERROR)

    def shared_containers(self) -> list[tuple[str, str]]:
        """(namespace/name, container) of every admitted container in the shared pool now."""
        return [(self.names.get(uid, uid), name) for uid, pod in self.allocations.pods.items()
                for name, c in pod.containers.items() if not c.exclusive_cpus]


class Simulator:
    """A ledger and what it has admitted, fed one entry at a time."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ledger = Ledger(ctx)
        self.running: dict[str, str] = {}  # namespace/name → uid, while admitted
        self.seen: set[str] = set()  # every pod key met so far, admitted or not
        self.steps: list[Step] = []

    def apply(self, entry: Entry) -> None:
        number = len(self.steps) + 1
        if isinstance(entry, PodEntry):
            step = self._admit(number, entry)
        elif isinstance(entry, DeleteEntry):
            step = self._delete(number, entry)
        else:
            step = Step(number, entry.where, StepKind.ERROR, message=entry.error)
        self.steps.append(step)

    def _conflict(self, entry: PodEntry) -> str | None:
        """Why ``entry`` cannot be admitted now as a new pod, or None."""
        if entry.key in self.running:
            return f"pod {entry.key} is already admitted; delete it first"
        if entry.pod.uid in self.running.values():
            return f"uid {entry.pod.uid} belongs to a pod that is already admitted"
        return None

    def result(self) -> Simulation:
        names = {uid: key for key, uid in self.running.items()}
        return Simulation(self.ledger.ctx, tuple(self.steps), self.ledger.allocations, names)

    def _admit(self, number: int, entry: PodEntry) -> Step:
        problem = self._conflict(entry)
        if problem:
            return Step(number, entry.where, StepKind.ERROR, entry.key, message=problem)
        self.seen.add(entry.key)
        decision = self.ledger.admit(entry.pod).decision
        if decision.admitted:
            self.running[entry.key] = entry.pod.uid
        return Step(number, entry.where, StepKind.ADMIT, entry.key, decision, entry.pod.qos)

    def _delete(self, number: int, entry: DeleteEntry) -> Step:
        uid = self.running.pop(entry.key, None)
        if uid is not None:
            self.ledger.release(uid)
            return Step(number, entry.where, StepKind.DELETE, entry.key, message="released")
        if entry.key in self.seen:
            return Step(number, entry.where, StepKind.DELETE, entry.key,
                        message="was not admitted; nothing to release")
        return Step(number, entry.where, StepKind.ERROR, entry.key,
                    message=f"delete: no pod {entry.key} earlier in the file")


def simulate(ctx: EngineContext, entries: Iterable[Entry]) -> Simulation:
    simulator = Simulator(ctx)
    for entry in entries:
        simulator.apply(entry)
    return simulator.result()


def known_pods(entries: Sequence[Entry]) -> list[str]:
    return list(dict.fromkeys(e.key for e in entries if isinstance(e, PodEntry)))
