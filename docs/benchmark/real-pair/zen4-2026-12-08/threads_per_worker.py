"""Workers sharing a 2-vCPU host: one process of the library's main alone (bf16) with INFERENCE_NUM_THREADS as given
(0: OpenVINO's default, every core), a ~600-token prompt from engines/own/scheduler.py then 48 tokens, ROUNDS times;
prints (time to the first token, tokens/s after it) a round. Two at once, started together by the file GO:

    P=.venv/bin/python; S=docs/benchmark/real-pair/zen4-2026-12-08/threads_per_worker.py
    M=inference/models/qwen2.5-coder-1.5b/main
    rm -f go; ($P $S $M 2 600 3 go & $P $S $M 2 600 3 go & sleep 25; touch go; wait)   # then 1 thread each
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import openvino_genai as ov_genai


def main() -> None:
    main_dir, threads, prompt_tokens, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    props: dict[str, object] = {"INFERENCE_PRECISION_HINT": "bf16"}
    if threads:
        props["INFERENCE_NUM_THREADS"] = threads
    pipe = ov_genai.LLMPipeline(main_dir, "CPU", **props)
    tokenizer = pipe.get_tokenizer()
    ids = tokenizer.encode(Path("inference/engines/own/scheduler.py").read_text()).input_ids.data[0][:prompt_tokens]
    prompt = tokenizer.decode(list(ids))
    config = ov_genai.GenerationConfig(max_new_tokens=48, min_new_tokens=48)
    pipe.generate("hello", max_new_tokens=4)
    go = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    while go is not None and not go.exists():
        time.sleep(0.05)
    runs = []
    for index in range(rounds):
        stamps: list[float] = []
        began = time.perf_counter()
        pipe.generate(f"{prompt} {index}", config, streamer=lambda _, stamps=stamps: stamps.append(time.perf_counter())
                      and False)
        runs.append((round(stamps[0] - began, 3), round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 2)))
    print(json.dumps({"pid": os.getpid(), "threads": threads, "prompt": prompt_tokens, "runs": runs}), flush=True)


if __name__ == "__main__":
    main()
