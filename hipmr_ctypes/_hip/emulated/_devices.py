"""Devices, versions and errors: hipInit, hipGetDevice*, hipDeviceGetAttribute, hipGetLastError..."""
from __future__ import annotations

import ctypes
from ctypes import c_int, c_size_t
from typing import Any, Dict, Tuple

from ._args import Status, char_buffer, i32, out, u32
from ._core import (INVALID_DEVICE, INVALID_VALUE, NO_DEVICE, PEER_ACCESS_ALREADY_ENABLED,
                    PEER_ACCESS_NOT_ENABLED, SUCCESS, EmulatorCore, error_name, error_string)

__all__ = ["DeviceMixin", "device_attributes"]

INT32_MAX = 2**31 - 1


def device_attributes(ordinal: int, capacity: int, version: Tuple[int, int, int],
                      apu: bool = False) -> Dict[int, int]:
    """hipDeviceAttribute_t value -> value for one emulated device (a gfx90a-like GPU; with
    ``apu``, integrated with the host's memory and reaching pageable memory, as an MI300A
    with XNACK on)."""
    table = {
        0: 0,                   # EccEnabled
        2: 2,                   # AsyncEngineCount
        3: 1,                   # CanMapHostMemory
        4: 1,                   # CanUseHostPointerForRegisteredMem
        5: 1_700_000,           # ClockRate (kHz)
        6: 0,                   # ComputeMode (default)
        8: 1,                   # ConcurrentKernels
        9: 1,                   # ConcurrentManagedAccess
        10: 1,                  # CooperativeLaunch
        11: 1,                  # CooperativeMultiDeviceLaunch
        13: 1,                  # DirectManagedMemAccessFromHost
        16: int(apu),           # Integrated
        17: 0,                  # IsMultiGpuBoard
        19: 8 << 20,            # L2CacheSize
        23: 9,                  # ComputeCapabilityMajor (gfx9xx)
        24: 1,                  # ManagedMemory
        26: 1024, 27: 1024, 28: 1024,                  # MaxBlockDimX/Y/Z
        29: INT32_MAX, 30: 65536, 31: 65536,           # MaxGridDimX/Y/Z
        56: 1024,               # MaxThreadsPerBlock
        57: 2048,               # MaxThreadsPerMultiProcessor
        59: 4096,               # MemoryBusWidth
        60: 1_600_000,          # MemoryClockRate (kHz)
        61: 0,                  # ComputeCapabilityMinor
        63: 4,                  # MultiprocessorCount
        65: int(apu),           # PageableMemoryAccess
        66: int(apu),           # PageableMemoryAccessUsesHostPageTables
        67: ordinal,            # PciBusId
        68: 0,                  # PciDeviceId
        69: 0,                  # PciDomainID
        74: 65536,              # MaxSharedMemoryPerBlock
        78: 1,                  # StreamPrioritiesSupported
        81: 256,                # TextureAlignment
        83: 65536,              # TotalConstantMemory
        84: min(capacity, INT32_MAX),                  # TotalGlobalMem (clamped, as AMD does)
        85: 1,                  # UnifiedAddressing
        87: 64,                 # WarpSize
        88: int(tuple(version) >= (6, 2, 0)),          # MemoryPoolsSupported (off by default < 6.2)
        89: 1,                  # VirtualMemoryManagementSupported (5.3+; 0 without memfd)
        90: 1,                  # HostRegisterSupported
        91: 1,                  # MemoryPoolSupportedHandleTypes: POSIX file descriptor
        10011: 0,               # IsLargeBar
        10015: 4,               # PhysicalMultiProcessorCount
        10016: 1,               # FineGrainSupport
    }
    if tuple(version) < (5, 3, 0):   # VirtualMemoryManagementSupported is new in 5.3
        del table[89]
    return table


