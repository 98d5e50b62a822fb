"""The package version: the one place it is written (pyproject.toml reads it from here).

Internal: the packages' shared infrastructure; users import from ``epishard`` (the curated API).
"""

__all__ = []

__version__ = "0.2.0"
