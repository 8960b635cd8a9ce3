"""Speculative engines, with no Django, Redis or Celery in them: used by the Celery worker process
(inference.serving.worker) and in-process by the benchmark. Engines are the lower layer: nothing here imports
inference.serving (the worker's figures of its host and live rates, and its registry of engines, live there).

At the top, what every engine shares, and what the web side may import too (plain values, no openvino): `spec` (a
pair's PairSpec), `decoding` (a request's settings), `interface` (the `Engine` protocol, ActiveRequest and its
events), `text_assembler`, `speculation_stats`, `devices` (openvino loads when it is asked); and, for the engines,
`tokenizer` (the OpenVINO tokenizer) and `pages` (memory given back).

- `library/`: openvino-genai's continuous-batching pipeline in a step process (`pipeline`), a request in its terms
  (`config`).
- `own/`: the own engine (`engine`), exact speculative sampling on the OpenVINO runtime (the library's is not exact),
  by the rule in `acceptance`, on the caches `kv_cache` states (and `batch`, its main alone batched; `prefix_cache`,
  blocks kept across answers); `own/proposers/` says who proposes a step's tokens, behind one contract
  (`proposers/interface.py`), chained (`proposers/chain.py`): the prompt lookup (`prompt_lookup`) first, the draft
  (`draft_model`) where it has nothing.
- `grammar/`: a grammar as a value (`grammar`, the web side's too), its compilers and the web's checker processes
  (`compilers`, `checks`), and the own engine's token masks (`constraint`)."""
