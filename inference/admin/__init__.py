"""The operator's admin, a module per thing it manages: the pairs (`pairs`, their bulk actions in `pair_actions`),
their benchmark runs (`benchmarks`), imports (`imports`), API keys (`api_keys`) and the generations' records
(`generations`). Django imports this package at start-up; importing each module registers its pages."""

from inference.admin import api_keys, benchmarks, generations, imports, pairs

__all__ = ["api_keys", "benchmarks", "generations", "imports", "pairs"]
