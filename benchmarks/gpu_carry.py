"""Prepare what an offline GPU host lacks for `gpu_real_model.py`, in the git-ignored folder .gpu-carry/:
the wheels of orjson and xxhash, for the image model Pillow and pybase64, py-spy (the served steps are
profiled with it), for that host's Python, and the
packaged MiniLM converted to fp16 (45 MB; the fp32 file is 87 MB, too much to carry). Then, on the GPU
host, from the repository root:

    python3 -m pip install --no-index --target /tmp/carry-site .gpu-carry/*.whl
    export PYTHONPATH=/tmp/carry-site     # a plain `pip install` there went to another interpreter
    python3 benchmarks/gpu_real_model.py --minilm-dir .gpu-carry/minilm-fp16 --out-dir "$OUT"

Usage here: .venv/bin/python benchmarks/gpu_carry.py [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU host's Python (default 3.12)")
    args = parser.parse_args()
    carry = REPO / ".gpu-carry"
    carry.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", args.python_version, "--implementation", "cp",
                    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux_2_5_x86_64", "-d", str(carry),
                    "orjson", "xxhash", "pillow", "pybase64", "py-spy"],
                   check=True)
    import torch
    from transformers import AutoModel, AutoTokenizer

    from inferd.backends.transformer import default_model_path

    source, target = default_model_path(), carry / "minilm-fp16"
    AutoModel.from_pretrained(source, dtype=torch.float16).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    size = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file())
    print(f"{carry}: {size / 2**20:.1f} MiB (carry it with the device tool's `carry`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
