"""A backend whose 'model' is a Python function of the request: scripted agents.

Used for the embedded model's teacher transcripts, for tests of topologies and credit that
need exact control of what each agent says, and for benchmarks with known ground truth.
The text is tokenised with the policy's tokenizer and ends with its EOS token, so turns
look exactly like sampled ones (logprobs are 0: a script is deterministic).  A request whose
reply has a forced start (``GenRequest.prefix``) gets the script's text after it; a script whose
text does not begin with it is an error, not a reply that would contradict its prompt.
"""

from __future__ import annotations

from typing import Any, Callable

from mas.rollout.backends.base import GenRequest, GenResult


class ScriptedBackend:
    def __init__(self, respond: Callable[[GenRequest], str], tokenizers: dict[str, Any]):
        self.respond = respond
        self.tokenizers = tokenizers  # policy name -> tokenizer
        self.calls = 0
        self.requests = 0

    def generate_batch(self, requests: list[GenRequest], seed: int | None = None) -> list[GenResult]:
        """Each request's scripted reply (``seed`` is unused: a script is deterministic)."""
        self.calls += 1
        self.requests += len(requests)
        out = []
        for req in requests:
            text = self.respond(req)
            if req.prefix:  # the reply's start was forced: the script wrote it, the result is what follows
                if not text.startswith(req.prefix):
                    raise ValueError(f"the script's reply for agent {req.agent!r} does not start with the start "
                                     f"the request forced ({req.prefix!r}: its tool_choice or response_format): {text[:80]!r}")
                text = text[len(req.prefix):]
            tok = self.tokenizers[req.policy]
            ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            out.append(GenResult(completion_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop"))
        return out

    def sync_weights(self, policy: str) -> None:
        """Nothing to sync: a script has no weights."""
