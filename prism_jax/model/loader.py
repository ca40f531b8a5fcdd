"""Checkpoints on disk -> HF config dict + HF-named numpy tensors.

Accepted: an HF model directory (config.json + model.safetensors, or sharded with
model.safetensors.index.json), a .gguf file, or a registered model name ("default", see
registry.py). A GGUF is converted once into an HF directory in the user cache,
  <cache>/checkpoints/<stem>-<key>/{config.json, model.safetensors, tokenizer.json,
                                     tokenizer_config.json, source.json}
keyed by the GGUF's SHA-256 and the converter version, so later loads read float32 safetensors
instead of dequantising again (3-13 s); the hash itself is remembered per path, size and mtime.
Tensors come back as read-only memory maps: loading is instant and pages are read when the
weights are first used.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from prism_jax.model import gguf_convert
from prism_jax.model.gguf_convert import CheckpointError
from prism_jax.model.registry import cache_root, known_sha256, resolve_model

# Bump when the GGUF -> HF conversion changes, so stale cached conversions are not reused.
CONVERTER_VERSION = 1
_HF_LAYOUT = (
    "expected an HF model directory with config.json and model.safetensors (or "
    "model.safetensors.index.json and its shards), or a .gguf file"
)
_DTYPES = {
    "F32": np.dtype(np.float32),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
}


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    hf_config: dict[str, Any]  # config.json content (synthesised from metadata for a GGUF)
    tensors: dict[str, np.ndarray]  # HF state-dict names; float32 or bfloat16 (ml_dtypes)
    source: str  # what was asked for: the directory or the .gguf file
    directory: Path  # the HF directory the tensors were read from (the cache dir for a GGUF)


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Loads an HF safetensors directory, a .gguf file or a registered model name.

    Raises CheckpointError (or FileNotFoundError for a missing path) saying what was expected.
    """
    source = resolve_model(path)
    directory = checkpoint_dir(source)
    config = read_config(directory)
    return Checkpoint(config, _read_weights(directory), str(source), directory)


def checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """The HF directory for a checkpoint: the directory itself, or a GGUF's cached conversion."""
    path = resolve_model(path)
    if path.is_dir():
        return path
    if not _is_gguf(path):
        raise CheckpointError(f"{path} is neither a directory nor a GGUF file: {_HF_LAYOUT}")
    return gguf_checkpoint_dir(path)


def read_config(directory: Path) -> dict[str, Any]:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"no config.json in {directory}: {_HF_LAYOUT}")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config_path} is not valid JSON ({e}): {_HF_LAYOUT}") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} holds a {type(config).__name__}, expected an object")
    return config


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


# --- safetensors -------------------------------------------------------------------------------


def _read_weights(directory: Path) -> dict[str, np.ndarray]:
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors(single)
    if not index.is_file():
        hint = (
            "; it has PyTorch .bin weights: convert them to safetensors first"
            if any(directory.glob("*.bin"))
            else ""
        )
        raise CheckpointError(
            f"no model.safetensors or model.safetensors.index.json in {directory}{hint}: "
            f"{_HF_LAYOUT}"
        )
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"{index} is malformed ({type(e).__name__}: {e}): expected JSON with a "
            '"weight_map" object mapping tensor names to shard file names'
        ) from e
    tensors: dict[str, np.ndarray] = {}
    for shard in shards:
        if not (directory / shard).is_file():
            raise CheckpointError(f"{index} names shard {shard}, which is not in {directory}")
        tensors.update(read_safetensors(directory / shard))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise CheckpointError(f"{index} lists tensors that no shard holds: {missing[:5]}")
    return tensors


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Memory-maps a .safetensors file; F16 is widened to float32 (our weights are f32 or bf16)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")

    def bad(why: str) -> CheckpointError:
        return CheckpointError(
            f"malformed safetensors file {path}: {why}; re-create or re-download it"
        )

    if data.size < 8:
        raise bad("shorter than its 8-byte header length")
    n = int(data[:8].view("<u8")[0])
    if n > data.size - 8:
        raise bad(f"header length {n} exceeds the file size {data.size}")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad(f"header is not JSON ({e})") from e
    body = data[8 + n :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = _DTYPES[info["dtype"]], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"tensor {name}: {info!r} is not a supported entry (F32, BF16, F16)") from e
        if end - begin != dtype.itemsize * int(np.prod(shape)) or end > body.size:
            raise bad(f"tensor {name}: offsets {begin}..{end} do not fit shape {shape}")
        array = np.asarray(body[begin:end]).view(dtype).reshape(shape)
        tensors[name] = array.astype(np.float32) if dtype == np.float16 else array
    return tensors


