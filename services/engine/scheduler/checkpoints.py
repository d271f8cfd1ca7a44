"""Which exact endpoints of a prompt to checkpoint (a chunk that runs past one captures it;
with `checkpoint_stops` prefill stops at each one).

The prompt end is always chosen (a full hit resumes sampling without replaying the prompt), then
the last message boundary (the next turn of the conversation shares everything before it),
then the first one (a shared system prompt or preamble). Further earlier boundaries compete for
an extra-work allowance: `extra_fraction` of the uncached prefill work, each capture charged
`capture_cost_tokens` (the snapshot copy, plus the chunk split with `checkpoint_stops`). Only endpoints beyond the reused
prefix are eligible; the caller drops the least important ones when snapshot rows run out.
"""

from __future__ import annotations

from collections.abc import Sequence


def select_checkpoint_ends(*, prompt_len: int, message_ends: Sequence[int], reused: int,
                           extra_fraction: float = 0.05,
                           capture_cost_tokens: int = 64) -> list[int]:
    """Endpoints in priority order (most important first); all in (reused, prompt_len]."""
    if prompt_len <= reused:
        return []
    boundaries = sorted({e for e in message_ends if reused < e < prompt_len})
    chosen = [prompt_len]
    if boundaries:
        chosen.append(boundaries[-1])
        if len(boundaries) > 1:
            chosen.append(boundaries[0])
        extras = boundaries[1:-1]
        allowance = int(extra_fraction * (prompt_len - reused) / max(1, capture_cost_tokens))
        chosen.extend(extras[:allowance])
    return chosen
