"""Graphs of peers: generators, the per-round schedule, mixing weights and drawings."""

from topologies.generators import GraphError, build_graph, check_graph
from topologies.mixing import mixing_weights
from topologies.schedule import TopologySchedule

__all__ = ["GraphError", "build_graph", "check_graph", "mixing_weights", "TopologySchedule"]
