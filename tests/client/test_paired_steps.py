"""bench/paired_steps.py: eager and compiled steps taken in turns, one ratio per pair."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "paired_steps", Path(__file__).resolve().parents[2] / "bench" / "paired_steps.py"
)
assert SPEC is not None and SPEC.loader is not None
paired = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(paired)

COST = {"torch": 1.0, "eager": 2.0, "compiled": 3.0}


def test_the_pair_steps_in_turns_on_the_same_batch_and_others_in_one_go() -> None:
    calls: list[tuple[str, int]] = []

    def step(name: str, index: int) -> float:
        calls.append((name, index))
        return COST[name]

    times: dict[str, list[float]] = {name: [] for name in COST}
    ratios: list[float] = []
    for round_index in range(2):
        paired.timed_round(list(COST), ("eager", "compiled"), 2, step, times, ratios, round_index)
    assert calls == [
        ("torch", 0), ("torch", 1),
        ("eager", 0), ("compiled", 0), ("compiled", 1), ("eager", 1),
        ("torch", 0), ("torch", 1),
        ("compiled", 0), ("eager", 0), ("eager", 1), ("compiled", 1),
    ]  # fmt: skip
    assert ratios == [1.5] * 4
    assert {name: len(samples) for name, samples in times.items()} == dict.fromkeys(COST, 4)
    figures = paired.summary(times, ("eager", "compiled"), ratios)
    assert figures["median_paired_ratio"] == 1.5 and figures["pairs"] == 4


def test_without_a_pair_every_variant_steps_in_one_go() -> None:
    calls: list[str] = []

    def step(name: str, index: int) -> float:
        calls.append(name)
        return 1.0

    times: dict[str, list[float]] = {"torch": [], "eager": []}
    ratios: list[float] = []
    paired.timed_round(["torch", "eager"], None, 2, step, times, ratios, 0)
    assert calls == ["torch", "torch", "eager", "eager"] and ratios == []