class DeviceMixin(EmulatorCore):
    """Devices, versions, peer access, memory info and the error functions."""

    # ---- init and versions ----------------------------------------------------------------
    def hipInit(self, flags: Any) -> None:
        """hipInit(unsigned): flags must be 0."""
        if u32(flags):
            raise Status(INVALID_VALUE)

    def hipRuntimeGetVersion(self, runtime_version: Any) -> None:
        """hipRuntimeGetVersion(int*): HIPMR_EMULATED_VERSION encoded (6.2.0 -> 60200000)."""
        out(runtime_version, c_int).value = self.version_number

    def hipDriverGetVersion(self, driver_version: Any) -> None:
        """hipDriverGetVersion(int*): the same number as the runtime version."""
        out(driver_version, c_int).value = self.version_number

    # ---- errors (not wrapped: they neither fail nor touch the last error) -----------------
    def hipGetErrorName(self, hip_error: Any) -> bytes:
        """hipGetErrorName(hipError_t) -> const char* (bytes)."""
        try:
            return error_name(i32(hip_error)).encode()
        except TypeError:
            return b"hipErrorUnknown"

    def hipGetErrorString(self, hip_error: Any) -> bytes:
        """hipGetErrorString(hipError_t) -> const char* (bytes)."""
        try:
            return error_string(i32(hip_error)).encode()
        except TypeError:
            return b"unknown error"

    def _take_last(self, field: str) -> int:
        tls = self._tls
        status: int = getattr(tls, field)
        setattr(tls, field, SUCCESS)
        if not self._sticky_errors:   # before HIP 7 both report the same per-thread value
            tls.last_error = tls.last_command = SUCCESS
        return status

    def hipGetLastError(self) -> int:
        """hipGetLastError(): the thread's last error, then reset to success.

        HIP < 7: the result of the last call, success included.  HIP >= 7 (set with
        HIPMR_EMULATED_VERSION): the last error other than not-ready, like CUDA.
        """
        return self._take_last("last_error")

    def hipPeekAtLastError(self) -> int:
        """hipPeekAtLastError(): what hipGetLastError would return, without resetting it."""
        return self._tls.last_error

    def hipExtGetLastError(self) -> int:
        """hipExtGetLastError(): the result of the last call, then reset (HIP >= 6.0)."""
        return self._take_last("last_command")

    # ---- devices --------------------------------------------------------------------------
    def hipGetDeviceCount(self, count: Any) -> int:
        """hipGetDeviceCount(int*): hipErrorNoDevice (count 0) when HIPMR_EMULATED_DEVICES=0."""
        target = out(count, c_int)
        target.value = len(self._devices)
        return SUCCESS if self._devices else NO_DEVICE

    def hipGetDevice(self, device_id: Any) -> None:
        """hipGetDevice(int*): the calling thread's current device (0 at first)."""
        out(device_id, c_int).value = self._tls.device

    def hipSetDevice(self, device_id: Any) -> None:
        """hipSetDevice(int): per thread."""
        self._tls.device = self._device(i32(device_id)).ordinal

    def hipDeviceGetAttribute(self, pi: Any, attr: Any, device_id: Any) -> None:
        """hipDeviceGetAttribute(int*, hipDeviceAttribute_t, int): unknown attribute -> invalid."""
        target = out(pi, c_int)
        a, dev = i32(attr), self._device(i32(device_id))
        table = device_attributes(dev.ordinal, dev.capacity, self.version, self.config.apu)
        if a not in table:
            raise Status(INVALID_VALUE)
        target.value = table[a] if a != 89 else int(self._vspace.supported)

    def hipDeviceGetName(self, name: Any, length: Any, device: Any) -> None:
        """hipDeviceGetName(char*, int, int): 'HIPMR Emulated Device N', truncated to fit."""
        n = i32(length)
        dev = self._device(i32(device))
        address, capacity = char_buffer(name)
        if n <= 0 or n > capacity:
            raise Status(INVALID_VALUE)
        text = f"HIPMR Emulated Device {dev.ordinal}".encode()[:n - 1] + b"\0"
        ctypes.memmove(address, text, len(text))

    def hipDeviceTotalMem(self, nbytes: Any, device: Any) -> None:
        """hipDeviceTotalMem(size_t*, int): the device's capacity."""
        target = out(nbytes, c_size_t)
        target.value = self._device(i32(device)).capacity

    def hipMemGetInfo(self, free: Any, total: Any) -> None:
        """hipMemGetInfo(size_t*, size_t*): of the current device; pool reservations count."""
        free_out, total_out = out(free, c_size_t), out(total, c_size_t)
        with self._lock:
            dev = self._current()
            free_out.value = dev.capacity - dev.committed
            total_out.value = dev.capacity

    def hipDeviceCanAccessPeer(self, can_access_peer: Any, device_id: Any,
                               peer_device_id: Any) -> None:
        """hipDeviceCanAccessPeer(int*, int, int): 1 between two different devices."""
        target = out(can_access_peer, c_int)
        dev, peer = self._device(i32(device_id)), self._device(i32(peer_device_id))
        target.value = int(dev is not peer)

    def hipDeviceEnablePeerAccess(self, peer_device_id: Any, flags: Any) -> None:
        """hipDeviceEnablePeerAccess(int, unsigned): from the current device; once per pair."""
        peer, f = self._device(i32(peer_device_id)), u32(flags)
        if f:
            raise Status(INVALID_VALUE)
        with self._lock:
            dev = self._current()
            if peer is dev:
                raise Status(INVALID_DEVICE)
            if peer.ordinal in dev.peers:
                raise Status(PEER_ACCESS_ALREADY_ENABLED)
            dev.peers.add(peer.ordinal)

    def hipDeviceDisablePeerAccess(self, peer_device_id: Any) -> None:
        """hipDeviceDisablePeerAccess(int): from the current device; only an enabled peer."""
        peer = self._device(i32(peer_device_id))
        with self._lock:
            dev = self._current()
            if peer.ordinal not in dev.peers:
                raise Status(PEER_ACCESS_NOT_ENABLED)
            dev.peers.discard(peer.ordinal)
