"""What the CUDA store tests share: whether they can run here, and raw views of buffers.

A CUDA test module sets ``pytestmark = CUDA_ONLY``: it runs only where torch sees a
device and the native module was built with CUDA and finds one
(scripts/gpu_check.sh runs them on a GPU machine).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from recstore import _native


def cuda_ready() -> bool:
    return bool(
        torch.cuda.is_available() and _native.built_with_cuda() and _native.cuda_available()
    )


CUDA_ONLY = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA device"),
]


def to_raw(x: Any) -> np.ndarray:
    """A table buffer (numpy or torch, any device) as numpy raw storage."""
    if isinstance(x, np.ndarray):
        return x
    t = x.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()
