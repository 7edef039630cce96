"""GPU sets by link score: pair scores, chosen sets on hand-built machines, the exact search
against the swap search, and bad input."""

from __future__ import annotations

import itertools

import pytest
from device_boxes import (addresses, dgx1_volta, dgx_a100_like, dgx_h100, hgx16, indices,
                          nvlink_pairs, pcie_box)

from nri_numa.engine.devices.gpu_select import (GpuSelectionError, cut_score,
                                                exact_choice, gpu_chooser, gpu_pcie_level,
                                                nvlink_count, pair_score, select_gpus,
                                                swap_choice)
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Gpu


def choose(topology: Topology, size: int, *, free: list[int] | None = None,
           must: tuple[int, ...] = ()) -> list[int]:
    """NVML indices of the GPUs chosen among ``free`` (default all) that keep ``must``."""
    pool = [g for g in topology.gpus if free is None or g.index in free]
    selection = select_gpus(pool, size, addresses(topology, *must), topology)
    return indices(topology, selection.chosen)


# --- pair scores (NVIDIA's table: 100 per NVLink, PCIe 60/50/40/30/20/10) ---------------------

def _gpu(address: str, node: int | None = 0, **kw) -> Gpu:
    return Gpu(index=0, uuid="GPU-" + address, pci_address=address, numa_node=node, **kw)


@pytest.mark.parametrize("level,score", [("internal", 60), ("single", 50), ("multiple", 40),
                                         ("hostbridge", 30), ("node", 20), ("system", 10)])
def test_pcie_level_scores(level, score):
    a = _gpu("0000:01:00.0", pcie={"0000:02:00.0": level})
    b = _gpu("0000:02:00.0")
    assert pair_score(a, b) == score == pair_score(b, a)


def test_every_nvlink_outranks_every_pcie_level():
    one_link_across_sockets = pair_score(_gpu("0000:01:00.0", 0, nvlink_peers={"0000:02:00.0": 1}),
                                         _gpu("0000:02:00.0", 1, nvlink_peers={"0000:01:00.0": 1}))
    same_board = pair_score(_gpu("0000:01:00.0", pcie={"0000:02:00.0": "internal"}),
                            _gpu("0000:02:00.0"))
    assert one_link_across_sockets == 110 > same_board == 60


@pytest.mark.parametrize("a_peers,b_peers,a_switch,b_switch,links", [
    ({"0000:02:00.0": 4}, {"0000:01:00.0": 4}, 0, 0, 4),
    ({"0000:02:00.0": 4}, {"0000:01:00.0": 3}, 0, 0, 3),  # a link needs both ends
    ({"0000:02:00.0": 2}, {}, 0, 0, 2),  # only one side reported
    ({}, {}, 18, 18, 18),  # NVSwitch fabric
    ({}, {}, 18, 12, 12),
    ({}, {}, 18, 0, 0),  # one GPU not on the fabric
    ({"0000:02:00.0": 2}, {"0000:01:00.0": 2}, 6, 6, 8),
])
def test_nvlink_count(a_peers, b_peers, a_switch, b_switch, links):
    a = _gpu("0000:01:00.0", nvlink_peers=a_peers, nvswitch_links=a_switch)
    b = _gpu("0000:02:00.0", nvlink_peers=b_peers, nvswitch_links=b_switch)
    assert nvlink_count(a, b) == links == nvlink_count(b, a)


def test_pcie_level_falls_back_to_pci_tree_then_numa_node():
    t = pcie_box()
    bare = [Gpu(index=g.index, uuid=g.uuid, pci_address=g.pci_address, numa_node=g.numa_node)
            for g in t.gpus]
    assert gpu_pcie_level(bare[0], bare[1], t) == "single"
    assert gpu_pcie_level(bare[0], bare[2], t) == "hostbridge"
    assert gpu_pcie_level(bare[0], bare[1]) == "node"
    assert gpu_pcie_level(_gpu("0000:01:00.0", 0), _gpu("0000:02:00.0", 1)) == "system"
    assert gpu_pcie_level(_gpu("0000:01:00.0", None), _gpu("0000:02:00.0", None)) == "system"


