"""Merging per-partition states with Spark's ``treeReduce`` so that the driver's share is bounded in n.

``treeReduce(depth)`` merges the partitions' states in ``depth − 1`` shuffled levels of fan-in
``scale = ⌈P^(1/depth)⌉`` and collects what is left to the driver: at most about ``scale`` states at once there.
A fixed depth 2 makes that ``√P`` — 4 states at 1M × 768 (23 read splits), 14 at 10M (232), ≈ 150 at 1B: the
driver's memory would grow with the table (``bench.driver_fan_in`` measures it). :func:`tree_depth` adds levels
instead, so the driver never holds more than about ``MAX_FAN_IN`` states, whatever the number of partitions (each
extra level is one small shuffle of states).
"""

from __future__ import annotations

import math
from typing import Callable, TypeVar

from pyspark import RDD

T = TypeVar("T")
MAX_FAN_IN = 8
MIN_DEPTH = 2


def tree_depth(partitions: int) -> int:
    """The smallest ``treeReduce`` depth (at least ``MIN_DEPTH``) whose fan-in ``⌈partitions^(1/depth)⌉`` is at most
    ``MAX_FAN_IN``."""
    depth = max(MIN_DEPTH, math.ceil(math.log(max(partitions, 1)) / math.log(MAX_FAN_IN)))
    while math.ceil(partitions ** (1.0 / depth)) > MAX_FAN_IN:  # guard the float log against rounding
        depth += 1
    return depth


def tree_reduce(states: RDD[T], merge: Callable[[T, T], T]) -> T:
    """``states.treeReduce(merge)`` at :func:`tree_depth` of its number of partitions: never Spark Accumulators
    (they double-count on task retry), and at most about ``MAX_FAN_IN`` states on the driver at once."""
    return states.treeReduce(merge, depth=tree_depth(states.getNumPartitions()))
