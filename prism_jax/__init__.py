"""prism_jax: an inference engine for decision models with exact, reproducible probabilities."""

__version__ = "0.1.0"


def make_decide_fn(config):
    """A pure `decide(params, batch) -> probabilities [Q, O]` (see prism_jax.decide)."""
    from prism_jax.decide import make_decide_fn as _make  # lazy: keeps `import prism_jax` light

    return _make(config)
