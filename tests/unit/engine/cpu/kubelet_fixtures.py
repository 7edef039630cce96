"""The CPU layouts of the kubelet's CPU Manager tests, as compact generators.

Transcribed from kubernetes/kubernetes pkg/kubelet/cm/cpumanager/policy_test.go (which CPU is on
which core, socket and NUMA node). The upstream fixtures with uncore caches could not be read;
those marked RECONSTRUCTED are rebuilt from how the upstream tests use them (their comments give
CPUs per uncore cache, sibling numbering via the reserved CPUs, and which uncore caches a result
lands in) and every expectation built on them says so.
"""

from __future__ import annotations

from nri_numa.engine.cpu import CPUTopology, cpu_topology
from nri_numa.topology.cpulist import parse_list


def cpus(text: str) -> frozenset[int]:
    """Kernel list syntax, as the upstream tests write CPU sets ("0-3,8")."""
    return parse_list(text)


def _smt2(physical: int, socket_of, numa_of, uncore_of=None) -> CPUTopology:
    """CPU c < physical and c + physical are the two threads of core c."""
    records = []
    for c in range(physical * 2):
        core = c % physical
        records.append({"cpu": c, "core": core, "socket": socket_of(core), "numa": numa_of(core),
                        "uncore_cache": None if uncore_of is None else uncore_of(core)})
    return cpu_topology(records)


def _no_smt(n: int, socket_of, numa_of, uncore_of=None) -> CPUTopology:
    return cpu_topology({"cpu": c, "core": c, "socket": socket_of(c), "numa": numa_of(c),
                         "uncore_cache": None if uncore_of is None else uncore_of(c)}
                        for c in range(n))


# topoSingleSocketHT: 4 cores, threads c and c+4.
SINGLE_SOCKET_HT = _smt2(4, lambda c: 0, lambda c: 0)

# topoDualSocketHT: 6 cores, threads c and c+6; even cores on socket/NUMA 0, odd on 1.
DUAL_SOCKET_HT = _smt2(6, lambda c: c % 2, lambda c: c % 2)

# topoDualSocketHT as the uncore tests use it: every CPU's UncoreCacheID left at 0.
DUAL_SOCKET_HT_ONE_UNCORE = _smt2(6, lambda c: c % 2, lambda c: c % 2, lambda c: 0)

