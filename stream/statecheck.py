"""Checks of a saved loader state before a reader resumes from it (``WindowDataset.load_state_dict``).

A state is a plain dict (``WindowDataset.state_dict``; ``WindowLoader`` and ``RayWindowLoader`` save the
same), often read back from a file. Every field is checked for its type and range here, and against the
reader's plan in ``WindowDataset.checked_states``, so that a damaged or hostile state is refused with an
error naming the field instead of silently dropping windows, running out of memory or failing deep inside
the planner.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "STATE_KEYS",
    "STATE_VERSION",
    "StateError",
    "StateTypeError",
    "bounded",
    "check_digest",
    "check_fields",
    "plan_digest",
    "states_of",
]

_MAX_EPOCH = 2**62  # far past any run; keeps the plan's seeding arithmetic in int64
# Earlier layouts of one epoch a state may record (``history``: one per elastic resume under another
# world size or worker count mid-epoch). A real run changes layout a handful of times an epoch; each
# level is replayed over the epoch's windows on every resume, so a longer history is refused before
# any of its entries is looked at.
_MAX_HISTORY = 256
# The version of the state's schema (its fields and their meaning), which a state records as
# ``"version"``; the plan's order has its own (``stream.plan.PLAN_VERSION``, recorded as
# ``"plan_version"``). Up to 4 one number versioned both (2: + "history", elastic resume; 3: +
# "shuffle_episodes"); 5: + "plan_version". Raise it when a field is added or changes meaning
# (``stream.resume._upgrade`` fills a new field in for older states).
STATE_VERSION = 5
# The fields a state of this version has (``WindowDataset.state_dict``; ``"fresh"``: ``WindowLoader``'s
# and ``RayWindowLoader``'s at an epoch boundary; ``"balance"``: ``BalancedWindowDataset``'s), and of
# one ``history`` entry. Any other key is refused: no state this reader writes has it.
STATE_KEYS = frozenset(
    {
        "version",
        "plan_version",
        "seed",
        "shuffle_episodes",
        "epoch",
        "world_size",
        "num_workers",
        "rank",
        "consumed",
        "rotation",
        "history",
        "plan_digest",
        "fresh",
        "balance",
    }
)
_HISTORY_KEYS = frozenset({"world_size", "num_workers", "consumed"})


class StateError(ValueError):
    """A loader state that cannot be resumed from; the message names the field and what it must be."""


class StateTypeError(StateError, TypeError):
    """A loader state field of the wrong type (also a ``TypeError``)."""


def _where(at: str, name: str) -> str:
    return f"load_state_dict: {at}field {name!r}"


def _int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(state: Mapping, name: str, lo: int, hi: int | None, at: str = "", why: str = "") -> int:
    """``state[name]`` as an int in ``lo .. hi`` (``hi`` None: no upper bound).

    Raises:
        StateTypeError: missing, or not an int (a bool is not one).
        StateError: out of range (``why`` explains the bound).
    """
    if name not in state:
        raise StateTypeError(f"{_where(at, name)} is missing (not a state from state_dict()?)")
    return bounded(state[name], name, lo, hi, at, why)


def bounded(value: object, name: str, lo: int, hi: int | None, at: str = "", why: str = "") -> int:
    """``value`` (the field ``name``) as an int in ``lo .. hi``; see ``_integer``."""
    if not _int(value):
        raise StateTypeError(f"{_where(at, name)} is {value!r} ({type(value).__name__}); must be an int")
    assert isinstance(value, numbers.Integral)
    number = int(value)
    if number < lo or (hi is not None and number > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise StateError(f"{_where(at, name)} is {number}; must be {span}" + (f" ({why})" if why else ""))
    return number


def _counts(state: Mapping, name: str, length: int, at: str = "", why: str = "") -> list[int]:
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


def plan_digest(arrays: Sequence[np.ndarray | None], *params: object) -> str:
    """A hex fingerprint of a plan: its episode table's ``arrays`` (None: absent) and scalar ``params``.

    Two readers whose plans differ (another dataset, selection, window spec or stride) give
    different digests, so a state saved by one is refused by the other (``check_digest``).
    O(episodes); the arrays are hashed with their dtype and shape.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(params).encode())
    for a in arrays:
        if a is None:
            h.update(b"none;")
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def check_digest(state: Mapping, digest: str, at: str = "") -> None:
    """Refuse a mid-epoch state saved under another plan (its ``plan_digest`` differs from ``digest``).

    A state without ``plan_digest`` (saved before it was recorded) or at an epoch boundary (nothing
    consumed: it loads into any plan) is not checked.

    Raises:
        StateTypeError: ``plan_digest`` is no str.
        StateError: another digest (the state is of another dataset, selection or window spec).
    """
    if "plan_digest" not in state:
        return
    saved = state["plan_digest"]
    if not isinstance(saved, str):
        raise StateTypeError(f"{_where(at, 'plan_digest')} is {saved!r}; must be a str (from state_dict())")
    consumed = state.get("consumed") or ()
    if saved != digest and (any(consumed) or state.get("history")):
        raise StateError(
            f"{_where(at, 'plan_digest')} is {saved[:64]!r}, this reader's plan is {digest!r}: the state was saved "
            "on another dataset, episode selection or window spec, so its window counts are not this plan's; resume "
            "on the same data and spec, or start an epoch fresh with set_epoch()"
        )


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
    unknown = sorted(map(str, set(state) - STATE_KEYS))
    if unknown:
        raise StateError(
            f"load_state_dict: {at}unknown field(s) {', '.join(repr(k) for k in unknown[:8])}"
            f"{' ...' if len(unknown) > 8 else ''}; a state of this version has only {sorted(STATE_KEYS)}"
        )
    if "fresh" in state and not isinstance(state["fresh"], bool):
        raise StateTypeError(f"{_where(at, 'fresh')} is {state['fresh']!r}; must be True or False")
    fresh = bool(state.get("fresh"))

    def needed(name: str) -> bool:
        return name in state or not fresh

    if "version" in state:
        _integer(state, "version", 1, version, at, "state versions this reader knows")
    if "plan_version" in state:
        _integer(state, "plan_version", 1, None, at, "a plan version")
    if needed("seed"):
        _integer(state, "seed", -(2**63), 2**64 - 1, at)
    _integer(state, "epoch", 0, _MAX_EPOCH, at)
    world = _integer(state, "world_size", 1, None, at) if needed("world_size") else 1
    if needed("rank"):
        _integer(state, "rank", 0, world - 1, at, f"ranks of world_size={world}")
    workers = _integer(state, "num_workers", 1, None, at) if needed("num_workers") else None
    if needed("consumed"):
        given = state.get("consumed")
        n = workers if workers is not None else len(given) if isinstance(given, (list, tuple)) else 0
        _counts(state, "consumed", n, at, f"one per worker of num_workers={n}")
    if "rotation" in state:  # states of the first version had none (0)
        n = workers if workers is not None else 2**31
        _integer(state, "rotation", 0, n - 1, at, f"workers of num_workers={n}")
    pool = state.get("shuffle_episodes")
    if pool is not None:
        bounded(pool, "shuffle_episodes", 0, None, at, "None or an episode count")
    history = state.get("history", [])
    if not isinstance(history, Sequence) or isinstance(history, (str, bytes)):
        raise StateTypeError(f"{_where(at, 'history')} is {history!r}; must be a list of earlier layouts")
    if len(history) > _MAX_HISTORY:  # before any entry is looked at
        raise StateError(
            f"{_where(at, 'history')} has {len(history)} entries; must have at most {_MAX_HISTORY} (one per change "
            "of world size or worker count within the epoch)"
        )
    for k, h in enumerate(history):
        name = f"history[{k}]"
        if not isinstance(h, Mapping):
            raise StateTypeError(f"{_where(at, name)} is {h!r}; must be a dict (world_size, num_workers, consumed)")
        extra = sorted(map(str, set(h) - _HISTORY_KEYS))
        if extra:
            raise StateError(
                f"load_state_dict: {at}{name} has unknown field(s) {', '.join(repr(x) for x in extra[:8])}; an entry "
                f"has only {sorted(_HISTORY_KEYS)}"
            )
        w = _integer(h, "world_size", 1, None, f"{at}{name} ")
        n = _integer(h, "num_workers", 1, None, f"{at}{name} ")
        _counts(h, "consumed", w * n, f"{at}{name} ", f"one per consumer of {w} ranks x {n} workers")
    if fresh and (any(state.get("consumed", ())) or history):
        raise StateError(
            f"load_state_dict: {at}field 'fresh' is True (an epoch boundary) but the state records windows "
            f"consumed (consumed {list(state['consumed'])}, {len(history)} earlier layouts)"
        )
    return state
