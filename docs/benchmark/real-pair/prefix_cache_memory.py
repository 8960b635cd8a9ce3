"""What the own engine's prefix caches add to a worker's memory: PSS of this process (the engine runs in it, as in a
worker) after loading the real pair's own engine, then with its caches filled to SPECCHAT_PREFIX_CACHE_MB by distinct
long prompts, then after more prompts than fit (the bound holds: the least recently used blocks go).

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/prefix_cache_memory.py
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

import numpy as np  # noqa: E402

from inference.benchmark.memory import pss_bytes  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.engines.own.kv_cache import KvSequence  # noqa: E402
from inference.engines.own.prefix_cache import kv_bytes_per_token  # noqa: E402
from inference.engines.pages import release_freed_heap  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

MB = 2**20


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    engine = OwnEngine(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE))
    release_freed_heap()
    loaded = pss_bytes(os.getpid())
    caches = (engine.main_prompts, engine.draft_prompts)
    per_token = kv_bytes_per_token(engine.main) + kv_bytes_per_token(engine.draft)
    capacity = sum(cache.capacity_bytes for cache in caches)
    print(f"host: {this_host().described}; keys and values {per_token / 1024:.1f} KB a token (main and draft); "
          f"bound {capacity / MB:.0f} MB = {capacity // per_token:,} tokens")
    print(f"the engine loaded: PSS {loaded / MB:,.0f} MB")
    rng = np.random.default_rng(0)
    for label, prompts in (("filled", int(1.05 * capacity // per_token) // 1000 + 1), ("past the bound", 4)):
        for _ in range(prompts):
            ids = rng.integers(100, 30000, 1000).tolist()
            for compiled, cache in ((engine.main, engine.main_prompts), (engine.draft, engine.draft_prompts)):
                sequence = KvSequence(compiled, prompts=cache)
                sequence.prefill(ids)
                sequence.close()
        release_freed_heap()
        held = sum(cache.stats.bytes for cache in caches)
        print(f"{label}: the caches hold {held / MB:,.0f} MB ({sum(c.stats.blocks for c in caches)} blocks, "
              f"{sum(c.stats.evicted_blocks for c in caches)} evicted); PSS {pss_bytes(os.getpid()) / MB:,.0f} MB "
              f"(+{(pss_bytes(os.getpid()) - loaded) / MB:,.0f} MB)", flush=True)


if __name__ == "__main__":
    main()
