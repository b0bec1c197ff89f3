"""What each chart value does to the rendered objects: database, tokens, RBAC, wiring.

Parameter tables over values; each row asserts the objects a user relies on (the URL the
admin API gets, the Secrets tokens come from, the exact permissions granted).
"""

from __future__ import annotations

import base64
import importlib
from typing import Any

import pytest
from helm_python.errors import HelmRenderError

from recstore.core.resource import GROUP, PLURAL, POOL_PLURAL

SQLITE_URL = "sqlite:////var/lib/recstore/admin.db"


def _admin(manifests):
    deployment = manifests.one("Deployment", "-admin")
    return deployment, manifests.container(deployment, "admin")


def _operator(manifests):
    deployment = manifests.one("Deployment", "-operator")
    return deployment, manifests.container(deployment, "operator")


# --- catalogue database ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "mode"),
    [
        ({}, "sqlite-pvc"),
        ({"admin": {"sqlite": {"persistence": {"enabled": False}}}}, "sqlite-emptydir"),
        ({"database": {"external": {"urlSecret": {"name": "db", "key": "dsn"}}}}, "external"),
        ({"postgresql": {"enabled": True}}, "postgresql"),
    ],
)
def test_database_mode_sets_the_admin_database_url(chart, values: dict, mode: str) -> None:
    manifests = chart.render(values)
    deployment, admin = _admin(manifests)
    env = manifests.env(admin)
    url = env["RECSTORE_DATABASE_URL"]
    volumes = {v["name"]: v for v in manifests.pod_spec(deployment)["volumes"]}
    claims = manifests.find("PersistentVolumeClaim")
    statefulsets = manifests.find("StatefulSet")
    if mode.startswith("sqlite"):
        assert url["value"] == SQLITE_URL
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
        assert statefulsets == []
        if mode == "sqlite-pvc":
            assert (
                volumes["data"]["persistentVolumeClaim"]["claimName"] == "rel-recstore-admin-data"
            )
            assert [c["metadata"]["name"] for c in claims] == ["rel-recstore-admin-data"]
        else:
            assert volumes["data"] == {"name": "data", "emptyDir": {}}
            assert claims == []
        return
    assert "data" not in volumes and claims == []
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    if mode == "external":
        assert url["valueFrom"] == {"secretKeyRef": {"name": "db", "key": "dsn"}}
        assert statefulsets == []
        return
    # bundled: the password comes from the chart's Secret and is expanded into the URL, so it
    # must be defined before the URL (Kubernetes expands $(VAR) from earlier entries only).
    names = [e["name"] for e in admin["env"]]
    assert names.index("RECSTORE_POSTGRES_PASSWORD") < names.index("RECSTORE_DATABASE_URL")
    assert env["RECSTORE_POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "rel-recstore-postgresql",
        "key": "password",
    }
    assert url["value"] == (
        "postgresql+psycopg://recstore:$(RECSTORE_POSTGRES_PASSWORD)"
        "@rel-recstore-postgresql:5432/recstore"
    )
    (statefulset,) = statefulsets
    assert statefulset["spec"]["replicas"] == 1
    assert statefulset["spec"]["serviceName"] == "rel-recstore-postgresql"
    pg_env = manifests.env(manifests.container(statefulset, "postgresql"))
    assert (
        pg_env["POSTGRES_PASSWORD"]["valueFrom"] == env["RECSTORE_POSTGRES_PASSWORD"]["valueFrom"]
    )
    (wait,) = manifests.pod_spec(deployment)["initContainers"]
    assert "pg_isready -h rel-recstore-postgresql" in wait["command"][-1]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {
                "postgresql": {"enabled": True},
                "database": {"external": {"urlSecret": {"name": "db"}}},
            },
            "mutually exclusive",
        ),
        ({"admin": {"replicas": 2}}, "admin.replicas > 1 needs a shared database"),
    ],
)
def test_contradictory_database_values_are_refused(chart, values: dict, message: str) -> None:
    with pytest.raises(HelmRenderError, match=message):
        chart.render(values)


@pytest.mark.parametrize("replicas", [2, 3])
def test_several_admin_replicas_with_a_shared_database(chart, replicas: int) -> None:
    manifests = chart.render({"postgresql": {"enabled": True}, "admin": {"replicas": replicas}})
    assert _admin(manifests)[0]["spec"]["replicas"] == replicas


