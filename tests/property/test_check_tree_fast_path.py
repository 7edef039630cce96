"""``check_tree``'s fast pass over plain documents (``_plainly_within``) never changes its
verdict: for any document and bounds, it raises exactly when the plain walk (``_walk``) raises,
with the same line, and returns otherwise."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.safeio.bounds import BoundError, _walk, check_tree

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=3))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=2), inner, max_size=4),
        st.tuples(inner, inner),  # not plain: the walk decides
        st.dictionaries(st.text(max_size=2), inner, max_size=3).map(OrderedDict),
    ),
    max_leaves=40)


def verdict(check, document, depth: int, nodes: int) -> str | None:
    try:
        check(document, "doc", depth, nodes)
    except BoundError as e:
        return str(e)
    return None


@settings(max_examples=600, deadline=None)
@given(documents, st.integers(1, 6), st.integers(1, 60))
def test_check_tree_agrees_with_the_plain_walk(document, depth, nodes):
    assert verdict(check_tree, document, depth, nodes) == verdict(_walk, document, depth, nodes)


def test_a_self_containing_list_is_refused_not_walked_for_ever():
    loop: list = []
    loop.append(loop)
    assert verdict(check_tree, loop, 64, 250_000) == "doc: nested deeper than 64 levels"
    wide = [[1, 2, 3]] * 100  # one list used 100 times: counted as often as it is used
    assert verdict(check_tree, wide, 64, 300) == "doc: holds more than 300 values"
    assert verdict(check_tree, wide, 64, 401) is None
