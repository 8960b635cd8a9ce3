"""Speculative engines, with no Django, Redis or Celery in them: used by the Celery worker process
(inference.serving.worker) and in-process by the benchmark.

What the web side may import too (plain values, no openvino): `spec` (a pair's PairSpec), `decoding` (a
request's settings), `grammar` (a grammar as a value), `interface` (the `Engine` protocol, ActiveRequest and
its events), `text_assembler`, `speculation_stats`, `devices` (openvino loads when it is asked). The engines
themselves: `library` drives openvino-genai's
continuous-batching pipeline in a step process (`library_config` says a request in its terms); `exact` is the
own engine, exact speculative sampling on the OpenVINO runtime (the library's is not exact), by the rule in
`acceptance`, its proposals from `drafting` (the prompt lookup of `ngram` first, the draft where it has nothing),
on the caches `kv_cache` states (and `batch`, its main alone batched); `registry` keeps
one engine per pair spec; `rates` keeps the live tokens/s the worker plans K from; `tokenizer` loads the
OpenVINO tokenizer."""
