"""The Dockerfiles agree with the chart, the operator and the CLI they package.

No container engine runs here, so the images are checked by construction: each Dockerfile is
parsed, and its final stage must run as a non-root numeric user, EXPOSE exactly the ports the
chart (or, for PS pods, the operator) declares, and start `recstore` with the command the
chart passes; every flag the chart and operator use must exist on the CLI command it names.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recstore.core.fleet import DATA_DIR, GRPC_PORT, METRICS_PORT

DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
CHART_UID = 10001  # the chart's pod securityContext runAsUser for operator and admin


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, name: str) -> list[str]:
        return [args for instr, args in self.instructions if instr == name]

    def last(self, name: str) -> str:
        found = self.all(name)
        assert found, f"stage {self.alias or self.base} has no {name}"
        return found[-1]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions (continuations joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped[:-1].rstrip() + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            logical.append(pending)
            pending = ""
    assert not pending, "dangling line continuation"
    stages: list[Stage] = []
    for line in logical:
        instr, _, args = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            words = args.split()
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], alias=alias))
        elif stages:
            stages[-1].instructions.append((instr, args.strip()))
        else:
            assert instr == "ARG", f"{instr} before the first FROM"
    return stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def parse(name: str) -> list[Stage]:
    return parse_dockerfile((DOCKER_DIR / name).read_text())


IMAGES = {
    # Dockerfile -> (repository in values.yaml, pip extras, base of the final stage)
    "ps-node.Dockerfile": ("recstore-ps", "ps,cli", r"^nvidia/cuda:\$\{CUDA_VERSION\}-runtime-"),
    "operator.Dockerfile": (
        "recstore-operator",
        "operator,cli",
        r"^python:\$\{PYTHON_VERSION\}-slim$",
    ),
    "admin.Dockerfile": ("recstore-admin", "admin,cli", r"^python:\$\{PYTHON_VERSION\}-slim$"),
}


def test_parser_joins_continuations_and_stages() -> None:
    stages = parse_dockerfile(
        "ARG X=1\nFROM a:${X} AS build\nRUN one \\\n    two\n# note\nFROM b\nUSER 5\n"
    )
    assert [(s.base, s.alias) for s in stages] == [("a:${X}", "build"), ("b", None)]
    assert stages[0].all("RUN") == ["one two"]
    assert stages[1].last("USER") == "5"


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_image_is_built_in_a_builder_stage_and_runs_non_root(chart, dockerfile: str) -> None:
    repository, extras, final_base = IMAGES[dockerfile]
    builder, final = parse(dockerfile)
    assert builder.alias == "builder"
    assert re.search(final_base, final.base), final.base
    installs = " ".join(builder.all("RUN"))
    assert "pip wheel" in installs and f"[{extras}]" in installs
    assert final.all("COPY") == ["--from=builder /opt/venv /opt/venv"]
    assert not final.all("ADD")
    user = final.last("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0, user
    labels = " ".join(final.all("LABEL"))
    assert f'org.opencontainers.image.title="{repository}"' in labels
    assert exec_form(final.last("ENTRYPOINT")) == ["recstore"]
    defaults = chart.loaded.values
    component = {"recstore-ps": "ps", "recstore-operator": "operator", "recstore-admin": "admin"}
    assert defaults[component[repository]]["image"]["repository"] == repository


def test_ps_image_has_cuda_kernels_and_the_operator_ports() -> None:
    builder, final = parse("ps-node.Dockerfile")
    assert builder.base.startswith("nvidia/cuda:") and "-devel-" in builder.base
    env = " ".join(builder.all("ENV"))
    assert "RECSTORE_CUDA=ON" in env  # a build without nvcc fails instead of shipping CPU-only
    assert "built_with_cuda()" in " ".join(builder.all("RUN"))
    exposed = {int(p) for args in final.all("EXPOSE") for p in args.split()}
    assert exposed == {GRPC_PORT, METRICS_PORT}
    cmd = exec_form(final.last("CMD"))
    assert cmd == [
        "ps-node", "--port", str(GRPC_PORT), "--metrics-port", str(METRICS_PORT),
        "--data-dir", DATA_DIR, "--host", "0.0.0.0",
    ]  # fmt: skip
    assert final.last("WORKDIR") == DATA_DIR
    assert f"chown {final.last('USER')} {DATA_DIR}" in " ".join(final.all("RUN"))


def test_ps_image_user_owns_the_operator_pods_data_volume() -> None:
    """The operator runs PS pods as the image's user, with its group as fsGroup on /data."""
    from recstore.core.reconcile import parse_declaration
    from recstore.operator.render import Owner, RenderOptions, render_statefulset

    _, final = parse("ps-node.Dockerfile")
    uid, _, gid = final.last("USER").partition(":")
    decl = parse_declaration({"numEmbeddings": 10, "embeddingDim": 4}, default_name="t")
    sts = render_statefulset(Owner("t", "ns", "uid"), decl, RenderOptions())
    pod_ctx = sts["spec"]["template"]["spec"]["securityContext"]
    assert (pod_ctx["runAsUser"], pod_ctx["runAsGroup"]) == (int(uid), int(gid))
    assert pod_ctx["fsGroup"] == int(gid)


