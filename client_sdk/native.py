"""Loading the native engine from an explicit path (``RecStoreClient(library_path=...)``).

By default the engine is the installed ``recstore._native``; a path lets a
developer use another build of it. One native module per process: asking for
a second, different file once one is loaded is an ImportError, as is any file
that does not load.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

NATIVE_MODULE = "recstore._native"


def load_library(path: str | os.PathLike[str]) -> None:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ImportError(f"cannot load the RecStore native library {path!r}: no such file")
    loaded = sys.modules.get(NATIVE_MODULE)
    if loaded is not None:
        loaded_file = getattr(loaded, "__file__", None)
        if loaded_file and os.path.samefile(loaded_file, path):
            return
        raise ImportError(
            f"cannot load the RecStore native library {path!r}: {loaded_file} is already loaded "
            "in this process"
        )
    loader = importlib.machinery.ExtensionFileLoader(NATIVE_MODULE, path)
    spec = importlib.util.spec_from_file_location(NATIVE_MODULE, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load the RecStore native library {path!r}")
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError:
        raise
    except Exception as error:  # a corrupt or foreign file fails in many ways
        raise ImportError(f"cannot load the RecStore native library {path!r}: {error}") from error
    sys.modules[NATIVE_MODULE] = module


def share_torch_threads() -> None:
    """Run the engine's batch work in this process on torch's OpenMP team.

    The SDK's process trains with torch: after each of torch's parallel kernels
    its OpenMP threads spin on the cores the engine's own helper threads would
    need, so an update right after backward ran at about one core's speed
    (``recstore._native.share_process_openmp``; docs/store.md, Concurrency). Both
    backends call this: the local one for the store's work, the gRPC one for
    the trainer's own (encoding requests, scattering replies, pooling, the host
    cache).
    """
    from recstore import _native

    engine: Any = _native  # no type stubs
    engine.share_process_openmp(True)
