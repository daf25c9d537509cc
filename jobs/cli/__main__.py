"""``python -m jobs.cli``: the ``tierq`` command."""

from jobs.cli.main import main

main()
