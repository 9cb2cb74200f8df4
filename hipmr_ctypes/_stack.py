"""Walking a stack of resources down ``upstream_resource()``, with no depth limit: a stack is
as deep as its user made it, and a cycle (a resource that is its own upstream, through any
number of adaptors) is found by identity and raises ValueError, never a silent wrong answer."""
from __future__ import annotations

from typing import Any, Dict, Iterator

from .resource_ref import resource_ref

__all__ = ["walk_stack"]


def walk_stack(resource: Any, what: str) -> Iterator[Any]:
    """``resource``, then each resource below it through ``upstream_resource()`` (refs are
    looked through to the resource they name), until one has no ``upstream_resource`` or its
    call raises.  ValueError (naming ``what``) when a resource comes round again."""
    seen: Dict[int, Any] = {}   # id -> the object, kept alive so that no id is reused
    depth = 0
    while True:
        if isinstance(resource, resource_ref):
            resource = resource.resource
        if id(resource) in seen:
            raise ValueError(f"{what}: the resource stack has a cycle: "
                             f"{type(resource).__name__} is reached again after {depth} "
                             "upstream_resource() steps")
        seen[id(resource)] = resource
        yield resource
        upstream = getattr(resource, "upstream_resource", None)
        if not callable(upstream):
            return
        try:
            resource = upstream()
        except Exception:  # noqa: BLE001 - a user object's method: the stack ends here
            return
        depth += 1
