"""``nri-numa explain``: every provider's hints for one pod, the merge and the winning rule."""

from __future__ import annotations

import argparse

from nri_numa.cli.errors import CliError
from nri_numa.cli.pods_input import add_engine_options, engine_inputs, report_bad_entries


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="why one pod goes where it goes (or is refused)",
                       description="Show every provider's hints for one pod, the merge, and the "
                                   "rule that picked the winning NUMA nodes; the pod is placed "
                                   "after the entries before it in the pods file.")
    add_engine_options(p)
    p.add_argument("--pod", required=True, metavar="NAME",
                   help="the pod: name (namespace default) or namespace/name")
    p.add_argument("--json", action="store_true", help="the explanation as JSON")
    p.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    from nri_numa.views.explain import explain_pod
    from nri_numa.views.explain_render import render_json, render_text
    from nri_numa.views.simulate import InputError, pod_key

    ctx, entries = engine_inputs(args)
    try:
        explanation = explain_pod(ctx, entries, pod_key(args.pod), args.pods)
    except InputError as e:
        raise CliError(str(e)) from None
    print(render_json(explanation) if args.json else render_text(explanation, ctx))
    return report_bad_entries(args.pods, explanation.errors)
