"""The CSV log's header line, written by ``LoggingResource`` (``adaptors/logging``) and required
by the reader (``_log.format``): one spelling for both, in a leaf either may import."""

LOG_HEADER = "Thread,Time,Action,Pointer,Size,Stream"