def write_safetensors(
    path: Path, shapes: Mapping[str, tuple[int, ...]], arrays: Iterable[tuple[str, np.ndarray]]
) -> None:
    """Streams float32 tensors into a safetensors file, one tensor in memory at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "np"}}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape))
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment
    with open(path, "wb") as f:
        f.write(np.uint64(len(raw)).tobytes() + raw)
        for name, array in arrays:
            if tuple(array.shape) != tuple(shapes[name]) or array.dtype != np.float32:
                raise AssertionError(f"{name}: {array.dtype}{array.shape} != f32{shapes[name]}")
            f.write(np.ascontiguousarray(array).tobytes())


# --- GGUF -> cached HF directory ---------------------------------------------------------------


def gguf_checkpoint_dir(gguf_path: Path) -> Path:
    """The cached HF directory converted from gguf_path, converting it on first use.

    Keyed by the file's content, so reinstalling a model package, or a second virtualenv with the
    same file, reuses the conversion instead of adding hundreds of MB to the cache each time.
    """
    sha = known_sha256(gguf_path)
    key = hashlib.sha256(f"{CONVERTER_VERSION}:{sha}".encode()).hexdigest()[:16]
    target = cache_root() / "checkpoints" / f"{gguf_path.stem}-{key}"
    if (target / "source.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _convert_gguf(gguf_path, tmp, sha)
        try:
            os.rename(tmp, target)  # atomic: readers see a whole directory or none
        except OSError:
            if not (target / "source.json").is_file():
                raise  # not a concurrent conversion that won the race
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _remove_superseded(target, gguf_path)
    return target


def _remove_superseded(current: Path, gguf_path: Path) -> None:
    """Deletes earlier conversions of the same path (an older file there, or converter).

    Open memory maps of a deleted conversion stay valid (POSIX unlink semantics).
    """
    source = str(gguf_path.resolve())
    for other in current.parent.glob(f"{glob.escape(gguf_path.stem)}-*"):
        if other == current or not (other / "source.json").is_file():
            continue
        try:
            recorded = json.loads((other / "source.json").read_text()).get("gguf")
        except (OSError, json.JSONDecodeError):
            continue  # being written or removed by another process: not ours to judge
        if recorded == source:
            shutil.rmtree(other, ignore_errors=True)


def _convert_gguf(gguf_path: Path, out: Path, sha256: str) -> None:
    g = gguf_convert.read_gguf(gguf_path)
    config = gguf_convert.hf_config_from_gguf(g)
    shapes = {gguf_convert.hf_name(n, g.arch): t.shape for n, t in g.tensors.items()}
    write_safetensors(
        out / "model.safetensors", shapes, gguf_convert.hf_tensors_from_gguf(g, config)
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if "tokenizer.ggml.model" in g.metadata:
        from prism_jax.tokenizer import tokenizer_files_from_gguf  # imports transformers

        for name, text in tokenizer_files_from_gguf(g.metadata).items():
            (out / name).write_text(text)
    st = gguf_path.stat()
    source = {
        "gguf": str(gguf_path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": sha256,
        "converter_version": CONVERTER_VERSION,
    }
    (out / "source.json").write_text(json.dumps(source, indent=2))  # written last: "complete"
