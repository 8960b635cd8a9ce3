"""Another OpenAI-compatible server asked beside SpecChat (`manage.py benchmark --compare-url`): the same
prompts and settings, at one stream and in the same bursts, so that a user sees what the pair buys against
what they would run instead."""

from __future__ import annotations

from dataclasses import dataclass

from inference.benchmark.inprocess import PEER, Sample, Variant
from inference.benchmark.prompts import Prompt
from inference.benchmark.servers import Credentials
from inference.benchmark.stack import StreamFn, sse_client


@dataclass(frozen=True)
class PeerServer:
    """Another OpenAI-compatible server users run instead (llama.cpp's llama-server on the same GGUF files,
    vLLM, OpenVINO Model Server): asked the same prompts with the same settings, under its own model name.
    It must honour `ignore_eos` and report usage in its stream (`stream_options.include_usage`), as
    llama-server does, so that both sides count the same tokens. Its prompt cache is asked off
    (`cache_prompt: false`, which servers without one ignore): the benchmark's workers keep none, and the
    repeats ask the same prompts, so a cache would time the peer's first tokens without their prefill."""

    base_url: str
    model: str
    api_key: str = ""

    def client(self) -> StreamFn:
        return sse_client(base_url=self.base_url, pair=self.model,
                          credentials=Credentials(user_id=0, session_cookie="", api_key=self.api_key or "none"),
                          extra_body={"cache_prompt": False})


def beside_peer(stream: StreamFn, peer: PeerServer) -> StreamFn:
    """`stream`, except that the PEER line's requests go to the peer: one sweep interleaves both, so the
    host's drift falls on both alike."""
    to_peer = peer.client()

    async def either(*, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        chosen = to_peer if variant == PEER else stream
        return await chosen(prompt=prompt, variant=variant, max_new_tokens=max_new_tokens)

    return either
