"""`recstore operator`: run the EmbeddingTable operator (kopf) in this process.

Settings come from the environment (RECSTORE_PS_IMAGE, RECSTORE_ALLOWED_IMAGES,
RECSTORE_ADMIN_URL, RECSTORE_PROVISIONER_TOKEN_FILE or RECSTORE_PROVISIONER_TOKEN,
RECSTORE_PS_TOKEN_SECRET, RECSTORE_PS_TLS_SECRET, RECSTORE_PS_TLS_MUTUAL, RECSTORE_TLS_*,
RECSTORE_STATUS_INTERVAL; see recstore.operator.config); credentials from the pod's
service account, or KUBECONFIG outside a cluster.
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("operator")
    def operator(
        namespace: list[str] = typer.Option(  # noqa: B008 (typer declares options this way)
            [], "--namespace", "-n", help="Watch these namespaces (glob patterns allowed)."
        ),
        all_namespaces: bool = typer.Option(
            False, "--all-namespaces", "-A", help="Watch EmbeddingTables in every namespace."
        ),
        standalone: bool = typer.Option(
            False, "--standalone", help="Run without peering (one operator replica)."
        ),
        liveness: str | None = typer.Option(
            None, "--liveness", help="Serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz."
        ),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every handler step."),
    ) -> None:
        """Reconcile EmbeddingTable resources into sharded PS StatefulSets."""
        if bool(namespace) == all_namespaces:
            raise typer.BadParameter("give either --namespace (one or more) or --all-namespaces")
        import kopf

        from recstore.operator.config import OperatorConfig
        from recstore.operator.handlers import register as register_handlers

        registry = kopf.OperatorRegistry()
        register_handlers(registry, OperatorConfig.from_env())
        kopf.configure(verbose=verbose)
        kopf.run(
            registry=registry,
            standalone=standalone,
            clusterwide=all_namespaces,
            namespaces=namespace,
            liveness_endpoint=liveness,
        )
