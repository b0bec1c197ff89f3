"""bench/paired_steps.py: grouped variants step in turns on the same batch, one ratio a step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "paired_steps", Path(__file__).resolve().parents[2] / "bench" / "paired_steps.py"
)
assert SPEC is not None and SPEC.loader is not None
paired = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(paired)


def _recording(cost: dict[str, float]) -> tuple[list[tuple[str, int]], object]:
    calls: list[tuple[str, int]] = []

    def step(name: str, index: int) -> float:
        calls.append((name, index))
        return cost[name] * (index + 1)  # later batches take longer: ratios stay per step

    return calls, step


def test_a_pair_steps_in_turns_on_the_same_batch_and_others_in_one_go() -> None:
    cost = {"torch": 1.0, "eager": 2.0, "compiled": 3.0}
    calls, step = _recording(cost)
    times: dict[str, list[float]] = {name: [] for name in cost}
    for round_index in range(2):
        paired.timed_round(list(cost), [["eager", "compiled"]], 2, step, times, round_index)
    assert calls == [
        ("torch", 0), ("torch", 1),
        ("eager", 0), ("compiled", 0), ("compiled", 1), ("eager", 1),
        ("torch", 0), ("torch", 1),
        ("compiled", 0), ("eager", 0), ("eager", 1), ("compiled", 1),
    ]  # fmt: skip
    assert {name: len(samples) for name, samples in times.items()} == dict.fromkeys(cost, 4)
    assert paired.paired_ratio(times, "eager", "compiled") == 1.5
    figures = paired.summary(times, "eager", "compiled")
    assert figures["median_paired_ratio"] == 1.5 and figures["pairs"] == 4


def test_without_a_group_every_variant_steps_in_one_go() -> None:
    calls, step = _recording({"torch": 1.0, "eager": 1.0})
    times: dict[str, list[float]] = {"torch": [], "eager": []}
    paired.timed_round(["torch", "eager"], [], 2, step, times, 0)
    assert calls == [("torch", 0), ("torch", 1), ("eager", 0), ("eager", 1)]


def test_groups_rotate_who_goes_first_and_keep_their_samples_aligned() -> None:
    cost = {"torch": 1.0, "torch-compiled": 1.25, "fbgemm": 4.0, "eager": 2.0, "compiled": 3.0}
    calls, step = _recording(cost)
    times: dict[str, list[float]] = {name: [] for name in cost}
    groups = [["fbgemm", "eager", "compiled"], ["torch", "torch-compiled"]]
    paired.timed_round(list(cost), groups, 3, step, times, 1)
    assert calls == [
        ("torch-compiled", 0), ("torch", 0), ("torch", 1), ("torch-compiled", 1),
        ("torch-compiled", 2), ("torch", 2),
        ("eager", 0), ("compiled", 0), ("fbgemm", 0),
        ("compiled", 1), ("fbgemm", 1), ("eager", 1),
        ("fbgemm", 2), ("eager", 2), ("compiled", 2),
    ]  # fmt: skip
    assert paired.paired_ratio(times, "fbgemm", "eager") == 0.5
    assert paired.paired_ratio(times, "torch", "torch-compiled") == 1.25
