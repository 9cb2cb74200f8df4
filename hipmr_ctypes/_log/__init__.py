"""The CSV log's format, in one place (private): ``header`` (the header line, which the writer,
``adaptors.logging``, imports alone) and ``format`` (the parser and reader that ``logfile``,
``plot`` and ``interop.torch_snapshot`` are built on).  Importing this package imports neither.
"""
