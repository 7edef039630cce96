"""UpdateContainer with new resources: an in-place resize through the ledger.

The engine decides (nri_numa.engine.resize); this turns the runtime's container into the
before and after requests, commits, and keeps the plugin's record in step. A refused resize
raises PluginError: the runtime fails the update (the CRI caller, the kubelet, sees the line)
and neither the ledger nor the record changes. A refusal here never counts towards an
eviction: the container keeps running as it was.
"""

from __future__ import annotations


from dataclasses import replace

from nri_numa.engine.request import RequestError
from nri_numa.nri import decision_log, translate
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import PluginError
from nri_numa.runtime import RuntimeContainer, container_request, pod_qos, pod_request
from nri_numa.state.plugin_records import ON_THE_POOL, ContainerRecord, Records


def apply(records: Records, record: ContainerRecord, container: RuntimeContainer
          ) -> tuple[ContainerRecord, list[api.ContainerUpdate]]:
    """The container's record after the resize, and the updates other containers need (the
    shared pool grew or shrank); unchanged when the request's CPU and memory are the same."""
    before = record.request
    pod = records.pods.get(record.sandbox_id)
    try:
        fresh = container_request(container, pod_qos(container.pod), {})
    except (RequestError, ValueError) as e:
        raise PluginError(f"nri-numa: container {before.name}: cannot read the resize: {e}") from None
    # Only CPU and memory change in place; devices and their hints stay as admitted.
    after = replace(before, cpu_request=fresh.cpu_request, cpu_limit=fresh.cpu_limit,
                    memory_request=fresh.memory_request, memory_limit=fresh.memory_limit,
                    hugepages_requests=fresh.hugepages_requests,
                    hugepages_limits=fresh.hugepages_limits)
    if after == before:
        return record, []
    known = records.known_requests(record.sandbox_id, before.name)
    pod_req = pod_request(container.pod, [*known, after])
    try:
        result = records.ledger.resize(pod_req, before, after)
    except ValueError as e:  # the ledger lost the container: nothing to resize
        raise PluginError(f"nri-numa: container {before.name}: cannot resize: {e}") from None
    rejection = result.decision.rejection
    if rejection is not None:
        if pod is not None:
            decision_log.refused(pod, before.name, record.id, rejection.policy, rejection.reason,
                                 rejection.resource, f"resize {rejection.message}")
        raise PluginError(f"nri-numa: resize refused: {rejection.message}")
    placement = result.decision.placements[0]
    resized = ContainerRecord(record.id, record.sandbox_id, record.pod_uid, after,
                              placement.cpus if placement.exclusive else ON_THE_POOL,
                              placement.exclusive, placement.mems, record.in_ledger)
    records.containers[record.id] = resized
    if pod is not None:
        decision_log.placed(pod, result.decision.policy, placement, record.id, "resized")
    return resized, translate.shared_updates(records, skip=record.id)
