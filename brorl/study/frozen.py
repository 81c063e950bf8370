"""The frozen start of a study: its warm-up, pool, hold-out split and start scores, made once.

Every run of a study continues one start (the warm-up's policy) on one pool, and is scored on one
hold-out split against one set of start scores. Redrawing any of them (a rerun after a code
change, an amendment) would change what every later result is measured against, so once made they
are frozen: `freeze` records a digest of each part (`PARTS`) and the commit whose code made it
in `study.frozen` (a JSON file committed in git, e.g. `study/frozen.json`). From then on the
stage of a part finds it unchanged and reuses it (`check`), or stops with the way to restore it:
it never draws it again. A study without `study.frozen`, or before its record exists, makes
every part as usual. To draw a new start on purpose, delete the record and say why in the plan.

The digest of a part is the MD5 of its files' relative paths and bytes, in path order (the
warm-up's policy folder, its validation curve and plateau record; the pool's data folder and
`pool.json`, which holds the hold-out's ids; `start.json`). Checkpoints, rollouts and run
summaries are not part of it: a part is what later stages read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.runs.files import atomic_write_text
from brorl.study.plan import pool_dir, warmup_dir

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

START_PATH = "start/start.json"


def parts(params: ExperimentParams) -> dict[str, list[str]]:
    """Part -> its paths, relative to the checkout."""
    study = params.study
    return {"warmup": [f"{warmup_dir(params)}/policy", f"{warmup_dir(params)}/evals.jsonl",
                       f"{warmup_dir(params)}/plateau.json"],
            "pool": [pool_dir(params)],
            "start": [f"{study.out_dir}/{START_PATH}"]}


PARTS = ("warmup", "pool", "start")


def digest(root: Path, paths: list[str]) -> str | None:
    """MD5 of the files under `paths` (relative names and bytes, in order); None when a path
    is missing."""
    md5 = hashlib.md5()
    for rel in paths:
        path = root / rel
        if not path.exists():
            return None
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            md5.update(str(file.relative_to(root)).encode() + b"\0")
            md5.update(file.read_bytes())
    return md5.hexdigest()


def read_record(params: ExperimentParams, root: Path) -> dict[str, Any] | None:
    """The study's frozen-start record, None without one."""
    if params.study.frozen is None or not (root / params.study.frozen).is_file():
        return None
    return json.loads((root / params.study.frozen).read_text())


def check(params: ExperimentParams, root: Path, part: str) -> bool:
    """True when `part` is frozen and here unchanged (reuse it); False when it is not frozen
    (make it); a ValueError saying how to restore it when frozen but missing or changed."""
    record = read_record(params, root)
    if record is None or part not in record["parts"]:
        return False
    frozen = record["parts"][part]
    found = digest(root, frozen["paths"])
    if found == frozen["digest"]:
        return True
    what = "is missing" if found is None else f"differs (digest {found}, frozen {frozen['digest']})"
    raise ValueError(
        f"the study's {part} is frozen ({params.study.frozen}, made at commit "
        f"{frozen['commit'][:12]}) but {', '.join(frozen['paths'])} {what}: restore it (dvc "
        f"checkout study/dvc.yaml, or dvc pull) and never redraw it; to draw a new start on "
        f"purpose, delete {params.study.frozen} and say why in docs/study.md.")


def freeze(params: ExperimentParams, root: Path, commit: str,
           only: list[str] | None = None) -> dict[str, Any]:
    """Record the digest of each part of `only` (default: every part not frozen yet) and the
    `commit` that made it in `study.frozen`, keeping the parts already recorded; a ValueError
    when a part is missing, named but frozen already, or the study names no record file."""
    if params.study.frozen is None:
        raise ValueError("study.frozen is null: name the record file (e.g. study/frozen.json).")
    record = read_record(params, root) or {"parts": {}}
    for part, paths in parts(params).items():
        if (only is None and part in record["parts"]) or (only is not None and part not in only):
            continue
        if part in record["parts"]:
            raise ValueError(f"the study's {part} is frozen already ({params.study.frozen}); "
                             "a frozen part is never recorded again.")
        found = digest(root, paths)
        if found is None:
            raise ValueError(f"cannot freeze the study's {part}: {paths} not all here; run its "
                             "stage first (make study-start).")
        record["parts"][part] = {"paths": paths, "digest": found, "commit": commit}
    atomic_write_text(root / params.study.frozen, json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    """`python -m brorl.study.frozen --params params/study.yaml --commit SHA [--parts ...]`:
    freeze the parts made by that commit's code (`make study-freeze`: every part not frozen
    yet, at the current commit)."""
    from brorl.params import load_params
    from brorl.system.checkout import find_root

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--commit", required=True, help="the commit whose code made the parts")
    parser.add_argument("--parts", nargs="+", choices=PARTS,
                        help="only these (default: every part not frozen yet)")
    args = parser.parse_args(argv)
    try:
        record = freeze(load_params(args.params, []), find_root(), args.commit, args.parts)
    except ValueError as err:
        sys.exit(f"error: {err}")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
