"""openvino-genai's continuous-batching pipeline as an engine: `pipeline` (its step process), `config` (a request in
its terms)."""
