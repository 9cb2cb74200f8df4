"""The parts of ``Buffer`` that ``buffer.py`` does not keep (private).

``state`` (what a buffer knows of its resource, and the caches that find it), ``copies`` (host
objects as addresses, every copy, ``memset`` and ``fill``), ``staging`` (large copies of pageable
host memory through pinned chunks), ``hugepages`` (advice for fresh host destinations) and,
loaded by the first call that needs them, ``host_views``, ``foreign`` (memory another object
owns) and ``dlpack`` (capsules out and in).  None of them imports ``buffer``: what they read of a
Buffer is ``contract.BufferView``, which type checkers hold ``Buffer`` to.  Importing this
package imports none of them.
"""
