"""Constrained decoding for `otbuild serve`: a request's `structured_outputs: {regex: ...}`
(vLLM's request field; its older `guided_regex` was removed in vLLM 0.12) keeps every
generated token inside the language of that regular expression.

At each step the candidates are tried in order of their score; a token is allowed when the
text generated so far plus the token's text is still a prefix of some match (the `regex`
module's partial matching), and the end-of-turn token only once the text is a full match
(then nothing else is). The best `TOP_K` allowed tokens keep their scores, so sampling and
greedy decoding work as usual within the language. Made for the small answer frame of the
terminus-2 protocol (`otbuild.harness.protocol.ANSWER_REGEX`) and tiny students on a CPU.
"""

from __future__ import annotations

TOP_K = 16  # allowed candidates kept per step (sampling draws among them)


class RegexConstraint:
    """A transformers logits processor for one request (batch of one)."""

    def __init__(self, tokenizer, pattern: str, prompt_len: int, eos_ids, pieces: dict[int, str] | None = None):
        """`pieces`: a token -> text cache shared by the requests of one tokenizer."""
        import regex

        try:
            self.rx = regex.compile(pattern)
        except regex.error as e:
            raise ValueError(f"structured_outputs.regex is not a valid regular expression: {e}") from None
        self.tok, self.prompt_len, self.eos = tokenizer, prompt_len, set(eos_ids)
        self.pieces = {} if pieces is None else pieces

    def _piece(self, token: int) -> str:
        if token not in self.pieces:
            self.pieces[token] = self.tok.decode([token])
        return self.pieces[token]

    def _allowed(self, text: str, token: int, done: bool) -> bool:
        if token in self.eos or done:
            return token in self.eos and done
        piece = self._piece(token)
        return bool(piece) and self.rx.fullmatch(text + piece, partial=True) is not None

    def __call__(self, input_ids, scores):
        import torch

        text = self.tok.decode(input_ids[0, self.prompt_len :].tolist())
        done = self.rx.fullmatch(text) is not None
        keep = []
        for token in torch.argsort(scores[0], descending=True).tolist():
            if self._allowed(text, token, done):
                keep.append(token)
                if len(keep) == TOP_K or done:
                    break
        out = torch.full_like(scores, float("-inf"))
        if keep:  # nothing allowed (a token set that cannot continue): leave the step alone
            out[0, keep] = scores[0, keep]
            return out
        return scores
