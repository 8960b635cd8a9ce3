"""Speculative engines, with no Django, Redis or Celery in them: used by the Celery worker process
(inference.serving.worker) and in-process by the benchmark. `base` holds what they share, the `Engine`
protocol among it; `library` drives openvino-genai's continuous-batching pipeline in a step process;
`exact` is our exact speculative sampler on the OpenVINO runtime (the library's is not exact);
`registry` keeps one engine per pair spec; `rates` keeps the live tokens/s the worker plans K from."""
