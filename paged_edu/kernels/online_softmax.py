"""The online softmax of the seed's section 3, one block at a time, and the merge of two partial states.

A *partial softmax state* over a set of tokens ``T`` is, per query head, the triple

    m = max_{t in T} S_t,     l = sum_{t in T} exp(S_t - m),     o = sum_{t in T} exp(S_t - m) V_t

(``m`` the running max, ``l`` the normaliser, ``o`` the unnormalised output accumulator), and the
attention output over ``T`` is ``o / l``. The empty state is ``(m, l, o) = (-inf, 0, 0)``.

* :func:`block_update` folds one block of scores ``S_b`` (with its mask ``M_b``) into a state --
  the seed's equations: ``m_new = max(m, max_j S_b,j)``, ``P_b = exp(S_b - m_new)``,
  ``l <- l exp(m - m_new) + sum_j P_b,j``, ``o <- o exp(m - m_new) + P_b V_b``.
* :func:`merge_states` combines the states of two disjoint token sets -- what split-KV
  (flash-decoding) does with the partial results of its splits:
  ``m = max(m1, m2)``, ``l = l1 exp(m1 - m) + l2 exp(m2 - m)``, ``o = o1 exp(m1 - m) + o2 exp(m2 - m)``.
  The Triton kernel stores each split as ``(o_j / l_j, lse_j = m_j + log l_j)``, the same thing in
  another coordinate system (:mod:`paged_edu.kernels.decode.pieces`).

Both work in float32 and keep the seed's notation; shapes per call: ``H`` query heads, ``B`` slots
of a block, ``D`` head_dim. Both are lesson 4's exercises (4.3 and 4.1); the lesson's stepper
(:class:`paged_edu.labs.softmax_stepper.OnlineSoftmaxStepper`) runs :func:`block_update` -- or a
learner's version of it.
"""

from __future__ import annotations

import torch

__all__ = ["empty_state", "block_update", "merge_states"]


def empty_state(num_heads: int, head_dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The state of no tokens: ``m = -inf`` (H,), ``l = 0`` (H,), ``o = 0`` (H, D), all float32."""
    m = torch.full((num_heads,), float("-inf"), device=device)
    l = torch.zeros(num_heads, device=device)
    o = torch.zeros(num_heads, head_dim, device=device)
    return m, l, o


def block_update(
    m: torch.Tensor,  # (H,) running max
    l: torch.Tensor,  # (H,) running normaliser
    o: torch.Tensor,  # (H, D) unnormalised output
    scores: torch.Tensor,  # (H, B) S_b = q K_B(b)^T * scale, every slot of the block (stale ones too)
    values: torch.Tensor,  # (H, B, D) V_B(b) as each query head sees it (GQA: a view, heads repeated)
    valid: torch.Tensor,  # (B,) bool: slot j holds a token of the sequence (False only in the last block)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block into the state ``(m, l, o)``; returns the new state."""
    S = scores.masked_fill(~valid, float("-inf"))  # M_b: -inf on the slots past the sequence's end
    m_new = torch.maximum(m, S.amax(dim=-1))  # (H,)
    P = torch.exp(S - m_new[:, None])  # (H, B), 0 on masked slots
    alpha = torch.exp(m - m_new)  # (H,) rescales what came before; exp(-inf) = 0 on the first block
    l_new = l * alpha + P.sum(dim=-1)
    o_new = o * alpha[:, None] + torch.einsum("hb,hbd->hd", P, values)
    return m_new, l_new, o_new


def merge_states(
    m1: torch.Tensor,
    l1: torch.Tensor,
    o1: torch.Tensor,  # (..., ), (..., ), (..., D): tokens T1
    m2: torch.Tensor,
    l2: torch.Tensor,
    o2: torch.Tensor,  # the same over a disjoint set T2
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The state over ``T1 + T2``: both rescaled to the common max, then added."""
    m = torch.maximum(m1, m2)
    # An empty side has m_i = -inf: exp(-inf - m) = 0. Both empty would give -inf - -inf = nan;
    # guard it so the merge of two empty states is the empty state.
    safe = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    a1, a2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, l1 * a1 + l2 * a2, o1 * a1[..., None] + o2 * a2[..., None]
