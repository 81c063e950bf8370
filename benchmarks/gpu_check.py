"""The GPU check a user runs on their own box (`make gpu-check`): does brorl work on this GPU,
and is its rollout engine and RL step as fast as the hardware allows?

In order, each part in a fresh process with a time limit of its own (8 minutes in all at most;
its time on a GPU is still to be measured):
1. `pytest -m gpu`: the CUDA cases of the test set (`tests/devices.py`), over the files that
   have them;
2. rollouts at the Qwen2.5-1.5B shape (random bfloat16 weights, 32-token prompts, 512 rollouts
   x 128 new tokens, N = 16 and 512): the hf engine against plain transformers `generate` at
   equal rows per call, and vllm when it imports (`benchmarks/rollout_throughput.py`; not with
   `--tiny`);
3. the hf engine's decode step at that shape: milliseconds per step of 512 rows (one prompt,
   the time of a 128-token call less a 1-token call, over the 127 steps between) against the
   memory floor, the time to read the weights and the key/value cache written so far (its mean
   over the steps; the prompt's once) at the device's data-sheet bandwidth (`brorl.system.devices`;
   `--memory-tbs` for a device it does not know);
4. one whole RL step at N = 16 and 512 (512 rollouts each) with its stage split and the
   update's tokens/s, padding share and MFU (`benchmarks/step_memory.py`).
Then one summary table, recorded as `gpu_check` (`python benchmarks/docs.py` renders it); the
rollout and step parts record their own tables too. A part that fails or runs out of time is
reported as such and the others still run; the exit code is 1 when any failed.

Needs torch with CUDA and the project's pure-Python pins (docs/gpu.md); no network. Without
CUDA it says so and exits 2. `--tiny` runs every part but the tests at the tiny shape on any
device (a few seconds each): the test set runs that on CPU to check this script.

Usage: make gpu-check                    (python benchmarks/gpu_check.py)
       python benchmarks/gpu_check.py --tiny
Deliberately ignored: multi-GPU engines and DeepSpeed (`pytest -m gpu` covers what runs on one).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import RESULTS_ENV, Table, announce, save, show  # noqa: E402
from brorl.system.devices import memory_floor_s, peak  # noqa: E402

SHAPE = ["--params", "params/shape_qwen2.5-1.5b.yaml", "--vocab-size", "151936"]
"""Qwen2.5-1.5B's shape with its vocabulary, random weights."""
FULL = {"n": [16, 512], "total": 512, "tokens": 128, "prompt_tokens": 32, "rows": 512,
        "warm_steps": 1, "limits": {"tests": 150, "rollouts": 150, "decode": 60, "step": 120}}
TINY = {"n": [16], "total": 32, "tokens": 8, "prompt_tokens": 16, "rows": 32, "warm_steps": 0,
        "limits": {"tests": 0, "rollouts": 240, "decode": 120, "step": 300}}
