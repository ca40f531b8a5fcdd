"""python -m prism_jax: see prism_jax/cli.py."""

import sys

from prism_jax.cli import main

sys.exit(main())
