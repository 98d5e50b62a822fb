"""One convention for seeded randomness in every plan (``stream.plan``, ``balance``).

A plan draws from ``rng_for(seed, epoch, salt, ...)``: numpy's ``default_rng`` seeded with the
sequence ``[seed mod 2**64, epoch, *salt]`` (numpy's ``SeedSequence`` mixes all entries, so streams
of different salts are independent). ``seed`` is any Python integer: it is reduced modulo 2**64 so
that a negative or very large seed is accepted and seeds equal modulo 2**64 give the same plans.
Each use site takes its own salt constant, so two draws never share a stream by accident.

Torch-free on purpose: ``balance`` imports it without importing the reader.

Internal: the packages' shared infrastructure; users import from ``epishard`` (the curated API).
"""

from __future__ import annotations

import numpy as np

__all__ = ["rng_for"]

_SEED_MODULUS = 1 << 64


def rng_for(seed: int, epoch: int, *salt: int) -> np.random.Generator:
    """A numpy Generator determined by ``(seed mod 2**64, epoch, *salt)`` only (the module's convention)."""
    return np.random.default_rng([seed % _SEED_MODULUS, epoch, *salt])
