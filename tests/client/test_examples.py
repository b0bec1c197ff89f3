"""The documented usage example runs verbatim; the DLRM example learns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, *args: str, timeout: float = 120) -> str:
    """Run ``examples/<name>`` as a user would, with no RECSTORE_* setting; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECSTORE_")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_documented_usage_example_runs_with_nothing_else_running() -> None:
    run_example("kvclient_usage.py")


def test_checkpoint_example_runs() -> None:
    output = run_example("checkpoint_dcp.py")
    assert "loads agree" in output and "optimizer state restored" in output


def test_inference_example_runs() -> None:
    out = run_example("inference_table.py")
    assert "outputs agree" in out
    assert "is an inference table: updates are refused" in out


def test_nve_inference_sample_runs_with_the_reference_arguments() -> None:
    # the reference's command line, fewer iterations and rows (LinearUVM on a GPU)
    out = run_example(
        "nve_inference.py", "--batch-size", "1024", "--hotness", "32", "--num-iterations", "3",
        "--cache-size", "1024", "--data-type", "float32", "--num-embeddings", "20000",
    )  # fmt: skip
    assert "every output agrees with torch.nn.functional.embedding_bag" in out
    layer_type = "LinearUVM" if torch.cuda.is_available() else "Hierarchical"
    assert out.startswith(f"{layer_type} on ")


@pytest.mark.slow
def test_dlrm_example_loss_falls(local_client) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import dlrm_synthetic as dlrm
    finally:
        sys.path.remove(str(ROOT / "examples"))
    config = dlrm.DataConfig(num_features=3, cardinality=2000, batch_size=256, seed=3)
    model = dlrm.DLRM(config, 8, dlrm.recstore_bags(local_client, lr=0.5))
    losses = dlrm.train(model, dlrm.SyntheticClicks(config), steps=120, lr=0.5, progress=False)
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20 - 0.03


@pytest.mark.slow
def test_dlrm_example_trains_the_same_as_one_collection(grpc_client) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import dlrm_synthetic as dlrm
    finally:
        sys.path.remove(str(ROOT / "examples"))
    config = dlrm.DataConfig(num_features=3, cardinality=500, batch_size=64, seed=4)
    losses = []
    for collection in (False, True):
        torch.manual_seed(0)
        make_bags = dlrm.recstore_bags(grpc_client, lr=0.5)
        model = dlrm.DLRM(config, 8, make_bags, collection=collection)
        data = dlrm.SyntheticClicks(config)
        losses.append(dlrm.train(model, data, steps=15, lr=0.5, progress=False))
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_compile_and_export_example_matches_eager(tmp_path) -> None:
    out = run_example(
        "compile_and_export.py", "--steps", "3", "--backend", "aot_eager",
        "--out", str(tmp_path / "ranker"), timeout=600,
    )  # fmt: skip
    assert "served vs eager output" in out
    assert (tmp_path / "ranker" / "model.pt2").is_file()