"""The sizes of a full check and of `--tiny` (limits in seconds per part; 0: not run)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--tiny", action="store_true",
                    help="every part but the tests at the tiny shape, on any device")
    ap.add_argument("--memory-tbs", type=float, default=None,
                    help="the device's memory bandwidth, TB/s (default: brorl.system.devices' table)")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary rows here")
    return ap.parse_args(argv)


def run_part(name: str, cmd: list[str], limit: int) -> tuple[str, str]:
    """Run `cmd` from the repository root within `limit` seconds: (status, output tail)."""
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return f"out of time ({limit} s)", ""
    seconds = time.monotonic() - started
    tail = (done.stdout + done.stderr)[-2000:]
    if done.returncode:
        print(f"{name} failed (exit {done.returncode}):\n{tail}", file=sys.stderr)
        return f"failed (exit {done.returncode}, {seconds:.0f} s)", tail
    return f"ok ({seconds:.0f} s)", tail


def gpu_test_files() -> list[str]:
    """The test files with `gpu` cases (they use `tests.devices` or the marker), so that files
    needing the orchestration libraries are not collected on a box without them."""
    return [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").glob("test_*.py"))
            if "tests.devices import" in (text := p.read_text()) or "mark.gpu" in text]


def tests_part(limit: int) -> list[list]:
    """`pytest -m gpu` over the files that have `gpu` cases: its summary line."""
    status, tail = run_part("pytest -m gpu", [sys.executable, "-m", "pytest", "-m", "gpu", "-q",
                                              "-p", "no:cacheprovider", *gpu_test_files()],
                            limit)
    summary = next((line for line in reversed(tail.splitlines()) if " in " in line), "")
    return [["tests", "pytest -m gpu", summary.strip("= ") or "-", status]]


def rollouts_part(size: dict, shape: list[str], folder: Path, limit: int) -> list[list]:
    """hf against plain (and vllm) at equal rows per call: rollouts/s and the ratio per N."""
    out = folder / "rollouts.json"
    engines = "hf,plain" + (",vllm" if shape and importlib.util.find_spec("vllm") else "")
    cmd = [sys.executable, "benchmarks/rollout_throughput.py", *shape, "--engines", engines,
           "--prompts", str(size["prompt_tokens"]), "--n-values",
           ",".join(map(str, size["n"])), "--total-rollouts", str(size["total"]),
           "--max-response-tokens", str(size["tokens"]), "--max-concurrent-rollouts",
           str(size["rows"]), "--repeats", "1", "--json", str(out)]
    status, _ = run_part("rollouts", cmd, limit)
    if not out.is_file():
        return [["rollouts", f"N={n}", "-", status] for n in size["n"]]
    cells = {(c["engine"], c["n"]): c for c in json.loads(out.read_text())}
    rows = []
    for n in size["n"]:
        hf, plain = cells[("hf", n)], cells[("plain", n)]
        figure = (f"hf {hf['rollouts_per_s']:.1f} / plain {plain['rollouts_per_s']:.1f} "
                  f"rollouts/s = {hf['rollouts_per_s'] / plain['rollouts_per_s']:.2f}x at "
                  f"{hf['rows_per_call']} / {plain['rows_per_call']} rows per call")
        if ("vllm", n) in cells:
            figure += f"; vllm {cells[('vllm', n)]['rollouts_per_s']:.1f}"
        rows.append(["rollouts", f"N={n}, bar: hf >= 1.5x plain", figure, status])
    return rows


def decode_part(size: dict, shape: list[str], memory_tbs: float | None,
                limit: int) -> list[list]:
    """The hf engine's decode milliseconds per step of `rows` rows against the memory floor."""
    cmd = [sys.executable, __file__, "--decode-child", json.dumps(
        {"size": size, "shape": shape, "memory_tbs": memory_tbs})]
    status, tail = run_part("decode step", cmd, limit)
    lines = [line for line in tail.splitlines() if line.startswith("{")]
    if not status.startswith("ok") or not lines:
        return [["decode step", f"{size['rows']} rows", "-", status]]
    r = json.loads(lines[-1])
    figure = f"{r['step_ms']:.2f} ms per step"
    if r["floor_ms"] is not None:
        figure += (f"; floor {r['floor_ms']:.2f} ms ({r['gb_read']:.2f} GB at "
                   f"{r['memory_tbs']} TB/s) = {r['step_ms'] / r['floor_ms']:.1f}x the floor")
    else:
        figure += f"; {r['gb_read']:.3g} GB read per step, bandwidth unknown (--memory-tbs)"
    return [["decode step", f"{size['rows']} rows, bar: within 4x of the floor", figure, status]]


