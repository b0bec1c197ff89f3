"""Timed rounds of ``train_bench.py`` with eager and compiled steps taken in pairs.

Whether ``torch.compile`` makes a step slower is a ratio of two step times
that each move by tens of percent with the load on a shared machine. Timing
all of one variant's steps and then all of the other's lets a burst of load
land on one side only; here, within each round, the eager and the compiled
model step in turns on the same batch (who goes first alternates from step
to step and round to round), so each compiled step has an eager partner timed
next to it under the same load. The figure of merit is the median over all
pairs of compiled time / eager time; every other variant runs its steps of the
round in one go, as before. Several pairs can run in one round: the TBE bench
pairs torch's own ``nn.EmbeddingBag`` model with its compiled self too, so what
``torch.compile`` costs a model with nothing for inductor to fuse is measured
beside RecStore's figure, under the same load.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

#: a step of variant ``name`` on the round's batch ``index``; returns its seconds
Step = Callable[[str, int], float]


#: an (eager, compiled) pair of variant names
Pair = tuple[str, str]


def timed_round(
    names: Sequence[str],
    pairs: Sequence[Pair],
    steps: int,
    step: Step,
    times: dict[str, list[float]],
    ratios: dict[Pair, list[float]],
    round_index: int,
) -> None:
    """One round: ``steps`` steps of each variant; each of ``pairs`` (eager, compiled) in
    turns where its eager variant comes, each pair's compiled/eager time appended to
    ``ratios[pair]``."""
    by_eager = {pair[0]: pair for pair in pairs}
    partners = {pair[1] for pair in pairs}
    for name in names:
        if name in partners:
            continue  # stepped with its partner
        pair = by_eager.get(name)
        if pair is None:
            for index in range(steps):
                times[name].append(step(name, index))
            continue
        for index in range(steps):
            order = pair if (index + round_index) % 2 == 0 else pair[::-1]
            taken = {who: step(who, index) for who in order}
            for who, seconds in taken.items():
                times[who].append(seconds)
            ratios.setdefault(pair, []).append(taken[pair[1]] / taken[pair[0]])


def summary(times: dict[str, list[float]], pair: Pair, ratios: list[float]) -> dict[str, Any]:
    """The compiled-vs-eager figures: median paired ratio, and the ratio of median steps."""
    eager, compiled = (statistics.median(times[name]) for name in pair)
    return {
        "pairs": len(ratios),
        "median_paired_ratio": statistics.median(ratios),
        "ratio_of_medians": compiled / eager,
        "eager_median_step_s": eager,
        "compiled_median_step_s": compiled,
    }


def describe(figures: dict[str, Any], what: str = "same model, local backend") -> str:
    return (
        f"torch.compile vs eager ({what}): median over "
        f"{figures['pairs']} paired steps {figures['median_paired_ratio']:.3f}x "
        f"(median steps {figures['compiled_median_step_s'] * 1e3:.2f} ms vs "
        f"{figures['eager_median_step_s'] * 1e3:.2f} ms: {figures['ratio_of_medians']:.3f}x)"
    )
