"""`python -m prism_jax.serve`: see cli.py (or --help)."""

from prism_jax.serve.cli import main

raise SystemExit(main())