# --- tokens ---------------------------------------------------------------------------------


def test_generated_tokens_are_random_secrets_wired_to_their_users(chart) -> None:
    manifests = chart.render()
    secrets = {s["metadata"]["name"]: s for s in manifests.find("Secret")}
    assert set(secrets) == {"rel-recstore-admin-token", "rel-recstore-ps-token"}
    tokens = {name: base64.b64decode(s["data"]["token"]).decode() for name, s in secrets.items()}
    for token in tokens.values():
        assert len(token) == 48 and token.isalnum()
    assert len(set(tokens.values())) == 2
    deployment, admin = _admin(manifests)
    volumes = {v["name"]: v for v in manifests.pod_spec(deployment)["volumes"]}
    assert volumes["bootstrap-token"]["secret"]["secretName"] == "rel-recstore-admin-token"
    mounts = {m["name"]: m for m in admin["volumeMounts"]}
    token_file = manifests.env(admin)["RECSTORE_BOOTSTRAP_TOKEN_FILE"]["value"]
    assert token_file == mounts["bootstrap-token"]["mountPath"] + "/token"
    operator_deployment, operator = _operator(manifests)
    env = manifests.env(operator)
    # The operator never holds the bootstrap admin token: it reads a token of its own.
    assert "RECSTORE_ADMIN_TOKEN" not in env
    assert _operator_token_secret(manifests, operator_deployment) == "rel-recstore-operator-token"
    assert env["RECSTORE_PS_TOKEN_SECRET"]["value"] == "rel-recstore-ps-token"
    assert env["RECSTORE_ADMIN_URL"]["value"] == "http://rel-recstore-admin.recstore.svc:8080"


