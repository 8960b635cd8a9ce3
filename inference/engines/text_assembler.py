"""Text from a request's tokens, step by step, without cutting a UTF-8 character."""

from __future__ import annotations


class TextAssembler:
    """Turns the token runs of successive steps into text pieces without cutting a UTF-8 character.

    Each step gives (draft text, main text): the text of the accepted draft tokens, and of the
    main model's own token that ends the step.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def _stable(self, n: int) -> str:
        decoded = self.tokenizer.decode(self.ids[:n])
        return decoded.rstrip("\ufffd")  # an incomplete character waits for the next tokens

    def _take(self, n: int) -> str:
        stable = self._stable(n)
        if len(stable) <= len(self.text) or not stable.startswith(self.text):
            return ""
        piece, self.text = stable[len(self.text):], stable
        return piece

    def add(self, token_ids: list[int]) -> tuple[str, str]:
        split = len(self.ids) + len(token_ids) - 1
        self.ids.extend(token_ids)
        draft = self._take(split) if len(token_ids) > 1 else ""
        return draft, self._take(len(self.ids))

    def finish(self) -> str:
        """Whatever was held back (a character cut by the end of generation)."""
        decoded = self.tokenizer.decode(self.ids)
        piece = decoded[len(self.text):] if decoded.startswith(self.text) else ""
        self.text += piece
        return piece
