# %% [markdown]
# # `make_decide_fn` in a notebook
# A pure `decide(params, batch) -> probabilities [Q, O]` that you jit (and vmap or shard)
# yourself. The engine builds the batch (a padded token forest); the function is all JAX.
# Run as a script (`python examples/decide_fn_notebook.py`) or open it as a notebook
# (jupytext percent format).

# %%
import jax
import jax.numpy as jnp

import prism_jax
from prism_jax.engine import Engine
from prism_jax.forest import build_forest
from prism_jax.questions import parse_questions
from prism_jax.scheduler import pad

engine = Engine.from_pretrained("default", precision="int8")  # Gemma 3 270M from PyPI
decide = jax.jit(prism_jax.make_decide_fn(engine.config))

# %%
state = "My parcel arrived broken and the seller does not answer my emails."
questions = parse_questions(
    {
        "topic": {"type": "choice", "criteria": {"delivery": None, "billing": None, "login": None}},
        "angry": {"type": "noul", "instructions": "Is the customer upset?"},
    }
)
rendered = [engine.renderer.render(state, q) for q in questions.values()]
batch = {k: jnp.asarray(v) for k, v in pad(build_forest(rendered)).items()}
probabilities = decide(engine.params, batch)  # (Q, O), padded options are 0
# Rows and options may be padded past the questions' own: zip stops at the real ones.
for (qid, q), p in zip(questions.items(), probabilities, strict=False):
    print(qid, {k: round(float(x), 4) for k, x in zip(q.keys, p, strict=False)})

# %% [markdown]
# The same numbers through the engine's System One API:

# %%
print(engine.decide(state, {"angry": {"type": "noul", "instructions": "Is the customer upset?"}}))