# --- chosen sets ------------------------------------------------------------------------------

@pytest.mark.parametrize("box,size,free,must,expected", [
    # PCIe box: a pair on one switch, never one GPU from each switch
    (pcie_box, 2, None, (), [0, 1]),
    (pcie_box, 2, [1, 2, 3], (), [2, 3]),
    (pcie_box, 2, None, (2,), [2, 3]),
    (pcie_box, 3, None, (), [0, 1, 2]),
    # direct NVLink pairs: more links win, and taking 1-2 (1 link) would strand 0 and 3
    (nvlink_pairs, 2, None, (), [0, 1]),
    (nvlink_pairs, 2, [1, 2, 3], (), [2, 3]),
    (nvlink_pairs, 2, None, (1,), [0, 1]),
    (nvlink_pairs, 2, None, (2,), [2, 3]),
    (nvlink_pairs, 2, [0, 2, 3], (0,), [0, 2]),  # no link left for 0: the lowest address
    # 1 GPU: the one whose partner is gone, so linked pairs stay whole
    (nvlink_pairs, 1, [0, 2, 3], (), [0]),
    (nvlink_pairs, 1, [1, 2, 3], (), [1]),
    (pcie_box, 1, [0, 2, 3], (), [0]),
    # DGX H100: every pair has 18 NVLinks; the NUMA node decides
    (dgx_h100, 4, None, (), [0, 1, 2, 3]),
    (dgx_h100, 4, None, (5,), [4, 5, 6, 7]),
    (dgx_h100, 2, [0, 4, 5, 6], (), [4, 5]),
    (dgx_h100, 4, [0, 1, 4, 5, 6, 7], (), [4, 5, 6, 7]),
    (dgx_h100, 1, [0, 1, 2, 4, 5, 6, 7], (), [0]),  # take from the node already broken into
    (dgx_h100, 8, None, (), list(range(8))),
])
def test_chosen_sets(box, size, free, must, expected):
    assert choose(box(), size, free=free, must=must) == expected


@pytest.mark.parametrize("free,must,size,expected", [
    # NVIDIA's best-effort allocator tests on the DGX-1 Volta facts (go-gpuallocator)
    ([0, 2, 4, 5], (), 2, [4, 5]),  # single NVLink, prefer same switch
    ([0, 4, 5, 6], (), 2, [5, 6]),  # single NVLink, prefer same socket
    ([0, 3, 1], (), 2, [0, 3]),  # prefer dual NVLink, same socket
    ([0, 1, 4], (), 2, [0, 4]),  # prefer dual NVLink across sockets
    (None, (4,), 1, [4]),
    (None, (4,), 2, [4, 7]),
    (None, (4,), 4, [4, 5, 6, 7]),
    (None, (0, 2, 4, 6), 4, [0, 2, 4, 6]),
    (None, (), 4, [0, 1, 2, 3]),
    (None, (), 8, list(range(8))),
])
def test_dgx1_volta_matches_nvidia_expectations(free, must, size, expected):
    assert choose(dgx1_volta(), size, free=free, must=must) == expected


def test_dgx1_volta_sequence_of_pairs_uses_only_dual_nvlink_pairs():
    # NVIDIA's test expects 0-3, 1-2, 4-7, 5-6: the first of several equal divisions its
    # enumeration meets. We break that tie by set score, so the dual-NVLink pairs that also
    # share a PCIe switch come first; every pair still has two NVLinks.
    t, free, taken = dgx1_volta(), list(range(8)), []
    while free:
        pair = choose(t, 2, free=free)
        taken.append(pair)
        free = [i for i in free if i not in pair]
    assert taken == [[2, 3], [6, 7], [0, 4], [1, 5]]


