"""`python -m recstore` runs the `recstore` command (how the local provisioner starts nodes)."""

from recstore.cli import main

main()
