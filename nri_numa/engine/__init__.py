"""The placement engine: pure functions from topology, ledger snapshot and request to a decision."""

from nri_numa.engine.hints import Hint, MergeError
from nri_numa.engine.merge import merge_hints
from nri_numa.engine.policy.options import PolicyOptionError

__all__ = ["Hint", "MergeError", "PolicyOptionError", "merge_hints"]
