"""How many CPU threads PyTorch uses for a training run on the CPU.

``threads: auto`` takes one thread per idle core, by the rule every command shares
(:func:`specformer.machine.threads.auto_threads`). Matrix products can round differently with
another thread count, so a resumed run uses the count its checkpoint was saved with: its
numbers then match the uninterrupted run's.
"""

from __future__ import annotations

from specformer.machine.threads import auto_threads


def choose_threads(requested: int | str, *, saved: int | None = None) -> int:
    """The thread count for ``train.threads`` (``auto`` or a number), keeping ``saved`` on a resume."""
    if requested == "auto":
        return saved if saved else auto_threads()
    return int(requested)
