"""The runner: compiled step executables per static bucket, and the device KV pool.

Every shape the scheduler can produce is a bucket: forward steps by token count T (their last
layer by (T, readout rows R)), readouts by (hidden rows, R, candidates C), vocabulary passes by
(hidden rows, lse rows). `warmup` compiles all of them
ahead of time (with a progress bar; the persistent compilation cache makes later starts fast),
after which a step only looks its executable up: steady state never compiles. The KV pool is
donated into each forward step and replaced by the result, so XLA updates it in place.

Host overhead per step is one int32 transfer and one dispatch per executable: each call's
integer inputs travel packed in one buffer (step_buffers), and a readout gathers its rows,
scores the candidates and returns one f32 array, so a step costs a call per forward part and
one readout call (two when some row needs the vocabulary pass) and one device-to-host read.

On the GPU a forward step runs as several executables of consecutive layers (forward_parts.py:
2, 4, then 8 layers each for the 27B): XLA spends ~55 us of host time per 27B layer before an
executable's first kernel, so one executable for all layers kept the GPU idle ~4 ms per step,
while with parts only the first (smallest) part's host work precedes the GPU. Each part is a
CUDA graph (an XLA command buffer) that XLA re-records whenever a buffer it uses has moved; the
engine drops a step's hidden before its next forward, so the allocator hands the same blocks
back (dispatch_probe.py's forward_held measures a caller that holds it).

With EngineConfig.readout_only_last_layer (the default) the last decoder layer is a part of its
own, compiled per (T, R): it writes every token's k/v but carries only the step's R readout rows
past its attention, so the forward returns hidden [R, D] in the order of the step's rows, and
the readouts (compiled per hidden rows R) read rows 0..R-1 of it. Same bits as the full layer.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax import model
from prism_jax.config import COMMAND_BUFFERS, EngineConfig, ModelConfig
from prism_jax.forward_parts import layers_per_call, part_leaf_indices, plan_parts
from prism_jax.kv_pages import KVPool, init_kv_pool
from prism_jax.step_buffers import Layout, forward_layout, pack, readout_layout, size, unpack


class Runner:
    def __init__(self, config: ModelConfig, params: model.Params, engine: EngineConfig) -> None:
        self.config, self.params, self.engine = config, params, engine
        self.kv: KVPool = init_kv_pool(config, engine.kv_pages, engine.page_size, params.precision)
        self._compiled: dict[tuple, jax.stages.Compiled] = {}
        self.compilations = 0  # executables built by this runner (steady state: constant)
        # The forward takes the weights as a flat list of arrays: flattening the nnx params
        # pytree on every call cost milliseconds of host time per step; a list is C++-fast.
        self._param_leaves, self._param_tree = jax.tree.flatten(params)
        # The forward runs as consecutive parts of a few layers each (forward_parts.py), each
        # passed only the weights it reads.
        per_call = layers_per_call(
            engine.forward_layers_per_call, config.num_layers, jax.default_backend()
        )
        # readout_only_last_layer: the last layer is a part of its own (the tail), per row bucket.
        self.tail = engine.readout_only_last_layer
        body = config.num_layers - 1 if self.tail else config.num_layers
        first = min(engine.forward_first_layers, per_call)
        self.parts = plan_parts(body, per_call, first) if body else ()
        if self.tail:
            self.parts += (range(body, config.num_layers),)
        self._part_leaves = part_leaf_indices(params, self.parts)
        self._part_leaves_of = [[self._param_leaves[i] for i in ix] for ix in self._part_leaves]
        # Readouts take only the output embedding: passing the whole params pytree (hundreds
        # of leaves) to every readout call cost milliseconds of host time per step.
        self._embedding = model.output_embedding(params, config)

    # --- the jitted step functions (layouts are static: one jit per bucket) ----------------
    def _forward_fn(self, layout: Layout, part: int, rows: int | None = None):
        """Part `part` of a forward step; the tail (rows = R) returns hidden [R, D] of the
        step's first R out_rows."""
        config, tree, n = self.config, self._param_tree, len(self._param_leaves)
        layers, indices = self.parts[part], self._part_leaves[part]

        def fwd(leaves, kv, carry, packed):
            a = unpack(packed, layout)
            tables = model.PagedTables(
                a["slot"], a["positions"], a["chain_of"], a["chain_segments"], a["pages_flat"]
            )
            # Other parts' weights are never read here: None stands in for them, so the
            # params pytree stays whole for bind() without their being passed.
            full = [None] * n
            for i, leaf in zip(indices, leaves, strict=True):
                full[i] = leaf
            params = jax.tree.unflatten(tree, full)
            out_rows = None if rows is None else a["out_rows"][:rows]
            return model.forward_paged_part(
                params, config, kv, a["tokens"], carry, tables, layers, out_rows
            )

        return jax.jit(fwd, donate_argnums=1)

    def _readout_fn(self, layout: Layout):
        config = self.config

        def read(emb, hidden, packed):
            a = unpack(packed, layout)
            rows = hidden[a["rows"]]  # (R, D)
            logits, logprobs = model.candidate_head(
                emb, config, rows, a["cand_ids"], a["cand_counts"]
            )
            return jnp.stack([logits, logprobs])  # (2, R, C): one device-to-host copy

        return jax.jit(read, out_shardings=self._readout_sharding())

    def _lse_fn(self):
        config = self.config
        return jax.jit(
            lambda emb, hidden, rows: model.embedding_logsumexp(emb, config, hidden[rows]),
            out_shardings=self._readout_sharding(),
        )

    def _readout_sharding(self) -> jax.sharding.Sharding | None:
        """The readouts' output placement (EngineConfig.readout_memory): host memory of the
        engine's device (its weights' device, which need not be jax.devices()[0]: a CPU engine
        on a GPU machine) where that device has it, else (None) the device's default memory,
        as for weights spread over several devices."""
        devices = self._embedding.devices()
        if self.engine.readout_memory == "device" or len(devices) != 1:
            return None
        (device,) = devices
        if self.engine.readout_memory not in {m.kind for m in device.addressable_memories()}:
            return None
        return jax.sharding.SingleDeviceSharding(device, memory_kind=self.engine.readout_memory)

    # --- shapes ----------------------------------------------------------------------------
    def _spec(self, shape, dtype=jnp.int32) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype)

    def _hidden_spec(self, t: int) -> jax.ShapeDtypeStruct:
        dtype = jnp.bfloat16 if self.params.precision == "bf16" else jnp.float32
        return self._spec((t, self.config.hidden_size), dtype)

    def bucket_keys(self) -> list[tuple]:
        """Every executable a step can need. Each token bucket takes every row bucket: rows can
        outnumber tokens, because identical questions share their forest branch but keep one
        readout row each (24 of them on a cached state read 24 rows from an 8-token step), and
        a readout left out here would compile on first use, in the middle of serving.
        Readouts are keyed by hidden's rows: T, or R with the tail (then R' <= R lse rows)."""
        e = self.engine
        steps = itertools.product(e.token_buckets, e.row_buckets, e.candidate_buckets)
        keys = list(dict.fromkeys(k for t, r, c in steps for k in self.step_keys(t, r, c)))
        hidden_rows = e.row_buckets if self.tail else e.token_buckets
        lse_rows = [(h, x) for h in hidden_rows for x in e.row_buckets if not self.tail or x <= h]
        return keys + [("lse", h, x) for h, x in lse_rows]

    def step_keys(self, t: int, r: int, c: int | None) -> list[tuple]:
        """The executables a step of bucketed t tokens and r readout rows runs, with its
        readout of c candidates (None: a step without readout rows, e.g. a prefill chunk)."""
        keys = [("forward", t)] + ([("tail", t, r)] if self.tail else [])
        if c is not None:
            keys.append(("readout", r if self.tail else t, r, c))
        return keys

    def _part_args(self, part: int, t: int) -> tuple:
        """Forward part `part`'s weights, pools and carry for a step of t tokens."""
        layers = self.parts[part]
        kv = self.kv[layers.start : layers.stop]
        carry = None if part == 0 else (self._hidden_spec(t), self._hidden_spec(t))
        return self._part_leaves_of[part], kv, carry

    def _compile(self, key: tuple):
        kind, t = key[0], key[1]
        options = COMMAND_BUFFERS[self.engine.command_buffers]
        self.compilations += 1
        if kind in ("forward", "tail"):  # forward: one executable per part but the tail
            layout = forward_layout(t, self.engine)
            packed = self._spec((size(layout),))
            body = len(self.parts) - 1 if self.tail else len(self.parts)
            parts = [(p, None) for p in range(body)] if kind == "forward" else [(body, key[2])]
            out = tuple(
                self._forward_fn(layout, part, rows)
                .lower(*self._part_args(part, t), packed)
                .compile(compiler_options=options)
                for part, rows in parts
            )
            return out if kind == "forward" else out[0]
        if kind == "readout":
            layout = readout_layout(key[2], key[3])
            packed = self._spec((size(layout),))
            lowered = self._readout_fn(layout).lower(self._embedding, self._hidden_spec(t), packed)
        else:
            rows = self._spec((key[2],))
            lowered = self._lse_fn().lower(self._embedding, self._hidden_spec(t), rows)
        return lowered.compile(compiler_options=options)

    def executable(self, key: tuple):
        """The compiled executable of a bucket key; for ("forward", t) a tuple, one per part
        (less the tail, keyed ("tail", t, r), when there is one)."""
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
        """Runs one padded step; the pool is donated and replaced. Returns hidden [T, D], or
        with the tail [R, D] at the step's readout rows (arrays["rows"], in that order)."""
        t = arrays["tokens"].shape[0]
        # One transfer for the step's integers, not six, and for all parts.
        packed = jax.device_put(pack(arrays, forward_layout(t, self.engine)))
        runs = self.executable(("forward", t))
        if self.tail:
            runs += (self.executable(("tail", t, arrays["rows"].shape[0])),)
        carry = None
        for part, run in enumerate(runs):
            layers = self.parts[part]
            kv = list(self.kv)
            pools = tuple(kv[layers.start : layers.stop])
            carry, kv[layers.start : layers.stop] = run(
                self._part_leaves_of[part], pools, carry, packed
            )
            self.kv = tuple(kv)  # at once: a later part's failure leaves no donated pool here
        return carry

    def readout_inputs(self, hidden: jax.Array, arrays: Mapping[str, np.ndarray]):
        """(key, arrays) of the readout that reads the step's rows from `hidden`: with the tail
        hidden holds the rows themselves, in order, so the readout reads rows 0..R-1."""
        t = hidden.shape[0]
        r, c = arrays["cand_ids"].shape
        if self.tail:
            assert t == r, f"hidden has {t} rows, the step reads {r}: not this step's forward"
            arrays = _rows_in_tail_hidden(arrays)
        return ("readout", t, r, c), arrays

    def read(
        self, hidden: jax.Array, arrays: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(logits [R, C], logprobs [R, C], lse [R']) on the host for the step's readout rows;
        lse only for arrays["lse_rows"] (empty when no row needs the vocabulary pass)."""
        key, arrays = self.readout_inputs(hidden, arrays)
        t, r, c = key[1:]
        packed = pack(arrays, readout_layout(r, c))
        scores = self.executable(key)(self._embedding, hidden, packed)
        # With readout_memory="pinned_host" the executables write their results to host memory
        # themselves; otherwise the copies back are queued now, behind the readout.
        scores.copy_to_host_async()
        lse = np.zeros(0, np.float32)
        if len(arrays["lse_of"]):
            rows = arrays["lse_rows"]
            lse = self.executable(("lse", t, rows.shape[0]))(self._embedding, hidden, rows)
            lse.copy_to_host_async()
        # One read for all results: each np.asarray would wait for the device on its own.
        scores, lse = jax.device_get((scores, lse))
        return scores[0], scores[1], np.asarray(lse)


def _rows_in_tail_hidden(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The readout's arrays for a hidden of the step's rows only (the tail's output): rows
    0..R-1, and the lse rows as their positions among them."""
    lse_rows = np.zeros_like(arrays["lse_rows"])
    lse_rows[: len(arrays["lse_of"])] = arrays["lse_of"]
    rows = np.arange(arrays["rows"].shape[0], dtype=np.int32)
    return dict(arrays, rows=rows, lse_rows=lse_rows)
