"""An explanation for people (text) and for programs (JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from nri_numa.engine.context import EngineContext
from nri_numa.engine.hints import Hint
from nri_numa.engine.merge import ProviderHints
from nri_numa.views.explain import SINGLE_NUMA_NODE, Explanation, MergeExplanation, Verdict
from nri_numa.views.simulate_render import align, device_names, format_hint, node_rows, placement_cells

# Past this many hints a list is shown as its count and its first few.
LONG_LIST = 8
SHOWN_OF_LONG = 6

POLICY_RULES: dict[str, Callable[[bool], str]] = {
    "none": lambda ok: "none admits every pod, without alignment",
    "best-effort": lambda ok: "best-effort admits whatever the merge gives",
    "restricted": lambda ok: "restricted admits only a preferred result"
                             + ("" if ok else ", and this one is not preferred"),
    SINGLE_NUMA_NODE: lambda ok: "single-numa-node admits only a preferred result on one NUMA "
                                 "node" + ("" if ok else ", and there is none"),
}


def compact_hints(hints: Sequence[Hint]) -> str:
    """``{0}* {1}* {0,1}``; a long list as its count and its first few."""
    if not hints:
        return "none: no NUMA node can hold it"
    shown = " ".join(format_hint(h) for h in hints[:SHOWN_OF_LONG if len(hints) > LONG_LIST else None])
    return f"{len(hints)} hints: {shown} …" if len(hints) > LONG_LIST else shown


def render_text(ex: Explanation, ctx: EngineContext) -> str:
    decision, pod = ex.admission.decision, ex.entry.pod
    lines = [f"pod {ex.entry.key} ({ex.entry.where}): {pod.qos}, policy {decision.policy}, "
             f"scope {decision.scope}", _before_line(ex), "",
             "machine before this pod:", *("  " + r for r in align(node_rows(ctx, ex.state)))]
    for merge in ex.merges:
        lines += ["", *_merge_lines(merge, decision.policy)]
    lines += ["", *_decision_lines(ex, ctx)]
    return "\n".join(lines)


def _before_line(ex: Explanation) -> str:
    if not ex.before:
        return "it is the first entry of the file: the machine is empty"
    pods = len(ex.state.pods)
    return (f"placed after the {len(ex.before)} entries before it, which leave {pods} "
            f"pod{'' if pods == 1 else 's'} admitted")


def _merge_lines(merge: MergeExplanation, policy: str) -> list[str]:
    step, verdict = merge.step, merge.verdict
    subject = "the whole pod (pod scope)" if step.subject == "pod" else f"container {step.subject}"
    rows = [("PROVIDER", "RESOURCE", "HINTS (* = preferred)")]
    rows += [row for provider, hints in step.hints for row in _hint_rows(provider, hints)]
    lines = [f"merge for {subject}", *("  " + r for r in align(rows)),
             f"  merged: {format_hint(step.merged)}",
             f"  why: {verdict.reason}"]
    if verdict.runner_up is not None:
        lines.append(f"  runner-up: {format_hint(verdict.runner_up)}")
    verdict_word = "admitted" if step.admitted else "refused"
    lines.append(f"  policy: {POLICY_RULES[policy](step.admitted)}: {verdict_word}")
    return lines


def _hint_rows(provider: str, hints: ProviderHints) -> list[tuple[str, str, str]]:
    if not hints:
        return [(provider, "-", "no preference")]
    return [(provider, resource, "no preference" if listed is None else compact_hints(listed))
            for resource, listed in hints.items()]


def _decision_lines(ex: Explanation, ctx: EngineContext) -> list[str]:
    decision = ex.admission.decision
    if decision.rejection is not None:
        return [f"decision: refused: {decision.rejection.message}"]
    names = device_names(ctx)
    rows = [("CONTAINER", "CPUS", "CPU MODE", "MEMS", "DEVICES", "HINT")]
    rows += [(p.container, *placement_cells(p, names)) for p in decision.placements]
    return ["decision: admitted", *("  " + r for r in align(rows))]


def render_json(ex: Explanation) -> str:
    return json.dumps(explanation_dict(ex), indent=2)


def explanation_dict(ex: Explanation) -> dict[str, Any]:
    decision = ex.admission.decision
    return {
        "pod": ex.entry.key, "where": ex.entry.where, "qos": str(ex.entry.pod.qos),
        "policy": decision.policy, "scope": decision.scope,
        "entries_before": len(ex.before),
        "merges": [_merge_dict(m) for m in ex.merges],
        "decision": decision.to_dict(),
    }


def _merge_dict(merge: MergeExplanation) -> dict[str, Any]:
    step = merge.step
    return {
        "subject": step.subject,
        "hints": {provider: None if not hints else {
            resource: None if listed is None else [_hint_dict(h) for h in listed]
            for resource, listed in hints.items()} for provider, hints in step.hints},
        "merged": _hint_dict(step.merged),
        "admitted": step.admitted,
        "why": _verdict_dict(merge.verdict),
    }


def _verdict_dict(v: Verdict) -> dict[str, Any]:
    return {"rule": str(v.rule), "reason": v.reason, "winner": _hint_dict(v.winner),
            "runner_up": None if v.runner_up is None else _hint_dict(v.runner_up)}


def _hint_dict(h: Hint) -> dict[str, Any]:
    return {"affinity": None if h.affinity is None else sorted(h.affinity),
            "preferred": h.preferred}
