"""What each hook stage does, as one transaction on the shared ledger.

* **createRuntime** (alias prestart): the container's cgroup exists and its init waits in it,
  before the workload execs. Place the container (or claim what precreate placed), write its
  ``cpuset.mems``/``cpuset.cpus`` and read them back, move the other shared containers onto the
  shrunken pool, save. Any failure raises: the runtime then destroys the container.
* **poststop**: release by container id (the cgroup is already gone, there is no pid), save,
  then give the shared containers the grown pool. Unknown ids are fine: poststop may run twice,
  or after a create that failed.
* **precreate** (podman): place from the spec alone and return the spec with the placement in it.

Every stage first drops what dead containers held. All of it happens under the lock: a cgroup
written after unlocking could put a container back on a CPU another hook has just given away.
The hook daemon runs the same stages with what it kept from its last runs (``HookEnv.cache``):
the ledger it saved, unless the checkpoint changed since, and the cgroups it found.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nri_numa.engine.annotations import AnnotationError
from nri_numa.hook.cgroup import (CgroupError, CgroupFs, ContainerCgroup, ProcessGone, locate,
                                  write_cpuset)
from nri_numa.hook.machine import Machine
from nri_numa.hook.oci import OciState
from nri_numa.hook.procs import ProcessId, is_running, process_id
from nri_numa.hook.shared_ledger import Move, ProcessRecord, Refused, SharedLedger, StateError
from nri_numa.runtime.container import RuntimeContainer, RuntimeInputError
from nri_numa.runtime.device_locator import DeviceLocator
from nri_numa.runtime.oci_spec import is_sandbox, runtime_container
from nri_numa.runtime.to_request import asked_devices
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore, LockBusy
from nri_numa.topology.cpulist import format_list

if TYPE_CHECKING:
    from nri_numa.hook.daemon_cache import DaemonCache

log = logging.getLogger("nri_numa.hook")


class HookError(Exception):
    """The stage failed or refused; the message is the one line the runtime shows."""


class LockTimeout(HookError):
    """The state lock stayed held until the run had to give up to end within its timeout."""


@dataclass(frozen=True, slots=True)
class HookEnv:
    """Everything a stage works with besides its input."""

    machine: Machine
    store: CheckpointStore
    fs: CgroupFs = field(default_factory=CgroupFs)
    lock_timeout: float = 3.0
    clock: Callable[[], float] = time.time
    dev_root: Path = Path("/dev")  # the host's device nodes, for the devices precreate gives
    # The hook daemon's ledger and cgroups from its last runs (nri_numa.hook.daemon_cache); a hook
    # process has none and reads the checkpoint and /proc every time.
    cache: DaemonCache | None = None


def create_runtime(env: HookEnv, state: OciState, spec: dict[str, Any]) -> str:
    """Place the container and pin its cgroup; returns what was done, for the log."""
    if state.pid is None:
        raise HookError(f"container {state.id}: the OCI state has no pid; run this hook at "
                        "createRuntime (or prestart)")
    container = _container(spec, state.id, state.annotations)
    if is_sandbox(container.annotations):
        return f"container {state.id} is a pod sandbox: left alone"
    devices = _asked_devices(container)
    ident = process_id(env.fs.proc, state.pid)
    if ident is None:
        raise HookError(f"container {state.id}: its process {state.pid} is gone")
    cgroup = _locate(env, state.pid, state.id)
    if env.cache is not None:
        env.cache.cgroups.put(env.fs, ident, cgroup)
    with _transaction(env) as book:
        record = book.record(state.id)
        process = book.process(state.id)
        if record is not None and process is not None and not process.pending \
                and ProcessId(process.pid, process.start) != ident:
            raise HookError(f"container id {state.id} is already placed for running process "
                            f"{process.pid}")
        if record is None:
            if devices:
                raise Refused(f"container {state.id} asks for devices ({_names(devices)}), which "
                              "a createRuntime hook cannot add: the container's devices are "
                              "fixed by then. Use podman's precreate hook, or give the devices "
                              "with --device or CDI and drop the annotation (CPUs follow the "
                              "devices a container has; docs/devices.md)")
            placement = book.admit(container)
            cpus, mems, exclusive = placement.cpus, placement.mems, placement.exclusive
            how = "placed"
        else:  # placed by precreate, or this hook runs a second time (prestart + createRuntime)
            cpus, mems, exclusive = book.cpuset_of(record), record.mems, record.exclusive
            how = "claimed" if process is not None and process.pending else "kept"
        book.attach(state.id, ProcessRecord(ident.pid, ident.start, cgroup.path, env.clock()))
        try:
            write_cpuset(cgroup, cpus, mems)
        except CgroupError as e:
            raise HookError(f"container {state.id}: {e}") from None
        _apply_and_save(env, book, book.shared_moves(skip=[state.id]))
    return (f"{how} container {state.id}: cpus {format_list(cpus)} "
            f"({'exclusive' if exclusive else 'shared'}), mems "
            f"{'unchanged' if mems is None else format_list(mems)}, cgroup {cgroup.path}")


def poststop(env: HookEnv, state: OciState) -> str:
    with _transaction(env, keep=state.id) as book:
        released = book.release(state.id)
        moves = book.shared_moves()
        _save(env, book)
        # Growing the pool is safe to do after saving: a container left on fewer CPUs than it
        # may use is only slower.
        _apply_moves(env, book, moves, [])
    return f"released container {state.id}" if released else f"container {state.id}: nothing held"


def precreate(env: HookEnv, spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The spec with the placement in it, and what was done."""
    # Only precreate gives devices and edits a spec: what does so (device nodes, CDI) is loaded
    # here, not by every createRuntime and poststop process.
    from nri_numa.hook.precreate import SpecError, container_id, has_claiming_hook, placed_spec
    from nri_numa.runtime.device_grant import DeviceGranter, GrantError

    try:
        cid = container_id(spec)
    except SpecError as e:
        raise HookError(str(e)) from None
    container = _container(spec, cid, None)
    if is_sandbox(container.annotations):
        return spec, f"container {cid} is a pod sandbox: left alone"
    if not has_claiming_hook(spec):
        raise HookError(f"container {cid}: the spec has no `nri-numa hook createRuntime` hook, "
                        "which claims what precreate places; install it next to the precreate "
                        "hook (hooks/nri-numa-createruntime.json)")
    devices = _devices(env, container)
    with _transaction(env) as book:
        book.release(cid)  # a leftover of an earlier start of this container
        placement = book.admit(container, devices)
        book.attach(cid, ProcessRecord(None, None, None, env.clock()))
        try:
            grant = DeviceGranter(env.machine.topology, env.dev_root).grant(placement.devices)
            out = placed_spec(spec, placement, grant)
        except (SpecError, GrantError) as e:
            raise HookError(f"container {cid}: {e}") from None
        _apply_and_save(env, book, book.shared_moves(skip=[cid]))
    devices_text = "".join(f", {k} {','.join(v)}" for k, v in placement.devices.items() if v)
    return out, (f"precreate placed container {cid}: cpus {format_list(placement.cpus)} "
                 f"({'exclusive' if placement.exclusive else 'shared'}){devices_text}")


