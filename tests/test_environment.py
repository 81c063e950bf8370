"""The environment defaults (`brorl/system/environment.py`): one home, applied by entry points, never by
an import."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from brorl.system.environment import FLOAT_PATHS, X86, apply_defaults, defaults, with_defaults

ROOT = Path(__file__).resolve().parents[1]


def test_set_variables_win_and_prefect_paths_follow_prefect_home(tmp_path):
    env = {"HF_HUB_OFFLINE": "0", "PREFECT_HOME": str(tmp_path / "home")}
    apply_defaults(env)
    assert env["HF_HUB_OFFLINE"] == "0" and env["DVC_NO_ANALYTICS"] == "1"
    assert env["PREFECT_SERVER_MEMO_STORE_PATH"] == str(tmp_path / "home" / "memo_store.toml")
    assert defaults({})["PREFECT_HOME"] == str(ROOT / ".cache" / "prefect")
    assert with_defaults({"DO_NOT_TRACK": "false"})["DO_NOT_TRACK"] == "false"
    assert not (tmp_path / "home").exists()  # nothing created


def test_importing_the_flows_changes_no_variable_and_creates_no_folder(tmp_path):
    home = tmp_path / "prefect-home"
    code = ("import json, os\nbefore = dict(os.environ)\n"
            "import flows, commands.entry, commands.cli, commands.server, "
            "commands.deploy, brorl.train\n"
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    env = {k: v for k, v in os.environ.items() if k not in defaults({})} | {
        "PREFECT_HOME": str(home)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == {}
    assert not home.exists()


def test_a_flow_entry_applies_the_defaults_before_its_checks(tmp_path):
    """`brorl data` in an empty environment: the project's offline defaults reach the process
    (an error keeps it short: the params file is missing)."""
    code = ("import os, runpy, sys\nsys.argv = ['brorl', 'data', '--params', 'nope.yaml']\n"
            "try:\n    runpy.run_module('commands.cli', run_name='__main__')\n"
            "except SystemExit:\n    print(os.environ.get('HF_HUB_OFFLINE'), "
            "os.environ.get('PREFECT_HOME'))")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.split() == ["1", str(ROOT / ".cache" / "prefect")], out.stderr[-2000:]


TRAIN_A_FEW_STEPS = """
from brorl.system.environment import apply_defaults
apply_defaults()  # before torch loads, as every entry point
import hashlib, torch
from brorl.policy import build_policy, build_tokenizer
tok = build_tokenizer()
model = build_policy(vocab_size=len(tok), hidden_size=96, num_layers=2, num_heads=3,
                     num_kv_heads=1, intermediate_size=288, max_position_embeddings=512, seed=0)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(1)
for _ in range(8):
    ids = torch.randint(0, len(tok), (32, 60), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad(); loss.backward(); opt.step()
digest = hashlib.sha256()
for p in model.parameters():
    digest.update(p.detach().numpy().tobytes())
print(torch.get_num_threads(), digest.hexdigest())
"""


@pytest.mark.skipif(platform.machine() not in X86, reason="the pinned kernel paths are x86's")
def test_the_pinned_kernel_paths_give_the_same_weights_at_any_thread_count():
    """MKL's and torch's default paths round a product differently with 1 and 2 threads (and
    by the CPU's instruction set); the defaults pin both (`FLOAT_PATHS`)."""
    assert FLOAT_PATHS.items() <= defaults({}).items()
    env = {k: v for k, v in os.environ.items() if k not in FLOAT_PATHS} | {
        "PYTHONPATH": str(ROOT)}
    out = {}
    for threads in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", TRAIN_A_FEW_STEPS], cwd=ROOT,
                              env=env | {"OMP_NUM_THREADS": threads}, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        out[threads] = done.stdout.split()
    assert [out[t][0] for t in ("1", "2")] == ["1", "2"]
    assert out["1"][1] == out["2"][1]
