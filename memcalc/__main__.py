"""``python -m memcalc`` runs the CLI."""

from memcalc.cli import main

main()