def _operator_token_secret(manifests, deployment) -> str:
    """The Secret the operator's RECSTORE_PROVISIONER_TOKEN_FILE comes from."""
    container = manifests.container(deployment, "operator")
    token_file = manifests.env(container)["RECSTORE_PROVISIONER_TOKEN_FILE"]["value"]
    mount = next(m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"]))
    assert mount["readOnly"] is True
    volume = next(
        v for v in manifests.pod_spec(deployment)["volumes"] if v["name"] == mount["name"]
    )
    assert volume["secret"]["optional"] is True
    name: str = volume["secret"]["secretName"]
    return name


def test_each_install_generates_fresh_tokens(chart) -> None:
    """Offline (no cluster for lookup) every render generates; with a cluster the stored
    value is reused, which is why the template looks the Secret up first."""
    first, second = (
        {s["metadata"]["name"]: s["data"]["token"] for s in chart.render().find("Secret")}
        for _ in range(2)
    )
    assert first.keys() == second.keys()
    assert all(first[name] != second[name] for name in first)
    template = (chart.directory / "templates" / "_helpers.tpl").read_text()
    assert 'lookup "v1" "Secret"' in template


def test_existing_secrets_replace_generated_ones(chart) -> None:
    manifests = chart.render(
        {
            "auth": {
                "bootstrapToken": {"existingSecret": "my-admin"},
                "psToken": {"existingSecret": "my-ps"},
                "operatorToken": {"existingSecret": "my-operator"},
            },
            "postgresql": {"enabled": True, "existingSecret": "my-pg"},
        }
    )
    assert manifests.find("Secret") == []
    operator_deployment, operator = _operator(manifests)
    env = manifests.env(operator)
    assert _operator_token_secret(manifests, operator_deployment) == "my-operator"
    assert env["RECSTORE_PS_TOKEN_SECRET"]["value"] == "my-ps"
    deployment, admin = _admin(manifests)
    volumes = {v["name"]: v for v in manifests.pod_spec(deployment)["volumes"]}
    assert volumes["bootstrap-token"]["secret"]["secretName"] == "my-admin"
    password = manifests.env(admin)["RECSTORE_POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password == {"name": "my-pg", "key": "password"}


@pytest.mark.parametrize(
    ("values", "ps_secret", "admin_url"),
    [
        ({}, True, True),
        ({"auth": {"psToken": {"enabled": False}}}, False, True),
        ({"operator": {"mirrorStatusToAdmin": False}}, True, False),
        ({"admin": {"enabled": False}}, True, False),
    ],
)
def test_operator_environment_follows_values(
    chart, values: dict, ps_secret: bool, admin_url: bool
) -> None:
    manifests = chart.render(values)
    env = manifests.env(_operator(manifests)[1])
    assert env["RECSTORE_PS_IMAGE"]["value"] == "recstore-ps:0.1.0"
    assert ("RECSTORE_PS_TOKEN_SECRET" in env) is ps_secret
    assert (
        "rel-recstore-ps-token" in {s["metadata"]["name"] for s in manifests.find("Secret")}
    ) is ps_secret
    assert ("RECSTORE_ADMIN_URL" in env) is admin_url
    assert ("RECSTORE_PROVISIONER_TOKEN_FILE" in env) is admin_url
    assert "RECSTORE_ADMIN_TOKEN" not in env


@pytest.mark.parametrize(
    ("values", "passed"),
    [
        ({}, None),
        ({"auth": {"psReadOnlyToken": {"existingSecret": "readers"}}}, "readers"),
        (  # without the PS token a read-only token would not restrict anyone
            {"auth": {"psToken": {"enabled": False}, "psReadOnlyToken": {"existingSecret": "r"}}},
            None,
        ),
    ],
)
def test_the_operator_learns_the_read_only_token_secret(chart, values, passed) -> None:
    manifests = chart.render(values)
    env = manifests.env(_operator(manifests)[1])
    got = env.get("RECSTORE_PS_READ_ONLY_TOKEN_SECRET")
    assert (got["value"] if got else None) == passed


# --- images ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, ("recstore-operator:0.1.0", "recstore-admin:0.1.0", "recstore-ps:0.1.0")),
        (
            {"image": {"registry": "ghcr.io/acme/", "tag": "1.2.3"}},
            (
                "ghcr.io/acme/recstore-operator:1.2.3",
                "ghcr.io/acme/recstore-admin:1.2.3",
                "ghcr.io/acme/recstore-ps:1.2.3",
            ),
        ),
        (
            {"image": {"tag": "1.2.3"}, "ps": {"image": {"repository": "my-ps", "tag": "cu13"}}},
            ("recstore-operator:1.2.3", "recstore-admin:1.2.3", "my-ps:cu13"),
        ),
    ],
)
def test_image_references(chart, values: dict, expected: tuple[str, str, str]) -> None:
    manifests = chart.render(values)
    operator = _operator(manifests)[1]
    got = (
        operator["image"],
        _admin(manifests)[1]["image"],
        manifests.env(operator)["RECSTORE_PS_IMAGE"]["value"],
    )
    assert got == expected


# --- RBAC -----------------------------------------------------------------------------------

