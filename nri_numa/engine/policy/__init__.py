"""The four Topology Manager policies, by their kubelet names.

A policy decides, from the slots (one hint list per resource, see ``merge.provider_slots``), the
hint to align to and whether the pod is admitted; ``merge`` is the shared HintMerger.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Protocol

from nri_numa.engine.hints import Hint, MergeError, MergeFn, Slot
from nri_numa.engine.policy.options import go_quote


class Policy(Protocol):
    name: str

    def decide(self, slots: Sequence[Slot], merge: MergeFn,
               default_affinity: frozenset[int]) -> tuple[Hint, bool]: ...


# Each policy's module and class, loaded when the policy is first asked for: a node runs one
# policy (and the pods' own), and a hook process pays for every module it imports.
_WHERE = {"none": ("none", "NonePolicy"), "best-effort": ("best_effort", "BestEffortPolicy"),
          "restricted": ("restricted", "RestrictedPolicy"),
          "single-numa-node": ("single_numa_node", "SingleNumaNodePolicy")}
POLICY_NAMES = tuple(_WHERE)
_LOADED: dict[str, Policy] = {}


def policy_by_name(name: str) -> Policy:
    policy = _LOADED.get(name) if isinstance(name, str) else None
    if policy is None:
        where = _WHERE.get(name) if isinstance(name, str) else None
        if where is None:
            raise MergeError(f"unknown policy: {go_quote(str(name))}")
        module, cls = where
        loaded = importlib.import_module(f"{__name__}.{module}")
        policy = _LOADED[name] = getattr(loaded, cls)()
    return policy
