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
    ratios: dict[tuple[str, str], list[float]] = {}
    pair = ("eager", "compiled")
    for round_index in range(2):
        paired.timed_round(list(COST), [pair], 2, step, times, ratios, round_index)
    assert calls == [
        ("torch", 0), ("torch", 1),
        ("eager", 0), ("compiled", 0), ("compiled", 1), ("eager", 1),
        ("torch", 0), ("torch", 1),
        ("compiled", 0), ("eager", 0), ("eager", 1), ("compiled", 1),
    ]  # fmt: skip
    assert ratios == {pair: [1.5] * 4}
    assert {name: len(samples) for name, samples in times.items()} == dict.fromkeys(COST, 4)
    figures = paired.summary(times, pair, ratios[pair])
    assert figures["median_paired_ratio"] == 1.5 and figures["pairs"] == 4


def test_without_a_pair_every_variant_steps_in_one_go() -> None:
    calls: list[str] = []

    def step(name: str, index: int) -> float:
        calls.append(name)
        return 1.0

    times: dict[str, list[float]] = {"torch": [], "eager": []}
    ratios: dict[tuple[str, str], list[float]] = {}
    paired.timed_round(["torch", "eager"], [], 2, step, times, ratios, 0)
    assert calls == ["torch", "torch", "eager", "eager"] and ratios == {}


def test_two_pairs_each_step_in_turns_and_keep_their_own_ratios() -> None:
    cost = {"torch": 1.0, "torch-compiled": 1.25, "eager": 2.0, "compiled": 3.0}
    calls: list[tuple[str, int]] = []

    def step(name: str, index: int) -> float:
        calls.append((name, index))
        return cost[name]

    times: dict[str, list[float]] = {name: [] for name in cost}
    ratios: dict[tuple[str, str], list[float]] = {}
    pairs = [("eager", "compiled"), ("torch", "torch-compiled")]
    paired.timed_round(list(cost), pairs, 2, step, times, ratios, 0)
    assert calls == [
        ("torch", 0), ("torch-compiled", 0), ("torch-compiled", 1), ("torch", 1),
        ("eager", 0), ("compiled", 0), ("compiled", 1), ("eager", 1),
    ]  # fmt: skip
    assert ratios == {pairs[0]: [1.5, 1.5], pairs[1]: [1.25, 1.25]}
    assert {name: len(samples) for name, samples in times.items()} == dict.fromkeys(cost, 2)
