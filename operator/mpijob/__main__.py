"""``python -m mpijob``: the operator's command line."""

from mpijob.cli import main

main()
