"""One row as the output holds it: the tokens sent, which of them are supervised, and what was cut."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    row: int
    input_ids: list[int]
    loss_mask: list[int]
    original_length: int  # before truncation
    #: False: the row had no loss_mask, so every token is supervised (prompts included)
    loss_mask_given: bool = True

    @property
    def truncated(self) -> bool:
        return self.original_length > len(self.input_ids)
