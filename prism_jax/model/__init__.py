"""prism_jax.model: the decoder (Gemma 3, Llama, Qwen2, Qwen3) as Flax nnx modules driven by
pure functions; see transformer.py for the modules, steps.py for the step functions,
readout.py for scoring hidden states and layers.py for the three precisions."""

from prism_jax.model.attention_backends import PagedTables
from prism_jax.model.hf_weights import check_hf_tensors, hf_tensor_shapes, params_from_hf
from prism_jax.model.layers import PRECISIONS
from prism_jax.model.random_weights import init_random
from prism_jax.model.readout import (
    candidate_head,
    candidate_readout,
    embedding_logsumexp,
    full_logits,
    output_embedding,
    vocab_logsumexp,
)
from prism_jax.model.steps import forward, forward_paged, forward_paged_part
from prism_jax.model.transformer import Params, Transformer, abstract_model, bind

__all__ = [
    "PRECISIONS",
    "PagedTables",
    "Params",
    "Transformer",
    "abstract_model",
    "bind",
    "candidate_head",
    "candidate_readout",
    "check_hf_tensors",
    "embedding_logsumexp",
    "forward",
    "forward_paged",
    "forward_paged_part",
    "full_logits",
    "hf_tensor_shapes",
    "init_random",
    "output_embedding",
    "params_from_hf",
    "vocab_logsumexp",
]
