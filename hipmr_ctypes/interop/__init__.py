"""Hooks for other GPU libraries, each imported only on demand (never by the package itself):

* ``hipmr_ctypes.interop.cupy``: ``allocator(resource=None)`` for ``cupy.cuda.set_allocator``.
* ``hipmr_ctypes.interop.numba``: ``HipmrNumbaManager``, a Numba External Memory Management
  plugin (``NUMBA_CUDA_MEMORY_MANAGER=hipmr_ctypes.interop.numba``).
* ``hipmr_ctypes.interop.torch``: PyTorch's pluggable allocator from two ctypes callbacks:
  ``use(resource=None)`` for the process, ``mem_pool(resource=None)`` for a
  ``torch.cuda.MemPool`` (docs/interop.md).
* ``hipmr_ctypes.interop.dask``: ``ResourceSetup``, a Dask worker plugin; Buffer serialization;
  ``statistics(client)``.
* ``hipmr_ctypes.interop.mpi``: Buffers through mpi4py (``send``, ``recv``, ``bcast``,
  ``allreduce``), direct or staged through pinned memory.

DLPack and ``__cuda_array_interface__`` need no hook: ``Buffer`` implements both, so
``torch.from_dlpack(buf)``, ``cupy.from_dlpack(buf)`` and ``cupy.asarray(buf)`` see its memory.
"""
