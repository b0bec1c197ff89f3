"""Timed rounds of ``train_bench.py`` whose compared variants step in turns.

Whether ``torch.compile`` makes a step slower, or RecStore's step is faster
than FBGEMM's, is a ratio of two step times that each move by tens of percent
with the load on a shared machine. Timing all of one variant's steps and then
all of the other's lets a burst of load land on one side only; here, within
each round, the variants of a group step in turns on the same batch (who goes
first rotates from step to step and round to round), so each step has its
partners timed next to it under the same load. The figure of merit of two
variants of a group is the median over those steps of one's time over the
other's; variants in no group run their steps of the round in one go.

The TBE bench groups FBGEMM with RecStore's eager and compiled model, and
torch's own ``nn.EmbeddingBag`` model with its compiled self: what
``torch.compile`` costs a model with nothing for inductor to fuse is then
measured beside RecStore's figure, under the same load.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

#: a step of variant ``name`` on the round's batch ``index``; returns its seconds
Step = Callable[[str, int], float]


def timed_round(
    names: Sequence[str],
    groups: Sequence[Sequence[str]],
    steps: int,
    step: Step,
    times: dict[str, list[float]],
    round_index: int,
) -> None:
    """One round: ``steps`` steps of each variant, a group's in turns where its first
    member comes in ``names``. The members of a group get one sample per step each, so
    their lists in ``times`` stay aligned step by step (what ``paired_ratio`` reads)."""
    by_first = {group[0]: group for group in groups}
    grouped = {name for group in groups for name in group}
    for name in names:
        group = by_first.get(name)
        if group is None:
            if name not in grouped:
                for index in range(steps):
                    times[name].append(step(name, index))
            continue
        for index in range(steps):
            turn = (index + round_index) % len(group)
            for who in [*group[turn:], *group[:turn]]:
                times[who].append(step(who, index))


def paired_ratio(times: dict[str, list[float]], base: str, other: str) -> float:
    """Median over the steps taken in turns of ``other``'s time / ``base``'s."""
    pairs = list(zip(times[base], times[other], strict=True))
    return statistics.median(b / a for a, b in pairs)


def summary(times: dict[str, list[float]], eager: str, compiled: str) -> dict[str, Any]:
    """The compiled-vs-eager figures: median paired ratio, and the ratio of median steps."""
    eager_s, compiled_s = statistics.median(times[eager]), statistics.median(times[compiled])
    return {
        "pairs": len(times[eager]),
        "median_paired_ratio": paired_ratio(times, eager, compiled),
        "ratio_of_medians": compiled_s / eager_s,
        "eager_median_step_s": eager_s,
        "compiled_median_step_s": compiled_s,
    }


def describe(figures: dict[str, Any], what: str = "same model, local backend") -> str:
    return (
        f"torch.compile vs eager ({what}): median over "
        f"{figures['pairs']} paired steps {figures['median_paired_ratio']:.3f}x "
        f"(median steps {figures['compiled_median_step_s'] * 1e3:.2f} ms vs "
        f"{figures['eager_median_step_s'] * 1e3:.2f} ms: {figures['ratio_of_medians']:.3f}x)"
    )
