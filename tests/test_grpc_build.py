"""gRPC C++ comes from the system packages, and a build without them says which to install.

cmake/grpc.cmake is included by every CMake project here (the native module, the
transport floor in bench/); each missing piece (the plugin gRPC's config imports,
gRPC's config itself, the protobuf library it links) stops the configure with an
error naming the packages. Each case is a real configure of a probe project that
includes the module, with that one piece hidden from CMake's search.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CMAKE = shutil.which("cmake")
pytestmark = pytest.mark.skipif(CMAKE is None, reason="cmake is what builds the native module")


def configure(tmp_path: Path, *defines: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.24)\nproject(probe LANGUAGES CXX)\n"
        f'include("{ROOT / "cmake" / "grpc.cmake"}")\n'
    )
    tools = [f"-DCMAKE_MAKE_PROGRAM={shutil.which('make')}",
             f"-DCMAKE_CXX_COMPILER={shutil.which('c++')}"]  # fmt: skip
    command = [str(CMAKE), "-S", str(tmp_path), "-B", str(tmp_path / "build"), *tools, *defines]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def plugin_dirs() -> str:
    """Every folder on PATH that holds grpc_cpp_plugin (/bin and /usr/bin may both)."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    return ";".join(f for f in folders if f and (Path(f) / "grpc_cpp_plugin").exists())


def test_the_system_grpc_is_found(tmp_path: Path) -> None:
    done = configure(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "gRPC C++ 1.51" in done.stdout


@pytest.mark.parametrize(
    ("hidden", "reason"),
    [
        (f"-DCMAKE_IGNORE_PATH={plugin_dirs()}", "grpc_cpp_plugin was not found"),
        ("-DCMAKE_DISABLE_FIND_PACKAGE_gRPC=ON", "found no gRPCConfig.cmake"),
        ("-DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON", "found no protobuf library"),
    ],
)  # fmt: skip
def test_a_missing_piece_stops_the_build_naming_the_packages(
    tmp_path: Path, grpc_apt_packages: list[str], hidden: str, reason: str
) -> None:
    done = configure(tmp_path, hidden)
    assert done.returncode != 0
    error = " ".join(done.stderr.split())  # CMake wraps its messages
    assert reason in error, error
    assert f"apt-get install {' '.join(grpc_apt_packages)}" in error, error


def test_the_install_script_installs_them(grpc_apt_packages: list[str]) -> None:
    script = (ROOT / "scripts" / "install_system_deps.sh").read_text()
    listed = next(line for line in script.splitlines() if line.startswith("packages=("))
    assert set(grpc_apt_packages) <= set(listed.removeprefix("packages=(").rstrip(")").split())
