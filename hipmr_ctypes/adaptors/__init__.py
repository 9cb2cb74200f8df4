"""hipMM / RMM-style resource adaptors that work over any resource meeting the concepts.

Each takes its upstream as a resource or a ``resource_ref`` / ``async_resource_ref``, forwards
the upstream's properties, exposes ``upstream_resource()``, and is an async resource exactly
when its upstream is one.  See docs/adaptors.md.
"""
from .aligned import AlignedResource
from .binning import BinningResource
from .callback import CallbackResource
from .failure_callback import FailureCallbackResource
from .fixed_size import FixedSizeResource
from .limiting import LimitingResource
from .logging import LOG_HEADER, LoggingResource
from .pool import PoolResource
from .prefetch import PrefetchResource
from .statistics_resource import Statistics, StatisticsResource
from .tracking import TrackedAllocation, TrackingResource

__all__ = [
    "PoolResource", "BinningResource", "FixedSizeResource", "LimitingResource",
    "StatisticsResource", "Statistics", "TrackingResource", "TrackedAllocation",
    "LoggingResource", "LOG_HEADER", "FailureCallbackResource", "AlignedResource",
    "PrefetchResource", "CallbackResource",
]
