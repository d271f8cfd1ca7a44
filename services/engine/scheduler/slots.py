"""SlotTable: physical request slots with per-slot generations and retirement fences.

A slot holds one live sequence. Each assignment bumps the slot's generation (1, 2, ...), so a
`SlotHandle(slot, generation)` names exactly one residency, and a completion for an earlier
generation of a reused slot can never be mistaken for the current one. A released slot stays
RETIRING until the fence of its last use completes (its state rows may still be read).
"""

from __future__ import annotations

from services.common.errors import InternalError
from services.engine.scheduler.plan import SlotHandle


class SlotTable:
    def __init__(self, num_slots: int) -> None:
        self._generation = [0] * num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._live: set[int] = set()
        self._retiring: dict[int, int] = {}          # slot -> final-use fence

    @property
    def num_slots(self) -> int:
        return len(self._generation)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_live(self) -> int:
        return len(self._live)

    @property
    def num_retiring(self) -> int:
        return len(self._retiring)

    def acquire(self) -> SlotHandle | None:
        if not self._free:
            return None
        slot = self._free.pop()
        self._generation[slot] += 1
        self._live.add(slot)
        return SlotHandle(slot, self._generation[slot])

    def is_current(self, handle: SlotHandle) -> bool:
        return handle.slot in self._live and self._generation[handle.slot] == handle.generation

    def release(self, handle: SlotHandle, fence: int, completed: int) -> None:
        if not self.is_current(handle):
            raise InternalError(f"slot {handle} released but it is not live")
        self._live.discard(handle.slot)
        if fence <= completed:
            self._free.append(handle.slot)
        else:
            self._retiring[handle.slot] = fence

    def advance_completed(self, fence: int) -> None:
        done = [slot for slot, f in self._retiring.items() if f <= fence]
        for slot in done:
            del self._retiring[slot]
            self._free.append(slot)
