"""`python -m recstore` runs the `recstore` command (the local provisioner starts nodes this way)."""

from recstore.cli import main

main()
