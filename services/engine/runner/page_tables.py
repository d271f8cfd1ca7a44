"""The device page table's host mirror: which entries each slot already uploaded.

The device keeps one persistent table, int32 [num_slots + 1, width] (the last row belongs to
padding sequences); a step gathers the rows of its sequences. A sequence's page list only grows
while it holds its slot generation (the scheduler appends pages; publication moves pages to the
cache without remapping), except that a verification step's rejected drafts may give back
their last pages (a truncation), so a step uploads only the entries past what the slot's generation
already has on the device: one page per decode now and then, a whole table only when a
sequence (re)starts in a slot. Updates are flat cell indices into the table plus values;
unused update entries of a captured graph point at the padding row's last cell.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.scheduler.plan import SlotHandle


@dataclass(slots=True)
class _Uploaded:
    handle: SlotHandle
    pages: list[int]   # the page ids the device row holds for this slot generation


class PageTableMirror:
    def __init__(self, num_slots: int, width: int) -> None:
        self.num_slots = num_slots
        self.width = width
        self._rows: dict[int, _Uploaded] = {}

    @property
    def padding_row(self) -> int:
        return self.num_slots

    @property
    def trash_cell(self) -> int:
        """The cell unused update entries write (the padding row's last entry)."""
        return self.num_slots * self.width + self.width - 1

    def updates(self, handle: SlotHandle, page_ids: tuple[int, ...],
                index: list[int], value: list[int]) -> int:
        """Append the cells `page_ids` needs beyond what is uploaded; returns how many."""
        if len(page_ids) > self.width:
            raise ValueError(f"slot {handle}: {len(page_ids)} pages exceed the page table's "
                             f"width {self.width}")
        start = self._known(handle, page_ids)
        base = handle.slot * self.width
        for position in range(start, len(page_ids)):
            index.append(base + position)
            value.append(page_ids[position])
        if page_ids:
            known = self._rows.get(handle.slot)
            if known is None or known.handle != handle:
                self._rows[handle.slot] = _Uploaded(handle, list(page_ids))
            else:
                del known.pages[start:]
                known.pages.extend(page_ids[start:])
        else:
            self._rows.pop(handle.slot, None)
        return len(page_ids) - start

    def _known(self, handle: SlotHandle, page_ids: tuple[int, ...]) -> int:
        """How many leading entries of `page_ids` the device row already holds: all the
        uploaded ones while the list only grows; fewer when a verification gave its last
        pages back and the list grew again with others (checked from the end: O(1) for
        plain growth)."""
        known = self._rows.get(handle.slot)
        if known is None or known.handle != handle:
            return 0
        uploaded = known.pages
        start = min(len(uploaded), len(page_ids))
        while start and page_ids[start - 1] != uploaded[start - 1]:
            start -= 1
        return start

    def pending(self, handle: SlotHandle, page_ids: tuple[int, ...]) -> int:
        """How many entries `updates` would upload (without recording anything)."""
        return len(page_ids) - self._known(handle, page_ids)

    def forget(self) -> None:
        """The device table can no longer be trusted (after a failure): upload everything."""
        self._rows.clear()
