"""Measuring a drafter the way its target will judge it: chain acceptance on held-out text.

* :mod:`hsextract.evaluate.acceptance`: per-step agreement with the target's greedy tokens and the
  expected acceptance length that follows, from any drafter's guesses.
* :mod:`hsextract.evaluate.prompt_lookup`: the free baseline, n-gram (prompt lookup) drafting.
"""

from hsextract.evaluate.acceptance import AcceptanceCounts, chain_acceptance
from hsextract.evaluate.prompt_lookup import prompt_lookup_drafts

__all__ = ["AcceptanceCounts", "chain_acceptance", "prompt_lookup_drafts"]
