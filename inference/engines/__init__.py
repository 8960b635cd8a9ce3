"""Speculative engines, with no Django, Redis or Celery in them: used by the Celery worker process
(inference.serving.worker) and in-process by the benchmark. `base` holds what they share; `library`
drives openvino-genai's continuous-batching pipeline; `registry` keeps one engine per pair spec."""
