"""The four Topology Manager policies, by their kubelet names.

A policy decides, from the slots (one hint list per resource, see ``merge.provider_slots``), the
hint to align to and whether the pod is admitted; ``merge`` is the shared HintMerger.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from nri_numa.engine.hints import Hint, MergeError, MergeFn, Slot
from nri_numa.engine.policy.best_effort import BestEffortPolicy
from nri_numa.engine.policy.none import NonePolicy
from nri_numa.engine.policy.options import go_quote
from nri_numa.engine.policy.restricted import RestrictedPolicy
from nri_numa.engine.policy.single_numa_node import SingleNumaNodePolicy


class Policy(Protocol):
    name: str

    def decide(self, slots: Sequence[Slot], merge: MergeFn,
               default_affinity: frozenset[int]) -> tuple[Hint, bool]: ...


POLICIES: dict[str, Policy] = {
    p.name: p for p in (NonePolicy(), BestEffortPolicy(), RestrictedPolicy(), SingleNumaNodePolicy())
}


def policy_by_name(name: str) -> Policy:
    policy = POLICIES.get(name) if isinstance(name, str) else None
    if policy is None:
        raise MergeError(f"unknown policy: {go_quote(str(name))}")
    return policy
