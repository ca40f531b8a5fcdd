"""HF transformers reference for tests/model (runs in .venv-ref: Python 3.11, PyTorch CPU).

    .venv-ref/bin/python tests/reference/hf_reference.py SPEC.json OUT_DIR

SPEC.json: [{"name": str, "config": {HF config.json keys}, "seed": int, "tokens": [int]}]
or, for real weights, [{"name": str, "checkpoint": HF directory, "tokens": [int]}].
For each case, OUT_DIR/<name>/ receives the logits [T, V] of the fp32 model (logits_fp32.npy)
and of the same weights cast to bf16 (logits_bf16.npy), eager attention; a case with
"fp64": true also gets the fp64 run of the fp32 weights (logits_fp64.npy), the yardstick that
tells which of two fp32 runs drifted. Random cases also get the HF-saved config.json and
model.safetensors (random weights with non-trivial norms). OUT_DIR/env.json names the machine
and PyTorch's CPU kernels, for failure messages.
"""

from __future__ import annotations

import json
import math
import pathlib
import platform
import sys

import numpy as np
import safetensors.numpy
import torch
import transformers


def randomize(model: torch.nn.Module, seed: int, gemma: bool) -> None:
    """Weights that keep activations O(1) and norms far from the identity (HF inits norms to
    ones / zeros, which would hide a norm applied wrongly)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(0.3 * noise if gemma else 1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.5 * noise)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(noise * (2.0 / math.sqrt(p.shape[1])))
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))


def load_checkpoint(directory: pathlib.Path) -> torch.nn.Module:
    """An HF directory written by prism_jax's loader: its safetensors metadata says "np", which
    from_pretrained refuses, so the state dict is loaded by hand."""
    config = transformers.AutoConfig.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    state = {
        k: torch.from_numpy(np.asarray(v, np.float32))
        for k, v in safetensors.numpy.load_file(directory / "model.safetensors").items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model


def build(case: dict, out: pathlib.Path) -> torch.nn.Module:
    if "checkpoint" in case:
        return load_checkpoint(pathlib.Path(case["checkpoint"]))
    cfg = dict(case["config"])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    randomize(model, case["seed"], gemma=config.model_type.startswith("gemma"))
    model.save_pretrained(out, safe_serialization=True)
    return model


def run_case(case: dict, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = build(case, out).eval()
    ids = torch.tensor([case["tokens"]], dtype=torch.long)
    with torch.no_grad():
        np.save(out / "logits_fp32.npy", model(ids).logits[0].float().numpy())
        if case.get("fp64"):  # fp64 holds the fp32 weights exactly: the fp32 runs' yardstick
            np.save(out / "logits_fp64.npy", model.to(torch.float64)(ids).logits[0].numpy())
        model.to(torch.bfloat16)
        np.save(out / "logits_bf16.npy", model(ids).logits[0].float().numpy())


def environment() -> dict:
    """What a cross-machine difference in the reference logits would come from."""
    return dict(
        machine=platform.machine(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
    )


def main() -> None:
    spec_path, out_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    torch.set_num_threads(2)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "env.json").write_text(json.dumps(environment()))
    for case in json.loads(spec_path.read_text()):
        run_case(case, out_dir / case["name"])
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: ok")


if __name__ == "__main__":
    main()
