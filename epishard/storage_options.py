"""``--storage-options JSON``: the text of the one storage-options option, parsed.

Imports only ``json``, so the command line validates the option while parsing its arguments
without loading the writer (fsspec, pyarrow, PyAV); ``shardwriter.storage`` re-exports it.
"""

from __future__ import annotations

import json


def parse_storage_options(text: str) -> dict:
    """``--storage-options`` JSON text as a dict (``type=`` of every command's option).

    Raises:
        ValueError: the text is not a JSON object (the message quotes it and shows an example).
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--storage-options {text!r} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(
            f'--storage-options {text!r} must be a JSON object, e.g. \'{{"endpoint_url": "http://127.0.0.1:9000"}}\''
        )
    return value
