"""Every model call of a shard, as it went over the wire (issue 48, part 1).

A shard's trials reach their model through a recording OpenAI-compatible proxy on loopback
(`proxy.CaptureProxy`), started and stopped with the shard: otbuild's harness (its engine sends
each trial's scope in a header) and Harbor's agents (their base URL names the scope). Per call
it keeps the request, the response (a streamed one passed through chunk by chunk and assembled
for the record) and, where the server gives them, the prompt's and the answer's token ids and
the sampled log-probs (`record`). The shard writes them to calls.parquet beside traces.parquet,
keyed by (trial, call_idx) (otbuild/stagekit/calls.py).
"""

from contextvars import ContextVar

# the scope of the model calls made in this context (a trial of otbuild's harness): otbuild's
# engine sends it to the proxy in this header (otbuild/engines/openai.py)
SCOPE_HEADER = "X-Otbuild-Scope"
NO_ANSWER_HEADER = "X-Otbuild-No-Answer"  # on the proxy's 502: the server did not answer, and why
call_scope: ContextVar[str | None] = ContextVar("otbuild_call_scope", default=None)