def test_dgx1_volta_quads_in_sequence():
    t = dgx1_volta()
    assert choose(t, 4) == [0, 1, 2, 3]
    assert choose(t, 4, free=[4, 5, 6, 7]) == [4, 5, 6, 7]


def test_selection_reports_scores_and_search():
    t = nvlink_pairs()
    s = select_gpus(t.gpus, 2, (), t)
    assert (s.set_score, s.division_score, s.exact) == (430, 430 + 230, True)


def test_size_zero_and_whole_set():
    t = pcie_box()
    assert select_gpus(t.gpus, 0).chosen == ()
    assert select_gpus(t.gpus, 4, topology=t).chosen == addresses(t, 0, 1, 2, 3)


# --- more than EXACT_MAX_GPUS: the swap search --------------------------------------------------

@pytest.mark.parametrize("size,free,must,expected,exact", [
    (2, None, (), [0, 1], False),
    (4, None, (), [0, 1, 2, 3], False),
    (8, None, (), list(range(8)), False),
    (2, None, (9,), [8, 9], False),
    (4, None, (13,), [12, 13, 14, 15], False),
    (3, None, (), [0, 1, 2], False),
    # two switch pairs tie; 8-9 leaves less behind on its emptier socket (smaller cut)
    (2, [0, 2, 3, 4, 6, 8, 9, 10, 12], (), [8, 9], False),
    (4, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], (), [8, 9, 10, 11], False),
    # nothing to divide: exact at any size
    (1, [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], (), [0], True),
    (15, None, (), list(range(15)), True),
    (16, None, (), list(range(16)), True),
])
def test_sixteen_gpus(size, free, must, expected, exact):
    t = hgx16()
    pool = [g for g in t.gpus if free is None or g.index in free]
    selection = select_gpus(pool, size, addresses(t, *must), t)
    assert indices(t, selection.chosen) == expected
    assert selection.exact is exact


@pytest.mark.parametrize("free,size,must", [
    ([0, 2, 3, 4, 6, 8, 9, 10, 12], 2, ()),
    ([0, 2, 3, 4, 6, 8, 9, 10, 12], 3, (12,)),
    (list(range(10)), 3, ()),
    (list(range(10)), 4, (9,)),
    ([1, 2, 3, 5, 6, 9, 11, 12, 14, 15], 4, ()),
])
def test_swap_search_matches_exact_search_above_the_exact_limit(free, size, must):
    t = hgx16()
    gpus = [g for g in t.gpus if g.index in free]
    scores = [[pair_score(a, b, t) for b in gpus] for a in gpus]
    required = frozenset(free.index(i) for i in must)
    exact, swapped = exact_choice(scores, size, required), swap_choice(scores, size, required)
    assert (swapped.members, swapped.set_score) == (exact.members, exact.set_score)
    assert (swapped.exact, exact.exact) == (False, True)


def _small_cases():
    """Every box of at most 8 GPUs x free subsets x sizes x must-include choices."""
    for box in (pcie_box, nvlink_pairs, dgx_h100, dgx1_volta, dgx_a100_like):
        t = box()
        n = len(t.gpus)
        frees = [list(range(n))] + [[i for i in range(n) if i not in out]
                                    for out in itertools.combinations(range(n), 2 if n > 4 else 1)]
        for free in frees:
            for size in range(1, len(free) + 1):
                for must in [(), (free[-1],), tuple(free[:min(2, size)])]:
                    yield box.__name__, t, free, size, must


SMALL_CASES = list(_small_cases())


def test_swap_search_matches_exact_search_on_every_small_case():
    assert len(SMALL_CASES) > 500
    for name, t, free, size, must in SMALL_CASES:
        gpus = [g for g in t.gpus if g.index in free]
        scores = [[pair_score(a, b, t) for b in gpus] for a in gpus]
        required = frozenset(free.index(i) for i in must)
        exact = exact_choice(scores, size, required)
        swapped = swap_choice(scores, size, required)
        assert (swapped.members, swapped.set_score, swapped.division_score) == (
            exact.members, exact.set_score, exact.division_score), (name, free, size, must)


