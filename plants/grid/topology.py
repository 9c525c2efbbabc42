"""Islands of the in-service branch graph and the role of each bus in the power flow.

An island is a connected component of buses over closed branches, labelled by its lowest
internal bus index (its "root"), so a label is canonical: the same set of buses always gets the
same id, and when an island splits, every part keeps a root that was in the parent. Per-island
state (frequency, governor) is stored at the root's index and inherited that way.

Roles (int8 per bus): DEAD 0 (no energized source, or blacked out), PQ 1, PV 2, SLACK 3.
An island is energized if it holds an in-service generator at a bus that is not isolated
(MATPOWER type 4) and not blacked out. Its slack is the case's reference bus if that bus is in
the island and has an in-service generator, else the bus of the island's in-service generator
with the largest Pmax (ties: lowest bus index). Other buses with an in-service generator are PV.
"""

from __future__ import annotations

import numpy as np
from numba import njit

DEAD, ROLE_PQ, ROLE_PV, SLACK = 0, 1, 2, 3


@njit(cache=True, nogil=True)
def _find(parent, i):
    root = i
    while parent[root] != root:
        root = parent[root]
    while parent[i] != root:
        nxt = parent[i]
        parent[i] = root
        i = nxt
    return root


@njit(cache=True, nogil=True)
def islands(f_bus, t_bus, br_status, parent, island):
    """Label buses by component root (lowest index in the component). Returns the component count.

    ``parent`` (int64, n_bus) is work; ``island`` (int64, n_bus) receives the root of each bus.
    """
    n = island.shape[0]
    for i in range(n):
        parent[i] = i
    for l in range(f_bus.shape[0]):
        if br_status[l] == 0:
            continue
        a = _find(parent, f_bus[l])
        b = _find(parent, t_bus[l])
        if a != b:
            if a < b:
                parent[b] = a
            else:
                parent[a] = b
    count = 0
    for i in range(n):
        r = _find(parent, i)
        island[i] = r
        if r == i:
            count += 1
    return count


@njit(cache=True, nogil=True)
def bus_roles(island, bus_type, bus_dead, gen_bus, gen_on, gen_pmax, ref_bus, role, slack_of_root, best):
    """Fill ``role`` (int8, n_bus) and ``slack_of_root`` (int64, n_bus; -1 where no slack).

    ``bus_dead`` (int8) marks buses blacked out by an earlier collapse; ``gen_on`` (int8, n_gen);
    ``best`` (float64, n_bus) is work. Returns the number of energized islands.
    """
    n = island.shape[0]
    for i in range(n):
        role[i] = DEAD
        slack_of_root[i] = -1
        best[i] = -np.inf
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] == 0 or bus_type[b] == 4 or bus_dead[b] != 0:
            continue
        r = island[b]
        role[b] = ROLE_PV
        score = gen_pmax[g]
        if b == ref_bus:
            score = np.inf
        if score > best[r] or (score == best[r] and b < slack_of_root[r]):
            best[r] = score
            slack_of_root[r] = b
    live = 0
    for i in range(n):
        r = island[i]
        if slack_of_root[r] < 0 or bus_type[i] == 4 or bus_dead[i] != 0:
            role[i] = DEAD
        elif slack_of_root[r] == i:
            role[i] = SLACK
            live += 1
        elif role[i] != ROLE_PV:
            role[i] = ROLE_PQ
    return live


@njit(cache=True, nogil=True)
def flags_from_roles(role, free_va, free_vm):
    """Newton unknowns from roles: PQ -> Va, Vm free; PV -> Va free; slack and dead fixed."""
    for i in range(role.shape[0]):
        free_va[i] = role[i] == ROLE_PQ or role[i] == ROLE_PV
        free_vm[i] = role[i] == ROLE_PQ
