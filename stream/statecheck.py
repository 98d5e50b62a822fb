"""Checks of a saved loader state before a reader resumes from it (``WindowDataset.load_state_dict``).

A state is a plain dict (``WindowDataset.state_dict``; ``WindowLoader`` and ``RayWindowLoader`` save the
same), often read back from a file. Every field is checked for its type and range here, and against the
reader's plan in ``WindowDataset.checked_states``, so that a damaged or hostile state is refused with an
error naming the field instead of silently dropping windows, running out of memory or failing deep inside
the planner.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

MAX_EPOCH = 2**62  # far past any run; keeps the plan's seeding arithmetic in int64


class StateError(ValueError):
    """A loader state that cannot be resumed from; the message names the field and what it must be."""


class StateTypeError(StateError, TypeError):
    """A loader state field of the wrong type (also a ``TypeError``)."""


def _where(at: str, name: str) -> str:
    return f"load_state_dict: {at}field {name!r}"


def _int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(state: Mapping, name: str, lo: int, hi: int | None, at: str = "", why: str = "") -> int:
    """``state[name]`` as an int in ``lo .. hi`` (``hi`` None: no upper bound).

    Raises:
        StateTypeError: missing, or not an int (a bool is not one).
        StateError: out of range (``why`` explains the bound).
    """
    if name not in state:
        raise StateTypeError(f"{_where(at, name)} is missing (not a state from state_dict()?)")
    return bounded(state[name], name, lo, hi, at, why)


def bounded(value: object, name: str, lo: int, hi: int | None, at: str = "", why: str = "") -> int:
    """``value`` (the field ``name``) as an int in ``lo .. hi``; see ``integer``."""
    if not _int(value):
        raise StateTypeError(f"{_where(at, name)} is {value!r} ({type(value).__name__}); must be an int")
    assert isinstance(value, numbers.Integral)
    number = int(value)
    if number < lo or (hi is not None and number > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise StateError(f"{_where(at, name)} is {number}; must be {span}" + (f" ({why})" if why else ""))
    return number


def counts(state: Mapping, name: str, length: int, at: str = "", why: str = "") -> list[int]:
    """``state[name]``: a list of ``length`` ints >= 0 (upper bounds are the plan's: ``WindowDataset``).

    Raises:
        StateTypeError: missing, not a list or tuple, or an item not an int.
        StateError: another length (``why``: what fixes it), or a negative item.
    """
    if name not in state:
        raise StateTypeError(f"{_where(at, name)} is missing (not a state from state_dict()?)")
    value = state[name]
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise StateTypeError(f"{_where(at, name)} is {value!r}; must be a list of {length} ints")
    if len(value) != length:
        because = f" ({why})" if why else ""
        raise StateError(f"{_where(at, name)} has {len(value)} entries; must have {length}{because}")
    return [bounded(v, f"{name}[{i}]", 0, None, at) for i, v in enumerate(value)]


def states_of(state: object) -> list[dict]:
    """The states given to ``load_state_dict``: one dict, or a non-empty list (or tuple) of dicts.

    Raises:
        StateTypeError: anything else (naming the item that is no dict).
        StateError: an empty list.
    """
    if isinstance(state, Mapping):
        return [dict(state)]
    if isinstance(state, (list, tuple)):
        if not state:
            raise StateError("load_state_dict: no state given (an empty list)")
        for i, s in enumerate(state):
            if not isinstance(s, Mapping):
                raise StateTypeError(
                    f"load_state_dict: state [{i}] of the list is {type(s).__name__}; must be a dict from state_dict()"
                )
        return [dict(s) for s in state]
    raise StateTypeError(
        f"load_state_dict: the state is {type(state).__name__}; must be a dict from state_dict() or a list of them"
    )


def check_fields(state: dict, version: int, at: str = "") -> dict:
    """Every field of one state checked for type and range (not yet against a plan); returns it.

    ``version``: the newest state version this reader writes. ``at``: where the state is in the
    list (``"state [2] "``), for messages. A state at an epoch boundary (``"fresh": True``) needs only
    its ``epoch``; the other fields are checked when present.

    Raises:
        StateTypeError / StateError: naming the field, what it is and what it must be.
    """
    if "fresh" in state and not isinstance(state["fresh"], bool):
        raise StateTypeError(f"{_where(at, 'fresh')} is {state['fresh']!r}; must be True or False")
    fresh = bool(state.get("fresh"))

    def needed(name: str) -> bool:
        return name in state or not fresh

    if "version" in state:
        integer(state, "version", 1, version, at, "state versions this reader knows")
    if needed("seed"):
        integer(state, "seed", -(2**63), 2**64 - 1, at)
    integer(state, "epoch", 0, MAX_EPOCH, at)
    world = integer(state, "world_size", 1, None, at) if needed("world_size") else 1
    if needed("rank"):
        integer(state, "rank", 0, world - 1, at, f"ranks of world_size={world}")
    workers = integer(state, "num_workers", 1, None, at) if needed("num_workers") else None
    if needed("consumed"):
        given = state.get("consumed")
        n = workers if workers is not None else len(given) if isinstance(given, (list, tuple)) else 0
        counts(state, "consumed", n, at, f"one per worker of num_workers={n}")
    if "rotation" in state:  # states of the first version had none (0)
        n = workers if workers is not None else 2**31
        integer(state, "rotation", 0, n - 1, at, f"workers of num_workers={n}")
    pool = state.get("shuffle_episodes")
    if pool is not None:
        bounded(pool, "shuffle_episodes", 0, None, at, "None or an episode count")
    history = state.get("history", [])
    if not isinstance(history, Sequence) or isinstance(history, (str, bytes)):
        raise StateTypeError(f"{_where(at, 'history')} is {history!r}; must be a list of earlier layouts")
    for k, h in enumerate(history):
        name = f"history[{k}]"
        if not isinstance(h, Mapping):
            raise StateTypeError(f"{_where(at, name)} is {h!r}; must be a dict (world_size, num_workers, consumed)")
        w = integer(h, "world_size", 1, None, f"{at}{name} ")
        n = integer(h, "num_workers", 1, None, f"{at}{name} ")
        counts(h, "consumed", w * n, f"{at}{name} ", f"one per consumer of {w} ranks x {n} workers")
    if fresh and (any(state.get("consumed", ())) or history):
        raise StateError(
            f"load_state_dict: {at}field 'fresh' is True (an epoch boundary) but the state records windows "
            f"consumed (consumed {list(state['consumed'])}, {len(history)} earlier layouts)"
        )
    return state