# --- the transaction ---------------------------------------------------------------------


@contextmanager
def _transaction(env: HookEnv, keep: str | None = None) -> Iterator[SharedLedger]:
    """Lock, load, drop the dead (but ``keep``, which the stage releases itself), hand the
    ledger to the stage, unlock. The stage saves."""
    try:
        env.store.lock(timeout=env.lock_timeout)
    except LockBusy as e:
        raise LockTimeout(str(e)) from None
    except CheckpointError as e:
        raise HookError(str(e)) from None
    try:
        book = None if env.cache is None else env.cache.ledger.take(env.store.path,
                                                                     env.machine.ctx)
        if book is None:
            book = _load(env)
        gone = book.collect_garbage(lambda p: _running(env, p), env.clock(),
                                    keep=() if keep is None else (keep,))
        for cid in gone:
            log.info("container %s is gone: released what it held", cid)
        try:
            yield book
        except Refused as e:
            raise HookError(str(e)) from None
    finally:
        env.store.unlock()


def _load(env: HookEnv) -> SharedLedger:
    try:
        payload = env.store.load()
    except CheckpointError as e:
        raise HookError(str(e)) from None
    locator = DeviceLocator(env.machine.topology)
    try:
        return SharedLedger.load(env.machine.ctx, locator, payload)
    except StateError as e:
        raise HookError(str(e)) from None


def _apply_and_save(env: HookEnv, book: SharedLedger, moves: list[Move]) -> None:
    """Shrink the shared containers, then save; put them back if anything fails (the timer
    included)."""
    done: list[tuple[ContainerCgroup, frozenset[int]]] = []
    try:
        _apply_moves(env, book, moves, done)
        _save(env, book)
    except BaseException:
        _undo(done)
        raise


