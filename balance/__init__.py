"""epishard cost-aware rank balancing (see issue: balancing)."""
