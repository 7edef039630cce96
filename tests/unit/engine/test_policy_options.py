"""topologyManagerPolicyOptions: the kubelet's parsing and error texts (policy_options_test.go)."""

from __future__ import annotations

import pytest

from nri_numa.engine import Hint, PolicyOptionError, merge_hints
from nri_numa.engine.policy.options import PolicyOptions, go_quote, parse_policy_options

CLOSEST = "prefer-closest-numa-nodes"
MAX_NODES = "max-allowable-numa-nodes"


@pytest.mark.parametrize("options, expected", [
    (None, PolicyOptions(False, 8)),
    ({}, PolicyOptions(False, 8)),
    ({CLOSEST: "true", MAX_NODES: "8"}, PolicyOptions(True, 8)),
    ({MAX_NODES: "12"}, PolicyOptions(False, 12)),
    ({MAX_NODES: "+64"}, PolicyOptions(False, 64)),
    ({MAX_NODES: "0010"}, PolicyOptions(False, 10)),
    ({CLOSEST: "false"}, PolicyOptions(False, 8)),
])
def test_parse(options, expected):
    assert parse_policy_options(options) == expected


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_parse_bool_true(text):
    assert parse_policy_options({CLOSEST: text}).prefer_closest_numa_nodes is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_go_parse_bool_false(text):
    assert parse_policy_options({CLOSEST: text}).prefer_closest_numa_nodes is False


@pytest.mark.parametrize("options, message", [
    ({"unknown-option": "true"}, 'unknown Topology Manager Policy option: "unknown-option"'),
    ({CLOSEST: "not a boolean"},
     'bad value for option "prefer-closest-numa-nodes": strconv.ParseBool: parsing "not a boolean": invalid syntax'),
    ({CLOSEST: "yes"}, 'strconv.ParseBool: parsing "yes": invalid syntax'),
    ({CLOSEST: "tRUE"}, 'strconv.ParseBool: parsing "tRUE": invalid syntax'),
    ({CLOSEST: ""}, 'strconv.ParseBool: parsing "": invalid syntax'),
    ({MAX_NODES: "can't parse to int"},
     'unable to convert policy option to integer "max-allowable-numa-nodes": '
     'strconv.Atoi: parsing "can\'t parse to int": invalid syntax'),
    ({MAX_NODES: " 9"}, 'strconv.Atoi: parsing " 9": invalid syntax'),
    ({MAX_NODES: "1_0"}, 'strconv.Atoi: parsing "1_0": invalid syntax'),
    ({MAX_NODES: "9.0"}, 'strconv.Atoi: parsing "9.0": invalid syntax'),
    ({MAX_NODES: "99999999999999999999"}, 'strconv.Atoi: parsing "99999999999999999999": value out of range'),
    ({MAX_NODES: "7"}, 'the minimum value of "max-allowable-numa-nodes" should not be less than 8'),
    ({MAX_NODES: "-9"}, 'the minimum value of "max-allowable-numa-nodes" should not be less than 8'),
    ({CLOSEST: True}, 'option "prefer-closest-numa-nodes": values are strings, got True'),
    ({7: "1"}, "option names are strings"),
])
def test_errors_are_the_kubelets(options, message):
    with pytest.raises(PolicyOptionError) as err:
        parse_policy_options(options)
    assert message in str(err.value)


def test_first_bad_option_in_mapping_order_is_reported():
    with pytest.raises(PolicyOptionError, match="unknown Topology Manager Policy option"):
        parse_policy_options({"a": "1", MAX_NODES: "7"})
    with pytest.raises(PolicyOptionError, match="minimum value"):
        parse_policy_options({MAX_NODES: "7", "a": "1"})


def test_go_quote():
    assert go_quote("plain") == '"plain"'
    assert go_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote("tab\there\n\x01") == '"tab\\there\\n\\x01"'
    assert go_quote("é") == '"é"'


def test_option_errors_come_before_any_other_check():
    # kubelet order: options first, then NUMA info, the node limit, the policy name
    with pytest.raises(PolicyOptionError, match="unknown Topology Manager Policy option"):
        merge_hints("no-such-policy", range(20), [], options={"x": "1"})


def test_max_allowable_numa_nodes_lifts_the_limit():
    nodes = list(range(16))
    with pytest.raises(ValueError, match="more than 8 NUMA Nodes"):
        merge_hints("best-effort", nodes, [])
    hint, admit = merge_hints("best-effort", nodes, [], options={MAX_NODES: "16"})
    assert (hint, admit) == (Hint(frozenset(nodes), True), True)


def test_prefer_closest_changes_the_choice():
    nodes = (0, 1, 2, 3)
    table = ((10, 11, 12, 12), (11, 10, 12, 12), (12, 12, 10, 11), (12, 12, 11, 10))
    providers = [{"r": [Hint({0, 2}, True), Hint({2, 3}, True)]}]
    narrowest, _ = merge_hints("best-effort", nodes, providers, distances=table)
    closest, _ = merge_hints("best-effort", nodes, providers, distances=table, options={CLOSEST: "true"})
    assert narrowest.affinity == {0, 2}   # 5 < 12
    assert closest.affinity == {2, 3}     # average 10.5 < 11


def test_distances_are_only_read_with_prefer_closest():
    # Like the kubelet, which only asks for distances when the option is on.
    providers = [{"r": [Hint({0}, True)]}]
    assert merge_hints("best-effort", (0, 1), providers, distances=[[1]])[0] == Hint({0}, True)
    with pytest.raises(ValueError, match="expected 2 rows"):
        merge_hints("best-effort", (0, 1), providers, distances=[[1]], options={CLOSEST: "1"})
