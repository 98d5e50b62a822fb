"""``--storage-options JSON``: the text of the one storage-options option, parsed.

Imports only ``json``, so the command line validates the option while parsing its arguments
without loading the writer (fsspec, pyarrow, PyAV); ``epishard.format.storage`` re-exports it.

Internal: the packages' shared infrastructure; users import from ``epishard`` (the curated API).
"""

from __future__ import annotations

import json

__all__ = ["parse_storage_options"]


def parse_storage_options(text: str) -> dict:
    """``--storage-options`` JSON text as a dict (``type=`` of every command's option).

    Raises:
        ValueError: the text is not a JSON object. The message names the option, where the JSON
            breaks (line, column) or what it holds instead, and an example, never the text itself:
            the options carry secrets (``key``, ``secret``, ``token``).
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:  # exc.msg and the position only: str(exc) is safe, exc.doc is not
        raise ValueError(
            f"--storage-options is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}; "
            f"the value is not shown: it may hold secrets){_EXAMPLE}"
        ) from None
    except ValueError:  # e.g. a lone surrogate
        raise ValueError(
            f"--storage-options is not valid JSON (the value is not shown: it may hold secrets){_EXAMPLE}"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"--storage-options must be a JSON object, not a JSON {_KINDS.get(type(value), 'value')}{_EXAMPLE}"
        )
    return value


_EXAMPLE = '; e.g. \'{"endpoint_url": "http://127.0.0.1:9000"}\''
_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