def decode_child(spec: dict) -> dict:
    """In a fresh process: time the hf engine's calls of 1 and of `tokens` new tokens on one
    prompt x `rows` rows (median of 3 each, after a warm-up call that compiles the step)."""
    from benchmarks.rollout_throughput import build_model, make_engine, make_prompts, parse_args
    from brorl.engines.base import SamplingConfig

    size = spec["size"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = parse_args([*spec["shape"], "--max-concurrent-rollouts", str(size["rows"])])
    args.dtype = "bfloat16" if device == "cuda" else "float32"
    prompt = make_prompts(1, size["prompt_tokens"], 0)
    max_len = size["prompt_tokens"] + size["tokens"] + 16
    model, tokenizer = build_model(args, device, max_len)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine("hf", model, tokenizer, args, Path(tmp) / "policy", max_len)

        def seconds(tokens: int) -> float:
            sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_response_tokens=tokens,
                                      seed=0)
            times = []
            for _ in range(3):
                if device == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                engine.generate(prompt, size["rows"], sampling)
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - started)
            return statistics.median(times)

        seconds(size["tokens"])  # warm-up: compiles and allocates
        step_s = (seconds(size["tokens"]) - seconds(1)) / (size["tokens"] - 1)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = (2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
                    * next(model.parameters()).element_size())
    positions = size["prompt_tokens"] + size["rows"] * (size["tokens"] - 1) / 2
    bytes_read = weights + per_position * positions
    name = torch.cuda.get_device_name(0) if device == "cuda" else ""
    memory_tbs = spec["memory_tbs"] or (peak(name).memory_tbs if peak(name) else None)
    floor = memory_floor_s(bytes_read, memory_tbs) * 1e3 if memory_tbs else None
    return {"step_ms": step_s * 1e3, "floor_ms": floor, "gb_read": bytes_read / 1e9,
            "memory_tbs": memory_tbs}


def step_part(size: dict, shape: list[str], folder: Path, limit: int) -> list[list]:
    """One whole RL step per N: seconds and its stage split."""
    out = folder / "step.json"
    cmd = [sys.executable, "benchmarks/step_memory.py", *shape, "--n",
           ",".join(map(str, size["n"])), "--total-rollouts", str(size["total"]),
           "--max-response-tokens", str(size["tokens"]), "--micro-batch-rollouts", "16",
           "--max-concurrent-rollouts", str(size["rows"]), "--warm-steps", str(size["warm_steps"]),
           "--json", str(out)]
    if torch.cuda.is_available():
        cmd += ["--dtype", "bfloat16"]
    status, _ = run_part("RL step", cmd, limit)
    if not out.is_file():
        return [["RL step", f"N={n}", "-", status] for n in size["n"]]
    rows = []
    for r in json.loads(out.read_text()):
        split = ", ".join(f"{k} {v:.1f}" for k, v in r["stage_seconds"].items())
        busy = f"; update {r['tokens_per_s']:.0f} tokens/s, padding {r['padding_share']:.2f}"
        busy += "" if r["mfu"] is None else f", MFU {r['mfu']:.3f}"
        rows.append(["RL step", f"N={r['n']}, B={r['prompts']}",
                     f"{r['seconds']:.1f} s ({split}){busy}", status])
    return rows


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--decode-child"]:
        print(json.dumps(decode_child(json.loads(sys.argv[2]))), flush=True)
        return 0
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); install "
              "torch's CUDA build (docs/gpu.md), or run `python benchmarks/gpu_check.py --tiny` "
              "to check the script on this device", file=sys.stderr)
        return 2
    size, shape = (TINY, []) if args.tiny else (FULL, SHAPE)
    limits = size["limits"]
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    announce(f"gpu-check device={device} tiny={args.tiny}")
    rows: list[list] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        if args.tiny:  # a self-check: its figures replace no machine's recorded ones
            os.environ[RESULTS_ENV] = str(Path(tmp) / "results")
        if limits["tests"]:
            rows += tests_part(limits["tests"])
        rows += rollouts_part(size, shape, Path(tmp), limits["rollouts"])
        rows += decode_part(size, shape, args.memory_tbs, limits["decode"])
        rows += step_part(size, shape, Path(tmp), limits["step"])
        table = Table(f"GPU check on {device}" + (" (tiny shape)" if args.tiny else ""),
                      ["part", "case", "figure", "status"], rows,
                      [f"rollouts: {size['prompt_tokens']}-token prompts, {size['tokens']} new "
                       f"tokens, {size['total']} rollouts per N; the step: "
                       "benchmarks/step_memory.py at the same shape"])
        show([table])
        save("gpu_check", [table])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any(not str(r[3]).startswith("ok") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
