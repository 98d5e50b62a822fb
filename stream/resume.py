"""Exact and elastic mid-epoch resume of a ``WindowDataset``: its state, and continuing from one.

A state records where each consumer of a rank stands in its plan of the epoch (``state_dict``);
``load_state`` continues from it exactly, under the same layout or, given every rank's state, under
another one (elastic resume, ``stream.plan.level_plan``). Every field of a state is checked first
(``checked_states``, ``stream.statecheck``). ``WindowDataset.state_dict`` / ``load_state_dict`` call
these.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Literal, Protocol

from .options import Ranks
from .plan import PLAN_VERSION, SAME_PLAN_SINCE, LevelOverrun, Progress
from .statecheck import STATE_VERSION, StateError, bounded, check_digest, check_fields, states_of

__all__ = ["Cursor", "Resumable", "Resume", "checked_states", "load_state", "state_dict"]


@dataclass(frozen=True)
class Resume:
    """Where a rank's run of an epoch starts (the loader's bookkeeping, from ``load_state_dict``).

    ``history``: complete progress of earlier layouts of the epoch (elastic resume), oldest first;
    the windows left after it are dealt to this layout. ``skip``: windows each consumer of this
    rank (``worker`` order, empty: none) already took of its plan; worker ``w`` continues consumer
    ``(w + rotation) % num_workers`` (the DataLoader's round-robin resumes at batch ``rotation``).
    """

    epoch: int
    history: tuple[Progress, ...] = ()
    skip: tuple[int, ...] = ()
    rotation: int = 0

    @property
    def fresh(self) -> bool:
        """Nothing of the epoch consumed yet."""
        return not self.history and not any(self.skip)


@dataclass
class Cursor:
    """Where a ``WindowDataset``'s iteration stands in its epoch: what resume saves and restores.

    The dataset owns one (``WindowDataset.cursor``; a loader's view and each worker's copy their
    own); ``state_dict`` reads it, ``load_state`` and the loaders set ``pending``.

    Attributes:
        pending: where the next iteration starts (``load_state``'s result), or None: from the
            start of the epoch it runs. ``begin`` takes it.
        started: where the last iteration in this process started.
        consumed: samples that iteration yielded, counting the ``skip`` it started after.
    """

    pending: Resume | None = None
    started: Resume = Resume(0)
    consumed: int = 0

    def begin(self, epoch: int, workers: int, worker: int) -> tuple[Resume, int, int]:
        """Start an iteration of ``epoch`` as DataLoader worker ``worker`` of ``workers``.

        Takes ``pending`` when it is for ``epoch``; returns (the start, the consumer of the plan this
        worker continues, the windows of it already taken).

        Raises:
            ValueError: ``pending`` was loaded for another number of workers (naming both).
        """
        start = self.pending if self.pending is not None and self.pending.epoch == epoch else Resume(epoch)
        self.pending = None
        if start.skip and len(start.skip) != workers:
            raise ValueError(
                f"the resume state was loaded for {len(start.skip)} workers but {workers} iterate: "
                "pass the DataLoader's num_workers to load_state_dict (WindowLoader does)"
            )
        consumer = (worker + start.rotation) % workers
        skip = start.skip[consumer] if start.skip else 0
        self.started, self.consumed = start, skip
        return start, consumer, skip


class Resumable(Protocol):
    """What resuming takes from (and sets on) the ``WindowDataset`` it resumes (``stream.dataset``)."""

    epoch: int  # the epoch the next iteration runs
    shuffle: int | Literal["auto", "global"] | None  # the shuffle as given ("auto": resolved by pool_episodes)
    cursor: Cursor  # where the iteration stands

    @property
    def seed(self) -> int:
        """The plan's seed."""
        ...

    @property
    def batch_size(self) -> int | None:
        """The per-rank batch size, when known."""
        ...

    @property
    def ranks(self) -> Ranks:
        """This process's rank and world size (``Ranks.world``)."""
        ...

    @property
    def plan_digest(self) -> str:
        """Fingerprint of the episode table and window spec."""
        ...

    def pool_episodes(self, batch_size: int | None = None) -> int | None:
        """The shuffle pool in effect."""
        ...

    def windows_per_consumer(
        self, epoch: int, world_size: int, num_workers: int, history: tuple[Progress, ...] = ()
    ) -> int:
        """Windows each (rank, worker) yields in ``epoch`` after ``history``."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next iteration."""
        ...


def state_dict(
    ds: Resumable,
    batches: int | None = None,
    batch_size: int | None = None,
    num_workers: int = 0,
    epoch: int | None = None,
    start: Resume | None = None,
) -> dict:
    """Position of this rank in the current epoch, for ``load_state_dict``.

    Without arguments (iteration in this process, ``num_workers=0``): the samples yielded so far.
    ``WindowLoader.state_dict`` passes the ``batches`` consumed since ``start`` (where its run
    of the epoch began), ``batch_size``, ``num_workers`` and the epoch it is in. Consumer ``c``
    of the rank took ``consumed[c]`` windows of its plan (the DataLoader's in-order round-robin
    gives worker ``w`` batches ``w, w + K, ...``, so the counts follow from ``batches``).

    A loader's state at an epoch boundary (no batch consumed since a fresh ``start``) carries
    ``"fresh": True``: nothing is consumed, so it loads under any layout (``load_state``).
    """
    here = ds.ranks.world()
    workers = max(num_workers, 1)
    if batches is None:  # iterated in this process
        start = ds.cursor.started if ds.cursor.consumed else Resume(ds.epoch)
        consumed, rotation = [ds.cursor.consumed], 0
    else:
        epoch = ds.epoch if epoch is None else epoch
        start = start if start is not None and start.epoch == epoch else Resume(epoch)
        per = ds.windows_per_consumer(start.epoch, here.world_size, workers, start.history)
        consumed = list(start.skip) or [0] * workers
        for w in range(min(batches, workers)):
            c = (w + start.rotation) % workers
            consumed[c] = min(consumed[c] + -(-(batches - w) // workers) * int(batch_size or 1), per)
        rotation = (start.rotation + batches) % workers
    state = {
        "version": STATE_VERSION,
        "plan_version": PLAN_VERSION,
        "seed": ds.seed,
        "shuffle_episodes": ds.pool_episodes(None if batches is None else batch_size),
        "epoch": start.epoch,
        "world_size": here.world_size,
        "num_workers": workers,
        "rank": here.rank,
        "consumed": consumed,
        "rotation": rotation,
        "history": [
            {"world_size": p.world_size, "num_workers": p.num_workers, "consumed": list(p.consumed)}
            for p in start.history
        ],
        "plan_digest": ds.plan_digest,
    }
    return {**state, "fresh": True} if batches == 0 and start.fresh else state


def load_state(ds: Resumable, state: dict | list[dict], num_workers: int = 0) -> None:
    """Continue exactly where ``state`` was taken.

    ``state``: this rank's state (from the same layout: the next sample or batch is the one the
    uninterrupted run would have yielded next), or the states of **every** rank of the run that
    saved them, as a list (any layout: elastic resume). Under another layout (world size or
    worker count) the windows of the epoch not consumed by any rank are dealt again to this
    layout's consumers (``stream.plan.level_plan``): each is yielded once, every rank yields the
    same number, and ``R mod (world_size x workers)`` of them (``R`` windows left) are left out
    at random; the next epoch is this layout's own plan.

    Raises:
        StateError (a ``ValueError``; ``StateTypeError`` also a ``TypeError``): a field of a state
            is missing, of the wrong type, or out of range for this plan (``checked_states``).
        ValueError: the states were saved with another seed, or disagree (epoch, layout), or
            the layout changed and not every rank's state was given.
    """
    here = ds.ranks.world()
    bounded(num_workers, "num_workers (argument)", 0, None, "", "the DataLoader's worker count")
    workers = max(num_workers, 1)
    states = [_upgrade(s) for s in checked_states(ds, state)]
    first = states[0]
    if all(s.get("fresh") for s in states):  # an epoch boundary: loads under any layout
        ds.set_epoch(first["epoch"])
        ds.cursor.pending, ds.cursor.consumed = None, 0
        return
    if ds.shuffle == "auto" and not ds.batch_size and "shuffle_episodes" in first:
        ds.shuffle = first["shuffle_episodes"]  # no batch size here: the saving run's pool
    _check_plan(first, ds.pool_episodes())
    epoch, old_world, old_workers = first["epoch"], first["world_size"], first["num_workers"]
    history = tuple(Progress(h["world_size"], h["num_workers"], tuple(h["consumed"])) for h in first["history"])
    mine = [s for s in states if s["rank"] == here.rank]
    same = (old_world, old_workers) == (here.world_size, workers)
    if not same and len(states) != old_world:  # before any list of old_world entries is made
        ranks = sorted(s["rank"] for s in states)
        raise StateError(
            f"cannot resume: the state was saved with world_size={old_world}, this run has "
            f"world_size={here.world_size} (num_workers {old_workers} then, {workers} now). Resuming under "
            f"another layout needs the states of all {old_world} ranks (a list; got ranks "
            f"{ranks[:16]}{'...' if len(ranks) > 16 else ''}); or start the next epoch fresh with "
            f"set_epoch({epoch + 1})."
        )
    _check_counts(ds, states, epoch, history)
    if same and mine:
        start = Resume(epoch, history, tuple(mine[0]["consumed"]), mine[0].get("rotation", 0))
        consumed, per = start.skip, ds.windows_per_consumer(epoch, old_world, old_workers, history)
    else:
        ranks = sorted(s["rank"] for s in states)
        if same and ranks != list(range(old_world)):
            raise ValueError(f"cannot resume: the states are of ranks {ranks}, not of this rank {here.rank}")
        if ranks != list(range(old_world)):
            raise ValueError(
                f"cannot resume: the state was saved with world_size={old_world}, this run has "
                f"world_size={here.world_size} (num_workers {old_workers} then, {workers} now). Resuming under "
                f"another layout needs the states of all {old_world} ranks (a list; got ranks {ranks}); or "
                f"start the next epoch fresh with set_epoch({epoch + 1})."
            )
        consumed = tuple(c for s in sorted(states, key=lambda s: s["rank"]) for c in s["consumed"])
        progress = Progress(old_world, old_workers, consumed)
        per = ds.windows_per_consumer(epoch, old_world, old_workers, history)
        start = Resume(epoch, (*history, progress), (0,) * workers, 0)
    if all(c >= per for c in consumed):
        ds.epoch, ds.cursor.pending = epoch + 1, None  # the epoch was finished
    else:
        ds.epoch, ds.cursor.pending = epoch, start
    ds.cursor.consumed = 0


def checked_states(ds: Resumable, state: object) -> list[dict]:
    """The states given to ``load_state_dict``, every field checked (``stream.statecheck``) and their agreement.

    Types and ranges of every field (version, seed, epoch, world size and rank, worker count,
    consumed counts, rotation, shuffle pool, history), then: the seed is this reader's, the
    states of a list agree on seed, epoch, layout and history, and each rank's state comes once.
    The consumed counts are checked against the plan by ``load_state_dict`` (``_check_counts``).
    ``WindowLoader`` and ``RayWindowLoader`` call this before they take a state at an epoch boundary.

    Raises:
        StateError / StateTypeError: naming the field (and the state of the list).
        ValueError: another seed.
    """
    states = states_of(state)
    for i, s in enumerate(states):
        check_fields(s, STATE_VERSION, f"state [{i}] " if len(states) > 1 else "")
        check_digest(s, ds.plan_digest, f"state [{i}] " if len(states) > 1 else "")
    first = states[0]
    if "seed" in first and first["seed"] != ds.seed:
        raise StateError(
            f"cannot resume: the state was saved with seed={first['seed']}, this run has seed={ds.seed}. "
            f"Resume with the same seed, or start the next epoch fresh with set_epoch({first['epoch'] + 1})."
        )
    for s in states[1:]:
        for key in ("seed", "epoch", "world_size", "num_workers", "history"):
            if s.get(key) != first.get(key):
                raise StateError(f"cannot resume: the states disagree on {key} ({first.get(key)} vs {s.get(key)})")
    ranks = [s.get("rank", 0) for s in states]
    if len(set(ranks)) != len(ranks):
        twice = min(r for r, n in collections.Counter(ranks).items() if n > 1)
        raise StateError(f"load_state_dict: field 'rank' is {twice} in more than one state; give each rank's once")
    return states


def _check_counts(ds: Resumable, states: list[dict], epoch: int, history: tuple[Progress, ...]) -> None:
    """Every consumed count of ``states`` (and of their ``history``) within its consumer's windows in this plan.

    Raises:
        StateError: a count above the windows its consumer has in ``epoch`` under its layout.
    """
    first = states[0]
    try:  # one replay of the history checks every level's counts (linear in its length)
        per = ds.windows_per_consumer(epoch, first["world_size"], first["num_workers"], history)
    except LevelOverrun as exc:
        level = history[exc.level]
        raise StateError(
            f"load_state_dict: field 'history[{exc.level}].consumed[{exc.consumer}]' is {exc.consumed}; must be "
            f"0..{exc.windows} (windows per consumer in epoch {epoch} of this plan under {level.world_size} ranks "
            f"x {level.num_workers} workers)"
        ) from exc
    for i, s in enumerate(states):
        at = f"state [{i}] " if len(states) > 1 else ""
        for c, n in enumerate(s["consumed"]):
            if n > per:
                raise StateError(
                    f"load_state_dict: {at}field 'consumed[{c}]' is {n}; must be 0..{per} (windows per consumer "
                    f"in epoch {epoch} of this plan under {first['world_size']} ranks x {first['num_workers']} "
                    "workers)"
                )


def _check_plan(state: dict, pool: int | None) -> None:
    """Refuse a mid-epoch state whose epoch plan differs from this reader's (planner or shuffle pool).

    Raises:
        ValueError: the state is of a version before the plan-level shuffle's equal pools, or its shuffle pool
            (``shuffle_episodes``, resolved) differs.
    """
    consumed = any(state["consumed"]) or state["history"]
    if state["plan_version"] < SAME_PLAN_SINCE and consumed:
        raise ValueError(
            f"cannot resume: the state (plan version {state['plan_version']}) was saved mid-epoch by a reader whose "
            f"plan (shuffle buffer, anchor draws, pool cuts) this version no longer makes; start the next epoch "
            f"fresh with set_epoch({state['epoch'] + 1})"
        )
    if "shuffle_episodes" in state and state["shuffle_episodes"] != pool and consumed:
        raise ValueError(
            f"cannot resume: the state was saved with shuffle_episodes={state['shuffle_episodes']}, this run plans "
            f"with {pool} (the default follows the batch size and the frame cache): "
            f"pass WindowDataset(shuffle={state['shuffle_episodes']})"
        )


def _upgrade(state: dict) -> dict:
    """A state of any ``STATE_VERSION`` in the current form.

    Version 1 had no ``history``; up to version 4 ``"version"`` was the plan's version too (its
    ``"plan_version"``). A mid-epoch state of a ``"plan_version"`` newer than this reader's
    ``PLAN_VERSION`` is of a plan this reader does not make: refused.
    """
    if state.get("version", 1) > STATE_VERSION:
        raise ValueError(f"cannot resume: state version {state['version']} is newer than this reader's {STATE_VERSION}")
    version = state.get("version", 1)
    plan_version = state.get("plan_version", version if version <= 4 else PLAN_VERSION)
    if plan_version > PLAN_VERSION and (any(state.get("consumed") or ()) or state.get("history")):
        raise ValueError(
            f"cannot resume: the state's plan version {plan_version} is newer than this reader's {PLAN_VERSION}; "
            f"start the next epoch fresh with set_epoch({state.get('epoch', 0) + 1})"
        )
    return {"history": [], **state, "plan_version": plan_version}
