"""Graphs of peers: the registered families, the user's own graphs, the per-round schedule, mixing
weights and drawings."""

from topologies.families import EXPONENTIAL_FORMS, FAMILIES, Family, GraphError, GraphSpec, build_graph
from topologies.mixing import MIXINGS, as_matrix, in_neighbours, lazy, mixing_weights, push_sum_weights
from topologies.schedule import TopologySchedule, fingerprint

__all__ = [
    "EXPONENTIAL_FORMS",
    "FAMILIES",
    "Family",
    "GraphError",
    "GraphSpec",
    "build_graph",
    "MIXINGS",
    "in_neighbours",
    "mixing_weights",
    "as_matrix",
    "lazy",
    "push_sum_weights",
    "TopologySchedule",
    "fingerprint",
]
