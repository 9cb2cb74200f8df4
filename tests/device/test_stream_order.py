"""_stream_order.StreamOrder with its runtime injected (``StreamOrder(events)``): which
events it makes, records, waits for and closes when blocks move between streams, with no
runtime and no module global replaced."""
from __future__ import annotations

import threading
from typing import Any, List, Tuple

import pytest

from hipmr_ctypes import _stream_order
from hipmr_ctypes._stream_order import SYNC, RuntimeEvents, StreamOrder
from hipmr_ctypes.errors import NoDeviceError


class FakeEvent:
    def __init__(self, log: List[Tuple[Any, ...]], name: str) -> None:
        self.log, self.name = log, name

    def synchronize(self) -> None:
        self.log.append(("synchronize", self.name))

    def close(self) -> None:
        self.log.append(("close", self.name))


class FakeRuntime:
    """Logs every call; ``gone`` holds the streams whose record fails (destroyed)."""

    def __init__(self, no_device: bool = False) -> None:
        self.log: List[Tuple[Any, ...]] = []
        self.gone: set = set()
        self.no_device = no_device
        self.made = 0

    def event_for(self, stream: Any, device: Any = None) -> FakeEvent:
        if self.no_device:
            raise NoDeviceError(100, "hipEventCreateWithFlags")
        self.made += 1
        self.log.append(("event", stream, device))
        return FakeEvent(self.log, f"e{self.made}")

    def record_or_synchronize(self, event: FakeEvent, stream: Any) -> bool:
        self.log.append(("record", event.name, stream))
        return stream not in self.gone

    def wait_event(self, stream: int, event: FakeEvent) -> None:
        self.log.append(("wait", stream, event.name))

    def device_wait(self, device: int) -> FakeEvent:
        return FakeEvent(self.log, f"device{device}")

    def device_of(self, handle: int) -> int:
        self.log.append(("device_of", handle))
        return 1


def test_the_default_runtime_is_the_modules():
    assert isinstance(StreamOrder().runtime, RuntimeEvents)
    for name in ("event_for", "record_or_synchronize", "wait_event", "device_wait", "device_of"):
        assert callable(getattr(RuntimeEvents, name)), name
        assert callable(getattr(FakeRuntime, name)), name


def test_a_created_stream_is_noted_once_with_its_device():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    order.note(0x5000)
    order.note(0x5000)
    order.note(0)                       # a special handle: nothing to note
    assert rt.log == [("device_of", 0x5000)]
    assert order.holds(0x5000) and not order.holds(0x6000)


def test_another_stream_waits_for_one_reusable_event_per_source():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    order.note(0x5000)
    assert order.order([0x5000], 0x6000) == [0x5000]
    assert rt.log[1:] == [("event", 0x5000, 1), ("record", "e1", 0x5000), ("wait", 0x6000, "e1")]
    rt.log.clear()
    assert order.order([0x5000, 0x6000, SYNC], 0x6000) == [0x5000]    # itself and SYNC: no
    assert rt.log == [("record", "e1", 0x5000), ("wait", 0x6000, "e1")]  # the same event again


def test_the_host_waits_for_the_event_itself():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    order.order([0x5000], SYNC)
    assert rt.log[-1] == ("synchronize", "e1")


def test_a_destroyed_source_stream_drops_and_closes_its_event():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    order.order([0x5000], 0x6000)
    rt.gone.add(0x5000)
    rt.log.clear()
    order.order([0x5000], 0x6000)
    assert rt.log == [("record", "e1", 0x5000), ("close", "e1")]    # no wait on a lost event
    assert 0x5000 not in order.events


def test_fresh_events_for_the_host_are_made_per_call_and_closed_by_wait_all():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    events = order.record_for_host([0x5000, SYNC, 0x6000])
    assert [e.name for e in events] == ["e1", "e2"] and order.events == {}
    _stream_order.wait_all(events)
    assert rt.log[-4:] == [("synchronize", "e1"), ("synchronize", "e2"), ("close", "e1"),
                           ("close", "e2")]


def test_another_threads_per_thread_stream_is_waited_for_device_wide():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    foreign = (_stream_order.LAST_SPECIAL_HANDLE, 3, -1)   # a token no live thread has
    assert _stream_order.is_foreign(foreign)
    order.order([foreign], 0x6000)
    assert rt.log == [("synchronize", "device3")]
    assert [e.name for e in order.record_for_host([foreign])] == ["device3"]


def test_no_device_means_nothing_to_wait_for():
    rt = FakeRuntime(no_device=True)
    order = StreamOrder(rt)
    assert order.order([0x5000], 0x6000) == [0x5000]
    assert order.record_for_host([0x5000]) == [] and rt.log == []


def test_forget_and_drop_close_the_event():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    order.note(0x5000)
    order.order([0x5000], 0x6000)
    order.drop(0x5000)
    assert rt.log[-1] == ("close", "e1") and not order.holds(0x5000)
    order.forget(0x7000)                # nothing kept for it: nothing to close
    assert rt.log[-1] == ("close", "e1")


def test_prune_keeps_only_the_streams_in_use():
    order = StreamOrder(FakeRuntime())
    for handle in (0x5000, 0x6000, 0x7000):
        order.note(handle)
    order.prune({0x6000})
    assert list(order.devices) == [0x6000]


def test_a_threads_own_per_thread_stream_is_tagged_with_an_event_it_recorded():
    rt = FakeRuntime()
    order = StreamOrder(rt)
    tags: list = []

    def run():
        key = _stream_order.stream_key(_stream_order.LAST_SPECIAL_HANDLE)
        tags.append((key, order.tag_of(key)))

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    (key, tag), = tags
    (element,) = tag
    assert type(element) is _stream_order.Recorded and element.key == key
    assert rt.log == [("event", key, None), ("record", "e1", key)]


@pytest.mark.parametrize("gone", [False, True])
def test_an_unrecordable_own_stream_is_its_own_tag(gone):
    rt = FakeRuntime()
    order = StreamOrder(rt)
    key = _stream_order.stream_key(_stream_order.LAST_SPECIAL_HANDLE)
    if gone:
        rt.gone.add(key)
    tag = order.tag_of(key)
    if gone:
        assert tag == frozenset((key,)) and rt.log[-1] == ("close", "e1")
    else:
        assert type(next(iter(tag))) is _stream_order.Recorded