DISCOVERY_RULES = [
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]
WRITE = ["get", "list", "watch", "create", "patch", "delete"]
READ = ["get", "list", "watch"]
NAMESPACED_RULES = [
    {
        "apiGroups": [GROUP],
        "resources": [PLURAL, POOL_PLURAL],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {
        "apiGroups": [GROUP],
        "resources": [f"{PLURAL}/status", f"{POOL_PLURAL}/status"],
        "verbs": ["get", "patch", "update"],  # the reshard store's PUT is an update
    },
    {
        "apiGroups": [GROUP],
        "resources": [f"{PLURAL}/finalizers", f"{POOL_PLURAL}/finalizers"],
        "verbs": ["update"],
    },
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": WRITE},
    {"apiGroups": [""], "resources": ["services"], "verbs": WRITE},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": WRITE},
    {"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims"], "verbs": READ},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
#: the operator reads the PS token (for its own gRPC calls), that one Secret and no other
PS_TOKEN_RULE = {
    "apiGroups": [""],
    "resources": ["secrets"],
    "resourceNames": ["rel-recstore-ps-token"],
    "verbs": ["get"],
}
NO_PS_TOKEN = {"auth": {"psToken": {"enabled": False}}}


def _rules(obj: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = obj["rules"]
    return rules


def test_no_rule_anywhere_uses_wildcards(chart, scenario) -> None:
    _, values = scenario
    for obj in chart.render(values):
        for rule in obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{obj['kind']}/{obj['metadata']['name']}: {rule}"


CLUSTER_WIDE = {"rbac": {"clusterWide": True}}


@pytest.mark.parametrize(
    ("values", "cluster_rules", "role_namespaces", "role_rules", "args"),
    [
        # by default: nothing cluster-wide, a Role in the release namespace, watched alone
        ({}, None, ["recstore"], [*NAMESPACED_RULES, PS_TOKEN_RULE], ["--namespace=recstore"]),
        (NO_PS_TOKEN, None, ["recstore"], NAMESPACED_RULES, ["--namespace=recstore"]),
        (
            {"operator": {"watchNamespaces": ["ml", "recstore"]}},
            None,
            ["ml", "recstore"],
            [*NAMESPACED_RULES, PS_TOKEN_RULE],
            ["--namespace=ml", "--namespace=recstore"],
        ),
        (
            CLUSTER_WIDE,
            [*DISCOVERY_RULES, *NAMESPACED_RULES, PS_TOKEN_RULE],
            [],
            None,
            ["--all-namespaces"],
        ),
        (
            {**CLUSTER_WIDE, **NO_PS_TOKEN},
            DISCOVERY_RULES + NAMESPACED_RULES,
            [],
            None,
            ["--all-namespaces"],
        ),
    ],
)
def test_operator_rbac_is_least_privilege(
    chart, values: dict, cluster_rules: list | None, role_namespaces: list, role_rules, args: list
) -> None:
    manifests = chart.render(values)
    if cluster_rules is None:
        assert manifests.find("ClusterRole") == manifests.find("ClusterRoleBinding") == []
    else:
        cluster_role = manifests.one("ClusterRole")
        assert _rules(cluster_role) == cluster_rules
        assert cluster_role["metadata"]["name"] == "recstore-rel-recstore-operator"
        binding = manifests.one("ClusterRoleBinding")
        assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rel-recstore-operator", "namespace": "recstore"}
        ]
    roles = manifests.find("Role", "-operator")
    assert sorted(r["metadata"]["namespace"] for r in roles) == role_namespaces
    for role in roles:
        assert _rules(role) == role_rules
    bindings = manifests.find("RoleBinding", "-operator")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == role_namespaces
    for b in bindings:
        assert b["subjects"][0]["namespace"] == "recstore"
    deployment, operator = _operator(manifests)
    assert operator["args"] == [
        "operator",
        "--standalone",
        *args,
        "--liveness=http://0.0.0.0:8080/healthz",
    ]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert manifests.pod_spec(deployment)["serviceAccountName"] == "rel-recstore-operator"


@pytest.mark.parametrize("enabled", [True, False])
def test_admin_may_manage_tables_only_when_enabled(chart, enabled: bool) -> None:
    manifests = chart.render({"admin": {"kubernetes": {"enabled": enabled}}})
    roles = manifests.find("Role", "-admin")
    env = manifests.env(_admin(manifests)[1])
    assert env["RECSTORE_KUBERNETES"]["value"] == str(enabled).lower()
    if not enabled:
        assert roles == [] and manifests.find("RoleBinding", "-admin") == []
        return
    (role,) = roles
    assert role["metadata"]["namespace"] == "recstore"
    assert _rules(role) == [
        {
            "apiGroups": [GROUP],
            "resources": [PLURAL],
            "verbs": ["get", "list", "create", "patch", "delete"],
        }
    ]


# --- admin service, ingress, metrics ----------------------------------------------------------


def test_services_select_their_pods(chart, scenario) -> None:
    _, values = scenario
    manifests = chart.render(values)
    for service in manifests.find("Service"):
        selector = service["spec"]["selector"]
        targets = [
            w
            for w in manifests.workloads()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, service["metadata"]["name"]
        port_names = {
            p["name"] for c in manifests.pod_spec(targets[0])["containers"] for p in c["ports"]
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names


def test_admin_listens_where_the_service_probes_and_scrapes_point(chart) -> None:
    manifests = chart.render()
    deployment, admin = _admin(manifests)
    assert admin["args"] == ["admin", "--host", "0.0.0.0", "--port", "8080"]
    assert admin["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    http = {"port": "http", "scheme": "HTTP"}
    assert admin["readinessProbe"]["httpGet"] == {"path": "/readyz", **http}
    assert admin["livenessProbe"]["httpGet"] == {"path": "/healthz", **http}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8080",
        "prometheus.io/path": "/metrics",
    }
    no_scrape = chart.render({"metrics": {"scrapeAnnotations": False}})
    template = _admin(no_scrape)[0]["spec"]["template"]["metadata"]
    assert "annotations" not in template


def test_ingress_and_service_monitor_target_the_admin_service(chart) -> None:
    manifests = chart.render(
        {
            "admin": {
                "ingress": {
                    "enabled": True,
                    "className": "nginx",
                    "hosts": [
                        {"host": "rs.example", "paths": [{"path": "/", "pathType": "Prefix"}]}
                    ],
                    "tls": [{"secretName": "rs-tls", "hosts": ["rs.example"]}],
                }
            },
            "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        }
    )
    service = manifests.one("Service", "-admin")
    ingress = manifests.one("Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "rs-tls", "hosts": ["rs.example"]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "rs.example"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    env = manifests.env(_admin(manifests)[1])
    assert env["RECSTORE_SECURE_COOKIES"]["value"] == "true"  # HTTPS in front of the API
    monitor = manifests.one("ServiceMonitor", "-admin")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["recstore"]}


def test_optional_objects_are_off_by_default(chart) -> None:
    manifests = chart.render()
    for kind in ("Ingress", "ServiceMonitor", "StatefulSet", "EmbeddingTable", "Certificate"):
        assert manifests.find(kind) == [], kind


def test_tables_are_installed_verbatim(chart) -> None:
    spec = {"numEmbeddings": 1000, "embeddingDim": 16, "placement": {"gpus": 1}}
    (table,) = chart.render({"tables": [{"name": "t1", "spec": spec}]}).find("EmbeddingTable")
    assert table["metadata"] == {
        "name": "t1",
        "namespace": "recstore",
        "labels": table["metadata"]["labels"],
    }
    assert table["spec"] == spec


def test_notes_tell_how_to_reach_the_admin_api(chart) -> None:
    notes = chart.notes()
    assert "kubectl port-forward -n recstore svc/rel-recstore-admin 8080:8080" in notes
    assert "rel-recstore-admin-token" in notes
    assert "SQLite" in notes
    assert "RECSTORE_PS_TOKEN" in notes  # the variable the SDK reads the PS token from
    ingress = chart.notes(
        {"admin": {"ingress": {"enabled": True, "tls": [{"secretName": "t", "hosts": ["a"]}]}}}
    )
    assert "https://recstore.example.com" in ingress


def test_ps_token_is_copied_into_every_watched_namespace(chart) -> None:
    manifests = chart.render({"operator": {"watchNamespaces": ["ml", "recstore"]}})
    copies = manifests.find("Secret", "-ps-token")
    assert sorted(s["metadata"]["namespace"] for s in copies) == ["ml", "recstore"]
    assert len({s["data"]["token"] for s in copies}) == 1  # one token, whatever the namespace


def test_operator_rbac_covers_every_kind_the_operator_touches(chart) -> None:
    kube = importlib.import_module("recstore.operator.kube")
    rules = _rules(chart.render().one("Role", "-operator"))
    granted = {
        (group, resource) for r in rules for group in r["apiGroups"] for resource in r["resources"]
    }
    for kind, (prefix, plural) in kube.KINDS.items():
        group = "" if prefix == "/api/v1" else prefix.split("/")[2]
        assert (group, plural) in granted, f"the operator uses {kind} but may not"


@pytest.mark.parametrize(
    ("watch", "namespace_selector"),
    [
        ([], {"matchNames": ["recstore"]}),
        (["ml", "nlp"], {"matchNames": ["ml", "nlp"]}),
        (None, {"any": True}),  # cluster-wide
    ],
)
def test_ps_service_monitor_selects_the_operators_services(
    chart, watch: list[str] | None, namespace_selector: dict
) -> None:
    render = importlib.import_module("recstore.operator.render")
    values: dict[str, Any] = {"metrics": {"serviceMonitor": {"enabled": True}}}
    values |= {"operator": {"watchNamespaces": watch}} if watch is not None else CLUSTER_WIDE
    manifests = chart.render(values)
    monitor = manifests.one("ServiceMonitor", "-ps")
    assert monitor["spec"]["namespaceSelector"] == namespace_selector
    service = render.render_service(render.Owner(name="t", namespace="ml", uid="u"))
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
