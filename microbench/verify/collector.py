"""Python's garbage collector as a trainer runs it, around every timed phase of verify.

torchtitan's trainer turns the automatic collector off, freezes what setup made, and collects
generation 1 every `gc_freq` steps (50), so no full collection lands inside a step or a save at
a random moment. Without that, a full collection over a rank's objects (the model, its DTensors,
the optimizer state, DCP's plans: a tenth of a second or more on a small CPU box) landed in the
timed loops every few repetitions, in whichever side it hit: a real load paid it where the
probe's loads beside it did not (docs/verify.md). Both sides of a comparison now run under this regime,
and `young()` collects at fixed points outside the clocks.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

EVERY_STEPS = 50  # torchtitan's default gc_freq
NOTE = (
    "automatic collection off, setup objects frozen, generation 1 collected outside the clocks "
    f"(between repetitions; every {EVERY_STEPS} steps in a job), as torchtitan's trainer runs it"
)


def start() -> None:
    """A full collection now, what setup made frozen, automatic collection off."""
    gc.collect()
    gc.freeze()
    gc.disable()


def stop() -> None:
    gc.enable()
    gc.unfreeze()


@contextmanager
def as_trainer() -> Iterator[None]:
    start()
    try:
        yield
    finally:
        stop()


def young() -> None:
    """A generation-1 collection, where a trainer's loop makes one: between timed work."""
    gc.collect(1)
