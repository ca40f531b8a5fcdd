"""HF transformers baseline for benchmarks/cpu_decide.py (runs in the .venv-ref interpreter:
PyTorch CPU). Each question is a separate forward pass over its whole prompt, full logits at
the last position, softmax over the vocabulary, then the option tokens renormalised: the usual
way to get option probabilities from a generic engine.

Input JSON: {"model_dir", "dtype", "runs", "warmup", "scenarios": {name: [[prompt ids],
[option ids]] per question}}. Prints one JSON object: per scenario the timings and probabilities.
"""

import json
import statistics
import sys
import time

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM


def decide(model, questions, batched: bool):
    out = []
    with torch.inference_mode():
        if batched:  # one padded batch (left padding keeps the last position aligned)
            width = max(len(p) for p, _ in questions)
            ids = torch.zeros((len(questions), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, (p, _) in enumerate(questions):
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            out_ = model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
            logits = out_.logits[:, -1].float()
            rows = list(logits)
        else:
            rows = [
                model(input_ids=torch.tensor([p]), logits_to_keep=1).logits[0, -1].float()
                for p, _ in questions
            ]
        for row, (_, options) in zip(rows, questions, strict=True):
            probs = torch.softmax(row, -1)[options]
            out.append((probs / probs.sum()).tolist())
    return out


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    torch.set_num_threads(int(spec.get("threads", 2)))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[spec["dtype"]]
    # prism_jax's cached checkpoints are written with safetensors' numpy API ("np" format
    # metadata), which from_pretrained refuses: build from the config, load the same tensors.
    config = AutoConfig.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = load_file(f"{spec['model_dir']}/model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    model.tie_weights()
    model = model.to(dtype).eval()
    result = {}
    for name, questions in spec["scenarios"].items():
        for batched in (False, True) if spec.get("batched") and len(questions) > 1 else (False,):
            for _ in range(spec["warmup"]):
                decide(model, questions, batched)
            times = []
            for _ in range(spec["runs"]):
                start = time.perf_counter()
                probs = decide(model, questions, batched)
                times.append(time.perf_counter() - start)
            key = f"{name}/{'batched' if batched else 'serial'}"
            result[key] = {
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
                "runs": len(times),
                "probabilities": probs,
            }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
