"""The REST API: OpenAI-compatible completions on the shared generation path (see views.py)."""
