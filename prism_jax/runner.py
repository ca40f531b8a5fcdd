"""The runner: compiled step executables per static bucket, and the device KV pool.

Every shape the scheduler can produce is a bucket: forward steps by token count, readouts by
(rows, candidates), vocabulary passes by rows. `warmup` compiles all of them ahead of time
(with a progress bar; the persistent compilation cache makes later starts fast), after which a
step only looks its executable up: steady state never compiles. The KV pool is donated into
each forward step and replaced by the result, so XLA updates it in place.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax import model
from prism_jax.config import EngineConfig, ModelConfig
from prism_jax.decide import paged_tables
from prism_jax.kv_pages import KVPool, init_kv_pool


class Runner:
    def __init__(self, config: ModelConfig, params: model.Params, engine: EngineConfig) -> None:
        self.config, self.params, self.engine = config, params, engine
        self.kv: KVPool = init_kv_pool(config, engine.kv_pages, engine.page_size, params.precision)
        self._compiled: dict[tuple, jax.stages.Compiled] = {}
        self.compilations = 0  # executables built by this runner (steady state: constant)

        # The forward takes the weights as a flat list of arrays: flattening the nnx params
        # pytree on every call cost milliseconds of host time per step; a list is C++-fast.
        self._param_leaves, param_tree = jax.tree.flatten(params)

        def fwd(leaves, kv, tokens, tables):
            params = jax.tree.unflatten(param_tree, leaves)
            return model.forward_paged(params, config, kv, tokens, tables)

        self._forward = jax.jit(fwd, donate_argnums=1)
        # Readouts take the gathered rows [R, D], so they are compiled per (R, C), not per T,
        # and only the output embedding: passing the whole params pytree (hundreds of leaves)
        # to every readout call cost milliseconds of host time per step.
        self._embedding = model.output_embedding(params, config)
        self._gather = jax.jit(lambda h, r: h[r])
        self._readout = jax.jit(lambda e, h, i, c: model.candidate_head(e, config, h, i, c))
        self._lse = jax.jit(lambda e, h: model.embedding_logsumexp(e, config, h))

    # --- shapes ----------------------------------------------------------------------------
    def _spec(self, shape, dtype=jnp.int32) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype)

    def _hidden_spec(self, t: int) -> jax.ShapeDtypeStruct:
        dtype = jnp.bfloat16 if self.params.precision == "bf16" else jnp.float32
        return self._spec((t, self.config.hidden_size), dtype)

    def _forward_args(self, t: int):
        e = self.engine
        tables = model.PagedTables(
            self._spec((t,)),
            self._spec((t,)),
            self._spec((t,)),
            self._spec((t, e.chain_depth, 3)),
            self._spec((e.kv_pages,)),
        )
        return (self._param_leaves, self.kv, self._spec((t,)), tables)

    def bucket_keys(self) -> list[tuple]:
        e = self.engine
        keys: list[tuple] = [("forward", t) for t in e.token_buckets]
        keys += [
            ("gather", t, r) for t, r in itertools.product(e.token_buckets, e.row_buckets) if r <= t
        ]
        keys += [("lse", r) for r in e.row_buckets]
        keys += [
            ("readout", r, c) for r, c in itertools.product(e.row_buckets, e.candidate_buckets)
        ]
        return keys

    def _compile(self, key: tuple) -> jax.stages.Compiled:
        kind = key[0]
        if kind == "forward":
            lowered = self._forward.lower(*self._forward_args(key[1]))
        elif kind == "gather":
            lowered = self._gather.lower(self._hidden_spec(key[1]), self._spec((key[2],)))
        elif kind == "lse":
            lowered = self._lse.lower(self._embedding, self._hidden_spec(key[1]))
        else:
            r, c = key[1], key[2]
            lowered = self._readout.lower(
                self._embedding, self._hidden_spec(r), self._spec((r, c)), self._spec((r,))
            )
        self.compilations += 1
        return lowered.compile()

    def executable(self, key: tuple) -> jax.stages.Compiled:
        if key not in self._compiled:
            self._compiled[key] = self._compile(key)
        return self._compiled[key]

    def warmup(self, progress: bool = True) -> None:
        """Compiles every bucket now (a progress bar on stderr when progress is True)."""
        from tqdm import tqdm

        keys = [k for k in self.bucket_keys() if k not in self._compiled]
        for key in tqdm(keys, desc="compiling step buckets", disable=not progress, unit="shape"):
            self.executable(key)

    # --- running ---------------------------------------------------------------------------
    def forward(self, arrays: Mapping[str, np.ndarray]) -> jax.Array:
        """Runs one padded step; the pool is donated and replaced. Returns hidden [T, D]."""
        t = arrays["tokens"].shape[0]
        tables = paged_tables(arrays)
        hidden, self.kv = self.executable(("forward", t))(
            self._param_leaves, self.kv, arrays["tokens"], tables
        )
        return hidden

    def read(
        self, hidden: jax.Array, arrays: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(logits [R, C], logprobs [R, C], lse [R']) on the host for the step's readout rows;
        lse only for arrays["lse_rows"] (empty when no row needs the vocabulary pass)."""
        t = hidden.shape[0]
        r, c = arrays["cand_ids"].shape
        rows = self.executable(("gather", t, r))(hidden, arrays["rows"])  # (R, D)
        logits, logprobs = self.executable(("readout", r, c))(
            self._embedding, rows, arrays["cand_ids"], arrays["cand_counts"]
        )
        lse = np.zeros(0, np.float32)
        if len(arrays["lse_of"]):
            r2 = arrays["lse_rows"].shape[0]
            lse_hidden = self.executable(("gather", t, r2))(hidden, arrays["lse_rows"])
            lse = self.executable(("lse", r2))(self._embedding, lse_hidden)
        # One transfer for all results: each np.asarray would wait for the device on its own.
        logits, logprobs, lse = jax.device_get((logits, logprobs, lse))
        return np.asarray(logits), np.asarray(logprobs), np.asarray(lse)
