"""Read-time episode selection, from the window index alone.

Read-time episode selection: which episodes of a converted dataset an epoch plans, chosen from the
window index alone (no shard byte is read) by pure functions, so the plan stays a pure function of
its inputs (the selection is one of them).

Criteria (all given ones must hold): episode list or range (``episode_index`` in its source), keys,
task text or regex (matched against every task of the episode), robot, any per-episode column of
the index (``key``, ``source``, ``episode_index``, ``num_rows``, ``fps``, ``task``, ``tasks``,
``robot``) or of a per-episode ``metadata`` table joined on ``episode_index`` (and ``source`` when it
has one; e.g. LeRobot's ``meta/episodes`` columns such as a success flag), length bounds in rows;
then a seeded train/val split of the episodes that passed.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from epishard.format.index import WindowIndex

__all__ = ["Selection", "explain_empty", "select_episodes", "split_val"]


@dataclass(frozen=True)
class Selection:
    """Which episodes to plan (every criterion given must hold).

    Args:
        episodes: ``episode_index`` values (in the episode's source), e.g. ``range(0, 50)`` or ``[3, 7]``.
        keys: episode keys (``<source>-e<episode_index:06d>``).
        tasks: task texts; an episode matches when any of its tasks equals one.
        task_regex: a regular expression (``re.search``) matched against each of the episode's tasks.
        robots: robot types (the index's ``robot``).
        where: column -> a value (equality; for a list column such as ``tasks``: membership), a
            collection of values (any of them), or a callable ``value -> bool``. Columns: the
            index's, or ``metadata``'s.
        min_rows / max_rows: length bounds in rows (inclusive).
        metadata: per-episode columns the index does not hold (a ``pyarrow.Table`` with an
            ``episode_index`` column, and a ``source`` column to tell sources apart); episodes
            missing from it have ``None`` there.
        split: ``"train"`` or ``"val"``: a seeded split of the episodes that pass the other
            criteria, ``round(val_fraction * n)`` of them in ``val`` (those whose keyed hash of
            ``(split_seed, key)`` is smallest), the rest in ``train``. The same seed gives the same
            split on every machine; another dataset's episodes do not move it.
    """

    episodes: Collection[int] | None = None
    keys: Collection[str] | None = None
    tasks: Collection[str] | str | None = None
    task_regex: str | None = None
    robots: Collection[str] | str | None = None
    where: Mapping[str, object] = field(default_factory=dict)
    min_rows: int | None = None
    max_rows: int | None = None
    metadata: pa.Table | None = None
    split: str | None = None
    val_fraction: float = 0.1
    split_seed: int = 0

    def __post_init__(self):
        if self.split not in (None, "train", "val"):
            raise ValueError(f"split must be 'train', 'val' or None, not {self.split!r}")
        if not 0 <= self.val_fraction <= 1:
            raise ValueError(f"val_fraction must be in [0, 1], not {self.val_fraction}")


def _column_values(index: WindowIndex, name: str, metadata: pa.Table | None = None) -> list:
    """Values of a per-episode column, one per episode of ``index`` (Python objects).

    Raises:
        KeyError: neither the index nor ``metadata`` has the column (naming the columns there are).
    """
    if name in index.episode_columns:
        return index.episode_column(name)
    if metadata is not None and name in metadata.column_names:
        sources = index.episode_column("source")
        episodes = index.episode_column("episode_index")
        by_source = "source" in metadata.column_names
        meta_src = metadata.column("source").to_pylist() if by_source else [None] * metadata.num_rows
        lookup = dict(
            zip(
                zip(meta_src, metadata.column("episode_index").to_pylist(), strict=True),
                metadata.column(name).to_pylist(),
                strict=True,
            )
        )
        return [lookup.get((s if by_source else None, e)) for s, e in zip(sources, episodes, strict=True)]
    have = sorted(index.episode_columns) + (sorted(metadata.column_names) if metadata is not None else [])
    raise KeyError(f"no per-episode column {name!r} in the index or metadata (columns: {have})")


def _matches(values: list, want) -> np.ndarray:
    """Bool per value: whether it matches ``want``.

    Bool per value: ``want`` is a callable, a collection (any of), or a value; list values match
    when any element does.
    """
    if callable(want):
        test: Callable = want
    elif isinstance(want, (list, tuple, set, frozenset, range)):
        pool = set(want)
        test = pool.__contains__
    else:
        test = functools.partial(operator.eq, want)
    return np.array(
        [any(bool(test(x)) for x in v) if isinstance(v, list) else bool(test(v)) for v in values], dtype=bool
    )


def split_val(keys: list[str], fraction: float, seed: int) -> np.ndarray:
    """Bool ``[n]``: the seeded validation split of ``keys``.

    Bool ``[n]``: the ``round(fraction * n)`` keys with the smallest blake2b hash of
    ``(seed, key)`` (ties by position) form the validation set.
    """
    digest = [int.from_bytes(hashlib.blake2b(f"{seed}:{k}".encode(), digest_size=8).digest(), "big") for k in keys]
    order = np.lexsort((np.arange(len(keys)), np.array(digest, dtype=np.uint64)))
    val = np.zeros(len(keys), dtype=bool)
    val[order[: round(fraction * len(keys))]] = True
    return val


def _shown(value) -> str:
    """A criterion's value as messages show it (long collections cut after 8 items)."""
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__name__", "a callable")
    if isinstance(value, (set, frozenset, list, tuple, range)) and not isinstance(value, str):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
        more = f", ... ({len(items)} in all)" if len(items) > 8 else ""
        return "[" + ", ".join(repr(v) for v in items[:8]) + more + "]"
    return repr(value)


def _criteria(index: WindowIndex, s: Selection) -> list[tuple[str, np.ndarray]]:
    """Each criterion of ``s`` before the split, as (how it reads, bool ``[num_episodes]`` of the episodes it keeps)."""
    criteria: list[tuple[str, str, object]] = [(f"where[{k!r}]={_shown(v)}", k, v) for k, v in s.where.items()]
    if s.episodes is not None:
        criteria.append((f"episodes={_shown(s.episodes)}", "episode_index", set(s.episodes)))
    if s.keys is not None:
        criteria.append((f"keys={_shown(s.keys)}", "key", set(s.keys)))
    if s.tasks is not None:
        tasks = {s.tasks} if isinstance(s.tasks, str) else set(s.tasks)
        criteria.append((f"tasks={_shown(tasks)}", "tasks", tasks))
    if s.task_regex is not None:
        pattern = re.compile(s.task_regex)
        criteria.append((f"task_regex={s.task_regex!r}", "tasks", lambda t: pattern.search(t) is not None))
    if s.robots is not None:
        robots = {s.robots} if isinstance(s.robots, str) else set(s.robots)
        criteria.append((f"robots={_shown(robots)}", "robot", robots))
    out = [(label, _matches(_column_values(index, name, s.metadata), want)) for label, name, want in criteria]
    if s.min_rows is not None:
        out.append((f"min_rows={s.min_rows}", np.asarray(index.num_rows >= s.min_rows, dtype=bool)))
    if s.max_rows is not None:
        out.append((f"max_rows={s.max_rows}", np.asarray(index.num_rows <= s.max_rows, dtype=bool)))
    return out


def select_episodes(index: WindowIndex, selection: Selection | None) -> np.ndarray:
    """Bool ``[num_episodes]``: the episodes of ``index`` that ``selection`` keeps (all when None).

    Pure: reads only the index (and ``selection.metadata``), never a shard. An empty result is
    returned as such (``WindowDataset`` refuses it: ``explain_empty`` says why).

    Raises:
        KeyError: a ``where`` column exists nowhere.
        re.error: ``task_regex`` is not a regular expression.
    """
    keep = np.ones(index.num_episodes, dtype=bool)
    if selection is None:
        return keep
    s = selection
    for _, mask in _criteria(index, s):
        keep &= mask
    if s.split is not None:
        kept = np.flatnonzero(keep)
        val = split_val([index.key(int(e)) for e in kept], s.val_fraction, s.split_seed)
        keep[kept] = val if s.split == "val" else ~val
    return keep


def explain_empty(index: WindowIndex, selection: Selection) -> str:
    """Why ``selection`` keeps no episode of ``index``: each criterion and how many episodes it alone keeps.

    E.g. ``"Selection(tasks=['wipe'], robots=['g1']) keeps none of its 4 episodes (tasks=['wipe']: 1;
    robots=['g1']: 0)"``; the split is named when the criteria keep episodes but the split none.
    """
    parts = _criteria(index, selection)
    described = ", ".join(label for label, _ in parts)
    if selection.split is not None:
        described += f"{', ' if described else ''}split={selection.split!r}, val_fraction={selection.val_fraction}"
    counts = "; ".join(f"{label}: {int(mask.sum())}" for label, mask in parts)
    both = np.ones(index.num_episodes, dtype=bool)
    for _, mask in parts:
        both &= mask
    if selection.split is not None and both.any():
        left = f"all of them together: {int(both.sum())}, none left in the {selection.split!r} split"
        counts += f"{'; ' if counts else ''}{left}"
    return f"Selection({described}) keeps none of its {index.num_episodes} episodes ({counts or 'no criteria'})"
