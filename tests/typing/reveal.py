"""What the type checkers must show of users' code (never run): tests/repo/test_typing.py runs
``mypy --strict`` and strict pyright over this file.  A line ending in ``# R: T`` must reveal
the type T; a line ending in ``# E`` must be an error, and no other line may be one."""
from typing import Optional, Type

import hipmr_ctypes as hmr


class memory_kind(hmr.Property):
    value_type = str


class block_count(hmr.Property):
    value_type = int


class later_kind(memory_kind):
    """Inherits its value_type."""


class tag(hmr.Property):
    """A user's stateless property."""


class MyResource:
    properties = (hmr.device_accessible, memory_kind, block_count, later_kind, tag)

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        return 0

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        pass

    def get_property(self, prop: Type[hmr.Property]) -> object:
        return 0


res = MyResource()

# get_property: typed by the property's value_type; the library's stateless ones give None
kind = hmr.get_property(res, memory_kind)
reveal_type(kind)  # R: str
reveal_type(hmr.get_property(res, block_count))  # R: int
reveal_type(hmr.get_property(res, later_kind))  # R: str
reveal_type(hmr.get_property(res, hmr.device_accessible))  # R: None
reveal_type(hmr.get_property(res, tag))  # R: Any
count: int = hmr.get_property(res, block_count)
wrong: str = hmr.get_property(res, block_count)  # E
not_a_value: int = hmr.get_property(res, hmr.device_accessible)  # E
also_wrong: bytes = hmr.get_property(res, later_kind)  # E


def any_property(prop: Type[hmr.Property]) -> None:
    reveal_type(hmr.get_property(res, prop))  # R: Any


# through a ref, and try_get_property (what the ref's type leaves out)
ref = hmr.resource_ref[memory_kind, hmr.device_accessible](res)
reveal_type(ref.get_property(memory_kind))  # R: str
reveal_type(ref.get_property(hmr.device_accessible))  # R: None
reveal_type(hmr.try_get_property(ref, block_count))  # R: int | None
reveal_type(hmr.try_get_property(ref, hmr.host_accessible))  # R: bool
maybe: Optional[str] = hmr.try_get_property(ref, memory_kind)
sure: str = hmr.try_get_property(ref, memory_kind)  # E
via_ref_wrong: int = ref.get_property(memory_kind)  # E

# refs are generic over their properties; their calls are typed
aref = hmr.async_resource_ref[hmr.device_accessible](hmr.AsyncMemoryResource())
reveal_type(aref)  # R: async_resource_ref[device_accessible]
reveal_type(aref.allocate_async(1, 256, 0))  # R: int
host_ref: hmr.resource_ref[hmr.host_accessible] = aref  # E
