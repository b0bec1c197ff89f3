"""How long the operator waits before it tries a failed online move again, and how often."""

from __future__ import annotations

import pytest

from recstore.operator.config import OperatorConfig


def test_the_wait_doubles_to_its_cap_and_the_last_attempt_is_not_retried() -> None:
    config = OperatorConfig(reshard_attempts=6, reshard_retry_delay=5, reshard_retry_cap=30)
    waits = [config.reshard_retry.delay(failures) for failures in range(1, 7)]
    assert waits == [5, 10, 20, 30, 30, None]


def test_the_retry_settings_come_from_the_environment_and_are_checked() -> None:
    env = {
        "RECSTORE_RESHARD_ATTEMPTS": "2", "RECSTORE_RESHARD_RETRY_DELAY": "0.5",
        "RECSTORE_RESHARD_RETRY_CAP": "4", "RECSTORE_RESHARD_BATCH_SLOTS": "256",
        "RECSTORE_RESHARD_COPY_RATE": "3e7",
    }  # fmt: skip
    config = OperatorConfig.from_env(env)
    assert config.reshard_copy_rate == 3e7
    assert OperatorConfig.from_env({}).reshard_copy_rate == 0  # no cap
    assert (config.reshard_attempts, config.reshard_retry_delay) == (2, 0.5)
    assert (config.reshard_retry_cap, config.reshard_batch_slots) == (4, 256)
    assert OperatorConfig.from_env({}).reshard_attempts == OperatorConfig().reshard_attempts
    for wrong in (
        {"RECSTORE_RESHARD_ATTEMPTS": "0"},
        {"RECSTORE_RESHARD_BATCH_SLOTS": "0"},
        {"RECSTORE_RESHARD_COPY_RATE": "-5"},
        {"RECSTORE_RESHARD_COPY_RATE": "fast"},
        {"RECSTORE_RESHARD_RETRY_DELAY": "10", "RECSTORE_RESHARD_RETRY_CAP": "5"},
    ):
        with pytest.raises(ValueError, match="RECSTORE_RESHARD"):
            OperatorConfig.from_env(wrong)
