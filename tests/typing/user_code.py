"""Code written the way README.md and docs/ show it, checked with ``mypy --strict`` and strict
pyright by tests/repo/test_typing.py: the public API must type-check without casts or ignores."""
from typing import Optional, Type

import hipmr_ctypes as hmr


class memory_kind(hmr.Property):
    """A stateful property: its values are str."""
    value_type = str


class KindResource:
    """A user's resource over host memory with a stateful property."""
    properties = (hmr.host_accessible, memory_kind)

    def __init__(self) -> None:
        self.upstream = hmr.HostMemoryResource()

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        return self.upstream.allocate(bytes, alignment)

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        self.upstream.deallocate(ptr, bytes, alignment)

    def get_property(self, prop: Type[hmr.Property]) -> str:
        return "host"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KindResource)

    def __hash__(self) -> int:
        return 0


mr = hmr.AsyncMemoryResource()
pool = hmr.PoolResource(mr, initial_pool_size=1 << 28)
ref = hmr.async_resource_ref[hmr.device_accessible](pool)
sync_ref = hmr.resource_ref[hmr.device_accessible, hmr.host_accessible](
    hmr.PinnedMemoryResource())
any_ref = hmr.async_resource_ref[()](pool)
s = hmr.Stream()
p: int = ref.allocate_async(1 << 20, 256, s)
ref.deallocate_async(p, 1 << 20, 256, s)
q: int = ref.allocate_async(4096, 256, s.ref)
ref.deallocate_async(q, 4096, 256, hmr.stream_ref(s))
h: int = sync_ref.allocate(64)
sync_ref.deallocate(h, 64)
same: bool = ref == any_ref

typed: hmr.async_resource_ref[hmr.device_accessible] = ref

buf = hmr.Buffer.from_host(b"hello", resource=pool)
data: bytes = buf.tobytes()
size: int = buf.size
where: hmr.AsyncResource = buf.resource
buf.close()

current: hmr.AsyncResource = hmr.get_current_device_resource()
cp: int = current.allocate_async(256, 256, s)
current.deallocate_async(cp, 256, 256, s)
pp: int = pool.allocate_async(512, 256, s)
pool.deallocate_async(pp, 512, 256, s)
peak: int = pool.peak_pool_size
device: int = s.device
same_device: bool = s.ref.device == s.device()

host = hmr.HostMemoryResource()
hp: int = host.allocate(128)
host.deallocate(hp, 128)
ok: bool = hmr.is_resource(host) and hmr.is_async_resource_with(mr, hmr.device_accessible)
count: int = hmr.device_count()
platform: str = hmr.platform()

stats = hmr.StatisticsResource(pool)
limit = hmr.LimitingResource(stats, 1 << 30)
lp: int = limit.allocate_async(256, 256, s)
limit.deallocate_async(lp, 256, 256, s)

kind_res = KindResource()
kind: str = hmr.get_property(kind_res, memory_kind)
kind_ref = hmr.resource_ref[hmr.host_accessible, memory_kind](kind_res)
via_ref: str = kind_ref.get_property(memory_kind)
maybe: Optional[str] = hmr.try_get_property(kind_ref, memory_kind)
host_too: bool = hmr.try_get_property(kind_ref, hmr.host_accessible)
assert (kind, via_ref, maybe, host_too) == ("host", "host", "host", True)
hmr.get_property(kind_res, hmr.host_accessible)  # TypeError unless declared; the value is None
kp: int = kind_ref.allocate(64)
kind_ref.deallocate(kp, 64)

try:
    hmr.Device(0)
except hmr.NoDeviceError as exc:
    message: str = str(exc)

# foreign memory, patterns and host views
pinned_buf = hmr.Buffer(64, resource=hmr.PinnedMemoryResource())
pinned_buf.fill(0x01020304, 4)
with pinned_buf.host_view() as host_mv:
    first: int = host_mv[0]
view_buf: hmr.Buffer = hmr.Buffer.from_handle(pinned_buf.ptr, 32, owner=pinned_buf)
again: hmr.Buffer = hmr.Buffer.from_dlpack(view_buf)
again.close()
view_buf.close()
pinned_buf.close()
pool_owner = hmr.AsyncMemoryResource()
foreign_pool = hmr.AsyncMemoryResource.from_pool_handle(pool_owner.pool.handle)
foreign_pool.close()
pool_owner.close()

pool.release()
s.close()
