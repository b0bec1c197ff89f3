"""The node as a process and a gRPC server: everything between the socket and the node core.

``servicer`` (thin handlers; failures become status codes through
``recstore.core.grpc_status``), ``serving`` (the server with health,
reflection, metrics and shutdown), ``process`` (``recstore ps-node``) and
``server`` (a node on a thread of this process, for tests and programs),
``config`` (the node's options, checked once), ``auth`` (bearer tokens),
``limits`` (message bounds), ``offload`` (inline or thread pool), ``metrics``
(Prometheus), ``logs`` (JSON lines) and ``table_specs``
(``--table-spec-file``). Nothing below this package imports it.
"""
