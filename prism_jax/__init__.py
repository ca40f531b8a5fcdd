"""prism_jax: an inference engine for decision models with exact, reproducible probabilities."""

__version__ = "0.1.0"
