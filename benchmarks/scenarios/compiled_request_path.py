"""Whether compiling the request path's own modules, their source unchanged, makes a request cheaper:
instructions per request (`inprocess_request.py`'s drive under callgrind: the real server in-process,
100 connections, full batches) of this tree as it is, and of a copy whose request-path modules
(`MODULES`: the connection and fast path, admission, the model's take and delivery, the queue and
batcher, outcomes, the records) are compiled by Cython 3 as plain Python (`annotation_typing` off:
the annotations change nothing), alternated.

Why measure it: every request runs ~2,900 bytecodes of inferd's own on the event loop (issue 27), and
projects with the same shape compile their hot modules (aiohttp, yarl, multidict with Cython; Falcon
compiles its plain-Python source). On CPython 3.11 the interpreter specialises attribute loads and calls
in place, so compiling without types may gain little: this says how much.

    python compiled_request_path.py [--rounds N] [--repeats R] [--out-dir DIR]

Cython and setuptools go into benchmarks/.cython-site on first use (`pip install --target`; for this
benchmark only, not the project's). Writes compiled_request_path.json / .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, RESULTS
from inprocess_request import instructions_per_request

MODULES = (
    "http/connections", "http/fast_path", "http/inference", "http/batch_calls", "http/inference_body",
    "http/image_strings", "http/body_reader", "http/request_ids", "http/responses",
    "admission/admission", "admission/auth",
    "models/batch_model", "models/shared_work", "models/timeliness", "models/delivery", "models/registry",
    "models/versions",
    "scheduling/batcher", "scheduling/request_queue", "scheduling/tier_queue", "scheduling/arrivals",
    "scheduling/deadlines", "scheduling/batch_filling", "scheduling/batch_costs", "scheduling/policy",
    "observability/outcomes", "observability/histogram", "observability/access_log",
    "messages", "lifecycle",
)
CYTHON = "cython==3.3.1"
_BUILD = """
import sys
from Cython.Build import cythonize
from setuptools import setup
setup(ext_modules=cythonize(sys.argv[1:], language_level=3, quiet=True,
                            compiler_directives={"annotation_typing": False, "binding": True}),
      script_args=["build_ext", "--inplace", "--quiet"])
"""


def cython_site() -> Path:
    """Where Cython is importable from, installed on first use."""
    site = REPO / "benchmarks" / ".cython-site"
    if not (site / "Cython").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), CYTHON, "setuptools"],
                       check=True, stderr=subprocess.DEVNULL)  # (pip's resolver lists the venv's unrelated conflicts)
    return site


def compiled_copy(into: Path) -> Path:
    """A copy of the tree's `inferd` and `tests` with `MODULES` compiled in place; checked to import
    compiled."""
    tree = into / "compiled"
    for part in ("inferd", "tests"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    sources = [f"inferd/{module}.py" for module in MODULES]
    env = {**os.environ, "PYTHONPATH": str(cython_site())}
    built = subprocess.run([sys.executable, "-c", _BUILD, *sources], cwd=tree, env=env, capture_output=True, text=True)
    if built.returncode:  # (the C compiler's warnings are shown only when the build fails)
        raise RuntimeError(f"the Cython build failed:\n{built.stderr[-4000:]}")
    names = [f"inferd.{module.replace('/', '.')}" for module in MODULES]
    check = f"import importlib; print(all(importlib.import_module(n).__file__.endswith('.so') for n in {names!r}))"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                            capture_output=True, text=True, check=True).stdout.strip()
    if loaded != "True":
        raise RuntimeError("the compiled modules did not load in place of their source")
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds of 100 requests counted (default 40)")
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two trees (default 2)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"source": REPO, "compiled with Cython": compiled_copy(Path(tmp))}
        runs: dict[str, list[int]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                runs[name].append(round(instructions_per_request(args.rounds, True, tree)))
                print(name, runs[name][-1], flush=True)
    median = {name: statistics.median(xs) for name, xs in runs.items()}
    ratio = median["compiled with Cython"] / median["source"]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "compiled_request_path.json").write_text(json.dumps(
        {"rounds": args.rounds, "cython": CYTHON, "modules": MODULES, "python": sys.version.split()[0], "runs": runs,
         "median": median, "compiled_over_source": round(ratio, 4), "note": __doc__}, indent=1) + "\n")
    lines = [f"### Instructions per request in-process, source vs {len(MODULES)} request-path modules compiled "
             f"({CYTHON}, Python {sys.version.split()[0]}; callgrind, {args.rounds} rounds of 100, {args.repeats} "
             "alternated runs)", "", "| tree | runs | median |", "|---|---|---|"]
    lines += [f"| {name} | {' / '.join(f'{v:,}' for v in xs)} | {median[name]:,.0f} |" for name, xs in runs.items()]
    lines += ["", f"compiled ÷ source: {ratio:.3f}"]
    (args.out_dir / "compiled_request_path.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
