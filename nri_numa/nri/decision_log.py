"""The plugin's decision lines: one per placement or refusal, in words for people and with the
facts as fields for the JSON format (nri_numa.agent.logs).

The fields are built only when the line is written: a plugin logging at warning or above pays
nothing for them. The words are made from the fields, so each CPU list is formatted once.
"""

from __future__ import annotations

import logging

from nri_numa.agent.logs import decision_fields, refusal_fields, repair_fields
from nri_numa.engine.decision import Placement, PreferredNuma
from nri_numa.runtime import stale_choice as stale_words
from nri_numa.state.plugin_records import ContainerRecord, PodRecord
from nri_numa.topology.cpulist import format_list

# The plugin's modules log as one logger, the name its lines have always carried (the JSON
# format writes it; operators filter on it).
log = logging.getLogger("nri_numa.nri.plugin")


def pod_name(pod: PodRecord) -> str:
    return f"{pod.namespace}/{pod.name}"


def describe(pod: PodRecord, container: str) -> str:
    return f"pod {pod_name(pod)} container {container}"


def placed(pod: PodRecord, policy: str, placement: Placement, container_id: str,
           event: str = "placed", pod_known_from: str | None = None) -> None:
    """``event``: "placed" for a new container, "adopted" for a running one taken over,
    "resized" after an in-place resize, "promoted" for a degraded one given its CPUs once room
    appeared (nri_numa.nri.promotion). ``pod_known_from``: under pod scope, where the whole
    pod was known from (nri_numa.nri.whole_pod: api, sandbox, seen)."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields = decision_fields(event, pod_name(pod), pod.uid, container_id, policy, placement)
    known = ""
    if pod_known_from is not None:
        from nri_numa.nri.whole_pod import SOURCE_WORDS

        fields["pod_known_from"] = pod_known_from
        known = f", pod known from {SOURCE_WORDS.get(pod_known_from, pod_known_from)}"
    hint = fields["hint"]
    devices = "; ".join(f"{name}={','.join(ids)}" for name, ids in fields["devices"].items())
    log.info("%s %s: policy %s, hint NUMA %s%s, cpus %s (%s), mems %s%s%s", event,
             describe(pod, placement.container), policy,
             "any" if hint is None else format_list(hint),
             " (preferred)" if fields["preferred"] else "", fields["cpus"],
             "exclusive" if placement.exclusive else "shared",
             "unchanged" if fields["mems"] is None else fields["mems"],
             f", devices {devices}" if devices else "", known, extra=fields)


def stale_choice(pod: PodRecord, container: str, chosen: PreferredNuma) -> None:
    """The scheduler's NUMA nodes did not hold the container: decided anew (issue 13 item 3)."""
    log.warning("%s: %s", describe(pod, container), stale_words(chosen))


def refused(pod: PodRecord, container: str, container_id: str, policy: str | None,
            reason: str, resource: str | None, text: str) -> None:
    """A container not admitted: ``text`` is what the runtime is told after the pod's name."""
    if not log.isEnabledFor(logging.INFO):
        return
    log.info("refused %s: %s", describe(pod, container), text, extra=refusal_fields(
        pod_name(pod), pod.uid, container, container_id, policy, reason, resource, text))


def repaired(pod: PodRecord | None, record: ContainerRecord, cpus: frozenset[int],
             why: str) -> None:
    """A started container's cpuset sent again (nri_numa.nri.start_check)."""
    if not log.isEnabledFor(logging.INFO):
        return
    name = pod_name(pod) if pod is not None else record.pod_uid
    fields = repair_fields(name, record.pod_uid, record.request.name, record.id, cpus,
                           record.mems, why)
    log.info("repaired pod %s container %s: cpus %s%s sent again (%s)", name,
             record.request.name, fields["cpus"],
             "" if fields["mems"] is None else f", mems {fields['mems']}", why, extra=fields)
