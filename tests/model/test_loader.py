"""loader.py and gguf_convert.py on tiny checkpoints written here: HF safetensors directories
(single and sharded), malformed ones, and GGUF files written the way llama.cpp writes them."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from prism_jax.config import ModelConfig
from prism_jax.model import gguf_convert, loader, registry
from prism_jax.model.loader import CheckpointError, load_checkpoint

# Tiny shapes: D model dim, F ffw, N/K heads, H head dim, V vocab, L layers.
D, F, N, K, H, V, L = 64, 96, 4, 2, 16, 128, 2


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own user cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PRISM_JAX_CACHE", str(root))
    return root


def hf_tensors(rng: np.random.Generator, arch: str) -> dict[str, np.ndarray]:
    """A random HF state dict for a tiny model of this family (float32)."""

    def w(*shape: int) -> np.ndarray:
        # bf16-representable, as HF checkpoints ship: then Gemma's stored 1 + gamma is exact in
        # f32 and the loader must give gamma back bit for bit.
        # (Values below 2^-16 would not survive 1 + gamma; real norm weights are not that small.)
        x = rng.standard_normal(shape)
        x = np.where(np.abs(x) < 2.0**-8, 2.0**-8, x)
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, D), "model.norm.weight": w(D)}
    if arch != "gemma3":
        t["lm_head.weight"] = w(V, D)  # untied
    for i in range(L):
        p = f"model.layers.{i}."
        t |= {
            p + "self_attn.q_proj.weight": w(N * H, D),
            p + "self_attn.k_proj.weight": w(K * H, D),
            p + "self_attn.v_proj.weight": w(K * H, D),
            p + "self_attn.o_proj.weight": w(D, N * H),
            p + "mlp.gate_proj.weight": w(F, D),
            p + "mlp.up_proj.weight": w(F, D),
            p + "mlp.down_proj.weight": w(D, F),
            p + "input_layernorm.weight": w(D),
            p + "post_attention_layernorm.weight": w(D),
        }
        if arch == "qwen2":
            t |= {
                p + f"self_attn.{x}_proj.bias": w(n * H) for x, n in (("q", N), ("k", K), ("v", K))
            }
        if arch == "gemma3":
            t |= {
                p + "self_attn.q_norm.weight": w(H),
                p + "self_attn.k_norm.weight": w(H),
                p + "pre_feedforward_layernorm.weight": w(D),
                p + "post_feedforward_layernorm.weight": w(D),
            }
    return t


def config_json(arch: str) -> dict:
    model_type = {"gemma3": "gemma3_text"}.get(arch, arch)
    return {
        "model_type": model_type,
        "vocab_size": V,
        "hidden_size": D,
        "intermediate_size": F,
        "num_hidden_layers": L,
        "num_attention_heads": N,
        "num_key_value_heads": K,
        "head_dim": H,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": arch == "gemma3",
    }


# --- HF safetensors directories ----------------------------------------------------------------


def test_single_file_dir_keeps_f32_and_bf16(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = hf_tensors(rng, "llama")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(ml_dtypes.bfloat16)
    tensors["model.layers.0.input_layernorm.weight"] = tensors[
        "model.layers.0.input_layernorm.weight"
    ].astype(np.float16)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config_json("llama")))
    ck = load_checkpoint(tmp_path)
    assert ck.hf_config == config_json("llama") and ck.source == str(tmp_path)
    assert set(ck.tensors) == set(tensors)
    assert ck.tensors["model.norm.weight"].dtype == ml_dtypes.bfloat16
    f16 = ck.tensors["model.layers.0.input_layernorm.weight"]
    assert f16.dtype == np.float32  # F16 is widened: weights reach the model as f32 or bf16
    np.testing.assert_array_equal(f16, tensors["model.layers.0.input_layernorm.weight"])
    for name, value in tensors.items():
        np.testing.assert_array_equal(
            np.asarray(ck.tensors[name], np.float32), value.astype(np.float32)
        )


def test_sharded_dir(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = hf_tensors(rng, "qwen2")
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, tmp_path / shard)
    weight_map = {n: s for s, members in shards.items() for n in members}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(config_json("qwen2")))
    ck = load_checkpoint(tmp_path)
    assert set(ck.tensors) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(ck.tensors[name], value)


@pytest.mark.parametrize(
    "case, message",
    [
        ("empty", "no config.json in"),
        ("bad_json", "config.json is not valid JSON"),
        ("no_weights", "no model.safetensors or model.safetensors.index.json in"),
        ("bin_weights", "PyTorch .bin weights"),
        ("missing_shard", "names shard b.safetensors, which is not in"),
        ("bad_index", "model.safetensors.index.json is malformed"),
        ("truncated", "malformed safetensors file"),
        ("not_gguf", "is neither a directory nor a GGUF file"),
        ("truncated_gguf", "the file is truncated"),
    ],
)
def test_malformed_checkpoints_say_what_was_expected(
    tmp_path: Path, case: str, message: str, rng: np.random.Generator
) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    config = json.dumps(config_json("llama"))
    target: Path = d
    if case == "bad_json":
        (d / "config.json").write_text("{not json")
    elif case in ("no_weights", "bin_weights", "missing_shard", "bad_index", "truncated"):
        (d / "config.json").write_text(config)
    if case == "bin_weights":
        (d / "pytorch_model.bin").write_bytes(b"\0")
    elif case == "missing_shard":
        save_file({"a": np.zeros(2, np.float32)}, d / "a.safetensors")
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"a": "a.safetensors", "b": "b.safetensors"}})
        )
    elif case == "bad_index":
        (d / "model.safetensors.index.json").write_text(json.dumps({"shards": []}))
    elif case == "truncated":
        save_file({"a": np.zeros(64, np.float32)}, d / "model.safetensors")
        raw = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(raw[:-16])
    elif case == "not_gguf":
        target = d / "model.bin"
        target.write_bytes(b"PK\3\4 not a model")
    elif case == "truncated_gguf":
        target = write_gguf(d / "m.gguf", "llama", hf_tensors(rng, "llama"))
        target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(target)
    if case in ("empty", "no_weights"):
        assert "expected an HF model directory with config.json and model.safetensors" in str(
            info.value
        )


def test_missing_path_names_the_alternatives(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a registered model .*default"):
        load_checkpoint(tmp_path / "nope")


# --- GGUF --------------------------------------------------------------------------------------


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp applies it to q/k rows."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_feedforward_layernorm": "post_ffw_norm",
    "pre_feedforward_layernorm": "ffn_norm",
}


def gguf_name(name: str, arch: str) -> str:
    if name in _TO_GGUF:
        return _TO_GGUF[name]
    _, _, layer, *rest = name.split(".")
    base, kind = ".".join(rest[:-1]), rest[-1]
    if base == "post_attention_layernorm":
        short = "post_attention_norm" if arch == "gemma3" else "ffn_norm"
    else:
        short = _LAYER_TO_GGUF[base]
    return f"blk.{layer}.{short}.{kind}"


def llama_cpp_tensor(name: str, w: np.ndarray, arch: str) -> np.ndarray:
    """What convert_hf_to_gguf.py stores for an HF tensor."""
    if arch == "llama" and ".q_proj." in name:
        return llama_cpp_permute(w, N)
    if arch == "llama" and ".k_proj." in name:
        return llama_cpp_permute(w, K)
    if arch == "gemma3" and name.endswith("norm.weight"):
        return w + np.float32(1.0)  # Gemma3Model.norm_shift
    return w


Q8_TENSOR = "model.layers.1.mlp.down_proj.weight"


def write_gguf(path: Path, arch: str, tensors: dict[str, np.ndarray], q8: bool = False) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(N)
    w.add_head_count_kv(K)
    w.add_key_length(H)
    w.add_value_length(H)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10_000.0)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    if arch == "gemma3":
        w.add_sliding_window(64)
    for name, value in tensors.items():
        data = llama_cpp_tensor(name, value, arch)
        if q8 and name == Q8_TENSOR:
            w.add_tensor(
                gguf_name(name, arch),
                gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            w.add_tensor(gguf_name(name, arch), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_gguf_gives_back_the_hf_tensors(
    tmp_path: Path, rng: np.random.Generator, arch: str
) -> None:
    tensors = hf_tensors(rng, arch)
    ck = load_checkpoint(write_gguf(tmp_path / f"{arch}.gguf", arch, tensors, q8=True))
    assert set(ck.tensors) == set(tensors)
    for name, value in tensors.items():
        got = ck.tensors[name]
        assert got.dtype == np.float32 and got.shape == value.shape, name
        if name == Q8_TENSOR:
            # Q8_0: per 32 values one f16 scale d = amax / 127; rounding to int8 costs d / 2 and
            # rounding d to f16 up to 127 * d * 2^-11 more.
            bound = np.abs(value).reshape(-1, 32).max(-1) / 127 * (0.5 + 127 * 2.0**-11) + 1e-7
            err = np.abs(got - value).reshape(-1, 32).max(-1)
            assert (err <= bound).all() and err.max() > 0
        else:
            np.testing.assert_array_equal(got, value, err_msg=name)


def test_gguf_config_is_hf_shaped(tmp_path: Path, rng: np.random.Generator) -> None:
    ck = load_checkpoint(write_gguf(tmp_path / "g.gguf", "gemma3", hf_tensors(rng, "gemma3")))
    c = ck.hf_config
    assert c["model_type"] == "gemma3_text" and c["tie_word_embeddings"] is True
    assert c["layer_types"] == ["sliding_attention"] * 2  # global every 6th layer
    assert (c["query_pre_attn_scalar"], c["rope_local_base_freq"], c["rms_norm_eps"]) == (
        H,
        10_000.0,
        1e-6,
    )
    config = ModelConfig.from_hf_config(c)
    assert (config.family, config.vocab_size, config.num_kv_heads, config.sliding_window) == (
        "gemma3",
        V,
        K,
        64,
    )
    llama = load_checkpoint(write_gguf(tmp_path / "l.gguf", "llama", hf_tensors(rng, "llama")))
    assert ModelConfig.from_hf_config(llama.hf_config).tie_word_embeddings is False
    assert llama.hf_config["bos_token_id"] == 2 and llama.hf_config["eos_token_id"] == [1]


def test_fast_reader_matches_gguf_reader(tmp_path: Path, rng: np.random.Generator) -> None:
    path = write_gguf(tmp_path / "m.gguf", "llama", hf_tensors(rng, "llama"), q8=True)
    ours, ref = gguf_convert.read_gguf(path), gguf.GGUFReader(path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert ours.metadata[key] == pytest.approx(field.contents()), key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        expected = gguf.quants.dequantize(t.data, t.tensor_type)
        np.testing.assert_array_equal(
            ours.dequantize(t.name), expected.reshape(ours.tensors[t.name].shape)
        )


def test_unpermute_inverts_llama_cpp_permute(rng: np.random.Generator) -> None:
    for shape in ((N * H, D), (N * H,)):
        w = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(
            gguf_convert.unpermute_rope_rows(llama_cpp_permute(w, N), N), w
        )


def test_gguf_conversion_is_cached(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    path = write_gguf(tmp_path / "m.gguf", "qwen2", hf_tensors(rng, "qwen2"))
    first = load_checkpoint(path)
    assert first.directory.parent == cache / "checkpoints"
    assert json.loads((first.directory / "source.json").read_text())["size"] == path.stat().st_size

    def fail(*args: object) -> None:
        raise AssertionError("converted twice")

    monkeypatch.setattr(loader, "_convert_gguf", fail)
    second = load_checkpoint(path)
    assert second.directory == first.directory
    np.testing.assert_array_equal(second.tensors["lm_head.weight"], first.tensors["lm_head.weight"])


def test_gguf_conversion_is_shared_by_identical_files(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    """A reinstalled package (new path or mtime, same bytes) must not add a second conversion."""
    path = write_gguf(tmp_path / "m.gguf", "llama", hf_tensors(rng, "llama"))
    first = load_checkpoint(path)
    copy = tmp_path / "venv2" / "m.gguf"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())

    def fail(*args: object) -> None:
        raise AssertionError("the same bytes were converted twice")

    monkeypatch.setattr(loader, "_convert_gguf", fail)
    assert load_checkpoint(copy).directory == first.directory
    assert [p.name for p in (cache / "checkpoints").iterdir()] == [first.directory.name]


def test_changed_gguf_replaces_its_old_conversion(
    tmp_path: Path, rng: np.random.Generator, cache: Path
) -> None:
    # "[" in the name: the old conversions are found with a glob, which must escape it.
    path = write_gguf(tmp_path / "m[q8].gguf", "llama", hf_tensors(rng, "llama"))
    old = load_checkpoint(path)
    old_embed = np.array(old.tensors["model.embed_tokens.weight"])
    write_gguf(path, "llama", hf_tensors(rng, "llama"))  # new weights at the same path
    new = load_checkpoint(path)
    assert new.directory != old.directory and not old.directory.exists()
    assert [p.name for p in (cache / "checkpoints").iterdir()] == [new.directory.name]
    assert not np.array_equal(new.tensors["model.embed_tokens.weight"], old_embed)
    source = json.loads((new.directory / "source.json").read_text())
    assert source["sha256"] == registry.file_sha256(path), source


def test_unknown_gguf_tensor_is_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = hf_tensors(rng, "llama")
    path = write_gguf(tmp_path / "m.gguf", "llama", tensors)
    g = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "llama")
    for key, value in gguf_convert.read_gguf(path).metadata.items():
        if key.startswith("llama."):
            g.add_uint32(key, int(value)) if isinstance(value, int) else g.add_float32(key, value)
    for name, value in tensors.items():
        g.add_tensor(gguf_name(name, "llama"), value)
    g.add_tensor("rope_freqs.weight", np.ones(H // 2, np.float32))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    with pytest.raises(gguf_convert.GGUFFormatError, match="rope_freqs.weight"):
        load_checkpoint(tmp_path / "x.gguf")


def test_config_defaults_when_metadata_omits_optional_keys() -> None:
    md = {
        "general.architecture": "llama",
        "llama.attention.head_count": N,
        "llama.embedding_length": D,
        "llama.feed_forward_length": F,
        "llama.block_count": L,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.context_length": 128,
    }
    embd = gguf_convert.GGUFTensor("token_embd.weight", (V, D), gguf.GGMLQuantizationType.F32, 0)
    g = gguf_convert.GGUFFile(Path("x.gguf"), md, {"token_embd.weight": embd}, None)
    c = gguf_convert.hf_config_from_gguf(g)
    assert (c["num_key_value_heads"], c["head_dim"], c["rope_theta"]) == (N, D // N, 10_000.0)
    del md["llama.block_count"]
    with pytest.raises(gguf_convert.GGUFFormatError, match="has no llama.block_count"):
        gguf_convert.hf_config_from_gguf(g)
