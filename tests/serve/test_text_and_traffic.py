"""The server's text and the client's traffic, without a server: the byte tokenizer, streamed
detokenization with stop strings (oracle: decoding the whole reply at once, and ``str.find``), and
the course's workloads turned into requests (the multi-turn links, the side-channel triples)."""

from __future__ import annotations

import pytest

from paged_edu.serve.tokenizer import ByteTokenizer, Detokenizer
from paged_edu.serve.traffic import build_traffic, map_token

TOK = ByteTokenizer()
TEXT = "Grüße, 世界! naïve café — ok"


def stream(text_ids, stop=(), step=1):
    d = Detokenizer(TOK, [1, 2, 3], stop)
    pieces = [d.add(text_ids[i : i + step]) for i in range(0, len(text_ids), step)]
    pieces.append(d.add([], final=True))
    return "".join(pieces), d.stopped


def test_byte_tokenizer_round_trips_text_and_special_tokens():
    ids = TOK.encode("<|im_start|>user\n" + TEXT + "<|im_end|>")
    assert ids[0] == 257 and ids[-1] == 258 and all(t < 256 for t in ids[1:-1])
    assert TOK.decode(ids) == "user\n" + TEXT
    assert TOK.decode(ids, skip_special_tokens=False) == "<|im_start|>user\n" + TEXT + "<|im_end|>"


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_streamed_text_is_the_whole_decode_however_the_bytes_are_split(step):
    ids = TOK.encode(TEXT)
    text, stopped = stream(ids, step=step)
    assert text == TEXT and stopped is None


@pytest.mark.parametrize("stop", [("世界",), ("café", "Grüße"), ("naïve", "ï"), ("absent",), ("ok",)])
def test_the_text_ends_before_the_first_stop_string_to_complete(stop):
    """As vLLM checks them while tokens stream in: the first stop string whose last character arrives
    wins ("ï" before "naïve", though "naïve" starts first)."""
    text, stopped = stream(TOK.encode(TEXT), stop)
    found = [(TEXT.find(s) + len(s), TEXT.find(s), s) for s in stop if s in TEXT]
    if found:
        _, at, first = min(found)
        assert (text, stopped) == (TEXT[:at], first)
    else:
        assert (text, stopped) == (TEXT, None)


def test_a_possible_stop_string_is_held_back_until_it_cannot_be_one():
    d = Detokenizer(TOK, [], ("abc",))
    assert d.add(TOK.encode("xxab")) == "xx"  # "ab" could start "abc"
    assert d.add(TOK.encode("d")) == "abd"
    assert d.add(TOK.encode("ab")) == ""
    assert d.add([], final=True) == "ab"  # the end: nothing is a stop any more


def test_a_cut_character_at_the_end_is_flushed_as_a_replacement():
    ids = TOK.encode("é")[:1]
    assert stream(ids)[0] == "\ufffd"


def test_map_token_is_a_function_into_the_vocabulary():
    ids = list(range(1, 5000))
    mapped = [map_token(t, 259) for t in ids]
    assert all(0 <= t < 259 for t in mapped) and mapped == [map_token(t, 259) for t in ids]
    assert len(set(mapped)) > 250  # spread over the vocabulary


def test_multiturn_traffic_links_each_turn_to_the_one_it_continues():
    sends = build_traffic("multiturn", 12, float("inf"), 0, 259, scale=0.25)
    follow = [s for s in sends if s.after is not None]
    assert follow
    for s in follow:
        prev = sends[s.after]
        assert s.prompt[: s.carries] == prev.prompt + prev.workload_reply
        assert s.after < sends.index(s)


def test_probe_traffic_is_victim_probe_control_triples():
    sends = build_traffic("probe", 9, 2.0, 0, 1000, scale=0.1, tenants=2)
    assert [s.role for s in sends] == ["victim", "probe", "control"] * 3
    for v, p, c in zip(sends[::3], sends[1::3], sends[2::3]):
        n = len(v.prompt) - 8
        assert p.prompt[:n] == v.prompt[:n] and c.prompt[:n] != v.prompt[:n] and p.after == sends.index(v)
        assert (v.cache_salt, p.cache_salt, c.cache_salt) == ("tenant-0", "tenant-1", "tenant-1")


def test_lengths_scale_and_fit_the_model():
    full = build_traffic("sharegpt", 50, float("inf"), 0, 259)
    small = build_traffic("sharegpt", 50, float("inf"), 0, 259, scale=0.1, max_model_len=128)
    assert sum(len(s.prompt) for s in small) < sum(len(s.prompt) for s in full) / 5
    assert all(len(s.prompt) + s.max_tokens <= 128 for s in small)