def test_admin_image_matches_the_chart_container(chart) -> None:
    _, final = parse("admin.Dockerfile")
    manifests = chart.render()
    deployment = manifests.one("Deployment", "-admin")
    container = manifests.container(deployment, "admin")
    assert "command" not in container  # the image's ENTRYPOINT runs
    assert exec_form(final.last("CMD")) == container["args"]
    exposed = {int(p) for args in final.all("EXPOSE") for p in args.split()}
    assert exposed == {p["containerPort"] for p in container["ports"]}
    uid = int(final.last("USER").split(":")[0])
    assert uid == manifests.pod_spec(deployment)["securityContext"]["runAsUser"] == CHART_UID
    image_env = " ".join(final.all("ENV"))
    chart_url = manifests.env(container)["RECSTORE_DATABASE_URL"]["value"]
    assert f"RECSTORE_DATABASE_URL={chart_url}" in image_env  # same default path both ways


def test_operator_image_matches_the_chart_container(chart) -> None:
    """The image alone serves every namespace; the chart does so only with rbac.clusterWide."""
    _, final = parse("operator.Dockerfile")
    manifests = chart.render({"rbac": {"clusterWide": True}})
    deployment = manifests.one("Deployment", "-operator")
    container = manifests.container(deployment, "operator")
    assert "command" not in container
    assert exec_form(final.last("CMD")) == container["args"]
    exposed = {int(p) for args in final.all("EXPOSE") for p in args.split()}
    assert exposed == {p["containerPort"] for p in container["ports"]}
    probe_port = container["livenessProbe"]["httpGet"]["port"]
    (health,) = (p for p in container["ports"] if p["name"] == probe_port)
    assert f"--liveness=http://0.0.0.0:{health['containerPort']}/healthz" in container["args"]
    uid = int(final.last("USER").split(":")[0])
    assert uid == manifests.pod_spec(deployment)["securityContext"]["runAsUser"] == CHART_UID


def test_dockerignore_keeps_what_the_build_copies() -> None:
    ignored = {
        line.strip()
        for line in (DOCKER_DIR.parent / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for dockerfile in IMAGES:
        builder = parse(dockerfile)[0]
        for copy in builder.all("COPY"):
            for source in shlex.split(copy)[:-1]:
                assert source.rstrip("/") not in ignored, f"{dockerfile} copies ignored {source}"
                assert (DOCKER_DIR.parent / source).exists(), f"{dockerfile}: {source} missing"
    assert {".venv", ".git", "build"} <= ignored


# --- the CLI commands the images run accept every flag they are given ----------------------


def _cli_options(module_name: str, command: str) -> set[str]:
    """Option names of one `recstore` sub-command, from its typer registration."""
    import importlib

    import typer
    from typer.main import get_command

    module = importlib.import_module(f"recstore.cli.{module_name}")
    app = typer.Typer()
    module.register(app)
    group: Any = get_command(app)
    sub = group.commands[command] if hasattr(group, "commands") else group
    assert sub.name == command or not hasattr(group, "commands")
    return {opt for param in sub.params for opt in (*param.opts, *param.secondary_opts)}


def _flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def test_ps_node_cli_accepts_the_image_and_operator_flags() -> None:
    from recstore.core.reconcile import ps_node_args

    options = _cli_options("ps_node", "ps-node")
    _, final = parse("ps-node.Dockerfile")
    image_cmd = exec_form(final.last("CMD"))
    assert image_cmd[0] == "ps-node"
    assert _flags(image_cmd) <= options
    decl = _declaration()
    operator_args = ps_node_args(decl, shard_index="$(RECSTORE_SHARD_INDEX)", auth_token_file="/t")
    assert operator_args[0] == "ps-node"
    assert _flags(operator_args) <= options, _flags(operator_args) - options


@pytest.mark.parametrize("component", ["admin", "operator"])
def test_cli_accepts_the_chart_flags(chart, scenario, component: str) -> None:
    options = _cli_options(component, component)
    _, values = scenario
    manifests = chart.render(values)
    workloads = manifests.find("Deployment", f"-{component}")
    assert workloads or component == "admin"
    for workload in workloads:
        args = manifests.container(workload, component)["args"]
        assert args[0] == component
        assert _flags(args) <= options, _flags(args) - options
    cmd = exec_form(parse(f"{component}.Dockerfile")[-1].last("CMD"))
    assert _flags(cmd) <= options


def _declaration() -> Any:
    from recstore.core.reconcile import parse_declaration

    return parse_declaration(
        {"numEmbeddings": 10, "embeddingDim": 4, "placement": {"gpus": 1}}, default_name="t"
    )


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_images_have_grpc_cpp_to_build_and_run_the_native_module(
    dockerfile: str, grpc_apt_packages: list[str]
) -> None:
    builder, final = parse(dockerfile)
    installs = " ".join(run for run in builder.all("RUN") if "apt-get install" in run).split()
    assert set(grpc_apt_packages) <= set(installs), set(grpc_apt_packages) - set(installs)
    assert "cmake/ cmake/" in builder.all("COPY")
    # the runtime library the module links, whatever the base names it
    runtime = " ".join(run for run in final.all("RUN") if "apt-get install" in run)
    assert "$(apt-cache depends libgrpc++-dev" in runtime