# topoDualSocketNoHT: 8 cores, 0-3 on socket/NUMA 0, 4-7 on 1.
DUAL_SOCKET_NO_HT = _no_smt(8, lambda c: c // 4, lambda c: c // 4)

# topoTripleSocketHT: core k = CPUs 2k, 2k+1; cores 0-2 on socket 1, 3-5 on socket 0, 6-8 on 2.
TRIPLE_SOCKET_HT = cpu_topology(
    {"cpu": c, "core": c // 2, "socket": [1, 0, 2][c // 6], "numa": [1, 0, 2][c // 6]}
    for c in range(18))

# topoDualSocketMultiNumaPerSocketHT (dual Xeon Gold 6230): NUMA n = 10n..10n+9 and +40;
# NUMA 0-1 on socket 0, 2-3 on socket 1.
DUAL_SOCKET_MULTI_NUMA_HT = _smt2(40, lambda c: c // 20, lambda c: c // 10)

# fakeTopoMultiSocketDualSocketPerNumaHT: the same CPUs with sockets and NUMA nodes swapped
# round: four sockets of 10 cores, two NUMA nodes of 20.
MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT = _smt2(40, lambda c: c // 10, lambda c: c // 20)

# topoDualSocketMultiNumaPerSocketHTLarge (dual EPYC 7742, NPS=4): NUMA n = 16n..16n+15 and
# +128; NUMA 0-3 on socket 0, 4-7 on socket 1.
DUAL_SOCKET_MULTI_NUMA_HT_LARGE = _smt2(128, lambda c: c // 64, lambda c: c // 16)

# topoQuadSocketFourWayHT (Knights Landing SNC4): 72 cores of 4 threads; socket s = NUMA s.
_QUAD_SOCKET_CORES = {
    0: {0: (0, 169, 109, 229), 1: (50, 170, 110, 230), 64: (1, 25, 13, 38),
        65: (2, 26, 14, 39), 72: (9, 33, 21, 46), 73: (10, 34, 22, 47), 8: (57, 177, 117, 237),
        9: (58, 178, 118, 238), 24: (71, 191, 131, 251), 25: (72, 192, 132, 252),
        32: (79, 199, 139, 259), 33: (80, 200, 140, 260), 40: (87, 207, 147, 267),
        41: (88, 208, 148, 268), 48: (95, 215, 155, 275), 49: (96, 216, 156, 276),
        56: (103, 223, 163, 283), 57: (104, 224, 164, 284)},
    1: {66: (3, 27, 15, 40), 67: (4, 28, 16, 41), 74: (11, 35, 23, 48), 75: (12, 36, 24, 49),
        2: (51, 171, 111, 231), 3: (52, 172, 112, 232), 10: (59, 179, 119, 239),
        11: (60, 180, 120, 240), 18: (65, 185, 125, 245), 19: (66, 186, 126, 246),
        26: (73, 193, 133, 253), 27: (74, 194, 134, 254), 34: (81, 201, 141, 261),
        35: (82, 202, 142, 262), 42: (89, 209, 149, 269), 43: (90, 210, 150, 270),
        50: (97, 217, 157, 277), 51: (98, 218, 158, 278)},
    2: {68: (5, 29, 17, 42), 69: (6, 30, 18, 43), 4: (53, 173, 113, 233),
        5: (54, 174, 114, 234), 12: (61, 181, 121, 241), 13: (62, 182, 122, 242),
        20: (67, 187, 127, 247), 21: (68, 188, 128, 248), 28: (75, 195, 135, 255),
        29: (76, 196, 136, 256), 36: (83, 203, 143, 263), 37: (84, 204, 144, 264),
        44: (91, 211, 151, 271), 45: (92, 212, 152, 272), 52: (99, 219, 159, 279),
        53: (100, 220, 160, 280), 60: (105, 225, 165, 285), 61: (106, 226, 166, 286)},
    3: {70: (7, 31, 19, 44), 71: (8, 32, 20, 45), 63: (37, 168, 108, 228),
        62: (107, 227, 167, 287), 6: (55, 175, 115, 235), 7: (56, 176, 116, 236),
        14: (63, 183, 123, 243), 15: (64, 184, 124, 244), 22: (69, 189, 129, 249),
        23: (70, 190, 130, 250), 30: (77, 197, 137, 257), 31: (78, 198, 138, 258),
        38: (85, 205, 145, 265), 39: (86, 206, 146, 266), 46: (93, 213, 153, 273),
        47: (94, 214, 154, 274), 54: (101, 221, 161, 281), 55: (102, 222, 162, 282)},
}
QUAD_SOCKET_FOUR_WAY_HT = cpu_topology(
    {"cpu": cpu, "core": core, "socket": socket, "numa": socket}
    for socket, cores in _QUAD_SOCKET_CORES.items()
    for core, threads in cores.items() for cpu in threads)
# The fixture's comment lists socket 0; used to check the transcription above.
QUAD_SOCKET_0_FROM_COMMENT = cpus(
    "0-2,9-10,13-14,21-22,25-26,33-34,38-39,46-47,50,57-58,71-72,79-80,87-88,95-96,103-104,"
    "109-110,117-118,131-132,139-140,147-148,155-156,163-164,169-170,177-178,191-192,199-200,"
    "207-208,215-216,223-224,229-230,237-238,251-252,259-260,267-268,275-276,283-284")

# --- uncore cache fixtures -----------------------------------------------------------------

# topoUncoreSingleSocketNoSMT, RECONSTRUCTED: 16 cores, uncore caches of 4.
UNCORE_SINGLE_SOCKET_NO_SMT = _no_smt(16, lambda c: 0, lambda c: 0, lambda c: c // 4)

# topoUncoreDualSocketNoSMT: 16 cores, socket/NUMA of 8, uncore caches of 4.
UNCORE_DUAL_SOCKET_NO_SMT = _no_smt(16, lambda c: c // 8, lambda c: c // 8, lambda c: c // 4)

# topoUncoreSingleSocketMultiNuma: 16 cores, one socket, NUMA nodes of 8, uncore caches of 4.
UNCORE_SINGLE_SOCKET_MULTI_NUMA = _no_smt(16, lambda c: 0, lambda c: c // 8, lambda c: c // 4)

# topoUncoreSingleSocketSMT, RECONSTRUCTED: 8 cores (threads c, c+8), two uncore caches of
# 4 cores.
UNCORE_SINGLE_SOCKET_SMT = _smt2(8, lambda c: 0, lambda c: 0, lambda c: c // 4)

# The static policy's uncore fixtures, all RECONSTRUCTED (name: what the tests say about it).
# topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore: "8 cpus per uncore", 4 uncore caches.
SMALL_SINGLE_SOCKET_NO_SMT_UNCORE = _no_smt(32, lambda c: 0, lambda c: 0, lambda c: c // 8)
# topoSingleSocketSingleNumaPerSocketSMTSmallUncore: siblings +64, uncore caches of 4 cores.
SINGLE_SOCKET_SMT_SMALL_UNCORE = _smt2(64, lambda c: 0, lambda c: 0, lambda c: c // 4)
# topoSingleSocketSingleNumaPerSocketNoSMTSmallUncore: "4 cpus per uncore".
SINGLE_SOCKET_NO_SMT_SMALL_UNCORE = _no_smt(64, lambda c: 0, lambda c: 0, lambda c: c // 4)
# topoSmallDualSocketSingleNumaPerSocketNoSMTUncore: "8 cpus per uncore", CPU 32 on socket 1.
SMALL_DUAL_SOCKET_NO_SMT_UNCORE = _no_smt(64, lambda c: c // 32, lambda c: c // 32,
                                          lambda c: c // 8)
# topoLargeSingleSocketSingleNumaPerSocketSMTUncore: "16 cpus per uncore", siblings +128.
LARGE_SINGLE_SOCKET_SMT_UNCORE = _smt2(128, lambda c: 0, lambda c: 0, lambda c: c // 8)
# topoDualSocketMultiNumaPerSocketUncore: no SMT, NUMA nodes of 48 CPUs = 6 uncore caches of 8,
# two NUMA nodes per socket.
DUAL_SOCKET_MULTI_NUMA_UNCORE = _no_smt(192, lambda c: c // 96, lambda c: c // 48,
                                        lambda c: c // 8)
# topoDualSocketSubNumaPerSocketHTMonolithicUncore: "uncore cache CPUs = socket CPUs", siblings
# +120, two sub-NUMA nodes per socket; no uncore ids given, so the socket stands in.
DUAL_SOCKET_SUB_NUMA_HT_MONOLITHIC_UNCORE = _smt2(120, lambda c: c // 60, lambda c: c // 30)
# topoLargeSingleSocketSingleNumaPerSocketUncore (ARM): "8 cpus per uncore", no SMT.
LARGE_SINGLE_SOCKET_UNCORE = _no_smt(128, lambda c: 0, lambda c: 0, lambda c: c // 8)
# topoSingleSocketSingleNumaPerSocketUncore (ARM, monolithic): one uncore cache = the socket.
SINGLE_SOCKET_MONOLITHIC_UNCORE = _no_smt(64, lambda c: 0, lambda c: 0)
