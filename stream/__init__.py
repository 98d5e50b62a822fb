"""epishard streaming window reader (see issue: streaming reader)."""
