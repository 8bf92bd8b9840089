"""Everything that predicts or measures a step time: graphs, clusters, op costs, the simulator."""

from . import presets, synthetic
from .errors import UserError, atomic_write
from .cluster import Cluster, ClusterError, Device
from .graph import GraphError, OpGraph
from .placement import Placement, PlacementError
from .simulate import BatchResult, CostModel, SimResult, Trace

__all__ = [
    "BatchResult", "Cluster", "ClusterError", "CostModel", "Device", "GraphError", "OpGraph",
    "Placement", "PlacementError", "SimResult", "Trace", "UserError", "atomic_write", "presets", "synthetic",
]