def _apply_moves(env: HookEnv, book: SharedLedger, moves: list[Move],
                 done: list[tuple[ContainerCgroup, frozenset[int]]]) -> None:
    """Write each moved container's cpuset, noting in ``done`` what it was before. A failure is
    fatal only where the container would stay on CPUs that are no longer shared."""
    for move in moves:
        process = book.process(move.id)
        # The daemon writes where it found the cgroup before: a container gone since this
        # transaction dropped the dead has no cgroup left to write (found again, it is gone).
        if process is None or process.pending \
                or (env.cache is None and not _running(env, process)):
            continue  # not created yet (precreate), or gone: nothing to write
        try:
            cgroup = _write_moved(env, ProcessId(process.pid, process.start), move.new)
        except ProcessGone:
            continue
        except CgroupError as e:
            if not move.must_leave:
                log.warning("container %s not moved to the shared pool %s: %s", move.id,
                            format_list(move.new), e)
                continue
            raise HookError(f"cannot move container {move.id} off CPUs "
                            f"{format_list(move.must_leave)}, which are no longer shared: {e}") \
                from None
        done.append((cgroup, move.old))


def _write_moved(env: HookEnv, process: ProcessId, cpus: frozenset[int]) -> ContainerCgroup:
    """Write a moved container's cpuset where its cgroup is: as the daemon remembers it, or as
    its process says (found again when the remembered one cannot be written)."""
    kept = None if env.cache is None else env.cache.cgroups.get(env.fs, process)
    if kept is not None:
        try:
            write_cpuset(kept, cpus, None)
            return kept
        except CgroupError:
            env.cache.cgroups.forget(process)  # type: ignore[union-attr]
    cgroup = locate(env.fs, process.pid)
    write_cpuset(cgroup, cpus, None)
    if env.cache is not None:
        env.cache.cgroups.put(env.fs, process, cgroup)
    return cgroup


def _undo(done: list[tuple[ContainerCgroup, frozenset[int]]]) -> None:
    for cgroup, old in reversed(done):
        try:
            write_cpuset(cgroup, old, None)
        except CgroupError as e:
            log.warning("could not put cgroup %s back on CPUs %s: %s", cgroup.path,
                        format_list(old), e)


def _save(env: HookEnv, book: SharedLedger) -> None:
    try:
        encoders = None if env.cache is None else env.cache.encoders
        env.store.save(book.to_payload() if encoders is None
                       else book.to_payload(encoders.ledger, encoders.records))
    except CheckpointError as e:
        raise HookError(f"cannot save the state, nothing changed: {e}") from None
    if env.cache is not None:
        env.cache.ledger.keep(env.store.path, book)
        env.cache.cgroups.keep_only(_placed_processes(book))


def _placed_processes(book: SharedLedger) -> set[ProcessId]:
    """Every placed container's process (those placed by precreate have none yet)."""
    found = set()
    for cid in book.containers:
        process = book.process(cid)
        if process is not None and process.pid is not None and process.start is not None:
            found.add(ProcessId(process.pid, process.start))
    return found


def _running(env: HookEnv, process: ProcessRecord) -> bool:
    return (process.pid is not None and process.start is not None
            and is_running(env.fs.proc, ProcessId(process.pid, process.start)))


# --- input helpers -----------------------------------------------------------------------


def _container(spec: dict[str, Any], cid: str, annotations: Any) -> RuntimeContainer:
    try:
        return runtime_container(spec, cid, annotations)
    except RuntimeInputError as e:
        raise HookError(f"container {cid}: bad spec: {e}") from None


def _asked_devices(container: RuntimeContainer) -> dict[str, int]:
    """Every device the container asks for by annotation (its own, its pod's), as written."""
    try:
        return asked_devices(container)
    except AnnotationError as e:
        raise HookError(str(e)) from None


def _devices(env: HookEnv, container: RuntimeContainer) -> dict[str, int]:
    """The container's own ``numa.nri.io/devices`` in the machine's resource names (the pod's
    ``numa.nri.io/devices.<container>`` travels with its annotations to the engine)."""
    from nri_numa.runtime.to_request import requested_devices

    ctx = env.machine.ctx
    try:
        return requested_devices(container, ctx.devices, ctx.device_classes)
    except AnnotationError as e:
        raise HookError(f"container {container.name}: {e}") from None


def _locate(env: HookEnv, pid: int, cid: str) -> ContainerCgroup:
    try:
        return locate(env.fs, pid)
    except CgroupError as e:
        raise HookError(f"container {cid}: {e}") from None


def _names(devices: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(devices.items()))