@pytest.mark.parametrize("chat", [False, True])
def test_chunk_encoder_writes_the_bytes_of_the_chunk_dicts(chat):
    """The streamed chunks' fast JSON (fixed parts serialised once) against ``json.dumps`` of the dicts
    :func:`~paged_edu.serve.protocol.chunk` builds: the same bytes, and JSON that reads back to them."""
    import json

    from paged_edu.serve import protocol as P

    enc = P.ChunkEncoder(chat, 'cmpl-"x"', 1767000000, "Small\\LM é")
    cases = [
        [(0, TEXT, None, None, None)],
        [(0, 'a "quote"\n\ttab\\', None, [1, 2, 300], None)],
        [(3, "", "length", [], None), (12, "x", None, None, None)],
        [(0, "end", "stop", [5], "end"), (1, "", "stop", None, 258)],
    ]
    for choices in cases:
        fast = enc.event([enc.choice(i, text, fr, ids, sr) for i, text, fr, ids, sr in choices])
        dicts = [P.chunk_choice(chat, i, text, fr, ids, stop_reason=sr) for i, text, fr, ids, sr in choices]
        expected = P.chunk(chat, 'cmpl-"x"', 1767000000, "Small\\LM é", dicts)
        assert fast == "data: " + json.dumps(expected, separators=(",", ":")) + "\n\n"
        assert json.loads(fast.removeprefix("data: ")) == expected


BODIES = [
    b'{"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.5, "stream": true, "stream_options": {"include_usage": true}}',
    b'{"prompt": "hi", "max_tokens": 1, "max_tokens": 2, "stream": "true", "seed": 18446744073709551615}',
    b'{"prompt": "x", "temperature": NaN, "extra": 1e400, "user": "\\u00e9"}',
    b'{"prompt": "a\\ud800b"}',  # a lone surrogate: pydantic's parser refuses it, json's takes it
    b'{"prompt": [1, 2], "max_tokens": 2.0}',
    b'{"prompt": [1, 2], "tools": [{"type": "function"}], "echo": false}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}',
    b"[1, 2]",
    b'{"prompt": [1, 2',
]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("raw", BODIES)
def test_a_body_parsed_in_one_pass_is_the_one_json_then_pydantic_gives(raw, chat):
    """The server reads a body with pydantic's own JSON parser (app._read) and, if it refuses, again with
    ``json.loads`` then ``model_validate`` (app._parse) for the error: wherever the one pass accepts, the
    request is the one the two passes give."""
    from pydantic import ValidationError

    from paged_edu.serve import protocol as P
    from paged_edu.serve.app import _parse

    model = P.ChatCompletionRequest if chat else P.CompletionRequest
    try:
        plain = _parse(raw, model)
    except P.RequestError:
        plain = None
    try:
        fast = model.model_validate_json(raw)
    except ValidationError:
        return  # the server answers with the plain way's request or error
    assert plain is not None
    dump = dict(mode="python", round_trip=True)
    assert repr(fast.model_dump(**dump)) == repr(plain.model_dump(**dump))  # (repr: NaN == NaN)
    assert fast.model_fields_set == plain.model_fields_set and fast.model_extra == plain.model_extra
    assert P.unsupported_field(fast) is None or str(P.unsupported_field(fast)) == str(P.unsupported_field(plain))


def test_ids_the_decode_skips_never_enter_the_window():
    """A random-weight SmolLM2 through the byte tokenizer: nearly every id is past the bytes and decodes to
    nothing. The text is the bytes' text, and the decoded window stays a few tokens long however many such
    ids come (it used to grow with the reply: two decodes of all of it per token)."""
    tok = ByteTokenizer(49152)
    text = "Grüße, 世界"
    filler = [300 + 7 * k for k in range(50)]  # ids past the bytes and the named specials
    ids = [t for b in tok.encode(text) for t in (b, *filler)]
    d = Detokenizer(tok, filler + [1, 2], ())
    pieces, longest = [], 0
    for t in ids:
        pieces.append(d.add([t]))
        longest = max(longest, len(d.ids) - d.prefix_offset)
    pieces.append(d.add([], final=True))
    assert "".join(pieces) == text == tok.decode(ids)
    assert longest <= 8  # two characters of bytes at most: the one handed out last, the one coming


@pytest.mark.parametrize("step", [2, 5, 64])
def test_several_tokens_at_once_give_the_text_token_by_token_gives(step):
    """A route that fell behind takes several steps' tokens at once (one pair of decodes for them all)."""
    ids = TOK.encode(TEXT * 3)
    one_by_one, _ = stream(ids, ("ok",), step=1)
    assert stream(ids, ("ok",), step=step)[0] == one_by_one
