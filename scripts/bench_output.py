"""The tail the small benchmark scripts share: print one table of named numbers under a
header line, and save the result as JSON when asked (``--json PATH``)."""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional


def print_and_save(header: str, rows: Mapping[str, float], json_path: Optional[str],
                   result: Any, width: int = 44, fmt: str = "9.0f") -> None:
    """Print ``header``, then one ``  name  value`` line per row (names padded to ``width``,
    values formatted with ``fmt``); write ``result`` to ``json_path`` (indented) if given."""
    print(header)
    for name, value in rows.items():
        print(f"  {name:{width}s} {value:{fmt}}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=2)