def test_exact_choice_is_the_best_set_by_brute_force():
    # Brute force over every set and every division of the rest, on DGX-1 Volta subsets.
    t = dgx1_volta()
    for free, size in [([0, 1, 2, 3, 4, 5], 2), ([0, 2, 3, 5, 6, 7], 3), (list(range(7)), 3)]:
        gpus = [g for g in t.gpus if g.index in free]
        scores = [[pair_score(a, b, t) for b in gpus] for a in gpus]
        best = max(itertools.combinations(range(len(gpus)), size),
                   key=lambda s: (_brute_total(scores, s, size), _set(scores, s),
                                  -cut_score(scores, s), [-m for m in s]))
        assert exact_choice(scores, size, frozenset()).members == best


def _set(scores, members) -> int:
    return sum(scores[a][b] for a, b in itertools.combinations(members, 2))


def _brute_total(scores, chosen, size) -> int:
    rest = [i for i in range(len(scores)) if i not in chosen]
    return _set(scores, chosen) + max(
        (sum(_set(scores, g) for g in division) for division in _divisions(rest, size)),
        default=0)


def _divisions(items, size):
    if not items:
        yield []
        return
    group_size = size if len(items) % size == 0 else len(items) % size
    for candidate in (size, group_size):
        if candidate > len(items):
            continue
        first, others = items[0], items[1:]
        for more in itertools.combinations(others, candidate - 1):
            group = (first, *more)
            for rest in _divisions([i for i in others if i not in more], size):
                # one smaller group at most: the sizes must add up like upstream's padding
                sizes = sorted(len(g) for g in [group, *rest])
                if sum(1 for s in sizes if s != size) <= 1:
                    yield [group, *rest]


# --- the chooser (device ids) -----------------------------------------------------------------

def test_chooser_takes_uuids_and_addresses():
    t = nvlink_pairs()
    uuids = [g.uuid for g in t.gpus]
    choose_gpus = gpu_chooser(t)
    assert choose_gpus(uuids, [], 2) == [uuids[0], uuids[1]]
    assert choose_gpus(uuids, [uuids[3]], 2) == [uuids[2], uuids[3]]
    assert choose_gpus([g.pci_address.upper() for g in t.gpus], [], 2) == [
        t.gpus[0].pci_address.upper(), t.gpus[1].pci_address.upper()]


def test_chooser_keeps_unknown_must_include_and_fills_with_unknown_last():
    t = nvlink_pairs()
    uuids = [g.uuid for g in t.gpus]
    choose_gpus = gpu_chooser(t)
    # one GPU to score: GPU 3, whose 2-link pair breaks less than GPU 0's 4-link pair
    assert choose_gpus([*uuids, "MIG-1"], ["MIG-1"], 2) == ["MIG-1", uuids[3]]
    assert choose_gpus([uuids[0], "MIG-2", "MIG-10"], [], 3) == [uuids[0], "MIG-2", "MIG-10"]


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("size,must,message", [
    (5, (), "asked for 5 GPUs but only 4 are available"),
    (-1, (), "cannot select -1 GPUs"),
    (1, ("0000:11:00.0", "0000:12:00.0"), "2 GPUs must be included but only 1 were asked for"),
    (2, ("0000:99:00.0",), "must-include GPUs ['0000:99:00.0'] are not among the available"),
])
def test_bad_requests(size, must, message):
    t = nvlink_pairs()
    with pytest.raises(GpuSelectionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        select_gpus(t.gpus, size, must, t)


def test_repeated_gpus_are_rejected():
    t = nvlink_pairs()
    with pytest.raises(GpuSelectionError, match="repeat"):
        select_gpus([t.gpus[0], t.gpus[0]], 1)
