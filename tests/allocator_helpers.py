"""What tests do to a block allocator between scheduler steps, by the count-based protocol."""

from __future__ import annotations


def append_token(a, seq_id, token_id) -> int:
    """One decode step as the scheduler takes it: reserve the next slot by count, then -- its K/V
    written -- ``mark_computed`` every token with the new one's id. Returns the slot."""
    [slot] = a.append_slots(seq_id)
    a.mark_computed(seq_id, a.num_tokens(seq_id), [token_id])
    return slot


def assert_holds(a, seq_id, tokens) -> None:
    """The allocator's view of ``seq_id`` is ``tokens``: one slot each, every id known, and -- when it
    publishes blocks as their ids arrive -- a prompt of ``tokens`` plus one token hits every full
    block (the allocator keeps no copy of the ids to read back: its prefix index names them)."""
    tokens = list(tokens)
    assert a.num_tokens(seq_id) == len(tokens) == a.num_known_tokens(seq_id)
    if getattr(a, "enable_prefix_caching", False) and not a.cache_when_computed:
        B = a.block_size
        assert a.num_cached_tokens_for(tokens + [0]) == len(tokens) // B * B
