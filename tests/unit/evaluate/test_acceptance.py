"""The acceptance measure on drafters whose answers are known."""

from __future__ import annotations

import pytest
import torch

from hsextract.evaluate import AcceptanceCounts, chain_acceptance, prompt_lookup_drafts

K = 3


def _text(length: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randint(10, 1000, (length,), generator=torch.Generator().manual_seed(seed))


def _greedy_of(tokens: torch.Tensor) -> torch.Tensor:
    """A target whose greedy choice at every position is the text's next token."""
    return torch.cat([tokens[1:], torch.tensor([0])])


def _oracle(tokens: torch.Tensor, k: int = K) -> torch.Tensor:
    """Guesses every future token right: drafts[j, p] = x_{p+2+j}."""
    length = tokens.shape[0]
    drafts = torch.full((k, length), -1, dtype=torch.long)
    for j in range(k):
        drafts[j, : max(0, length - 2 - j)] = tokens[2 + j :]
    return drafts


def test_an_oracle_is_accepted_up_to_k_except_where_the_response_ends() -> None:
    tokens = _text()
    response = torch.zeros(40, dtype=torch.bool)
    response[10:] = True  # prompt 0..9, the target wrote 10..39
    counts = chain_acceptance(_oracle(tokens), tokens, _greedy_of(tokens), response)
    points = range(9, 39)  # x_{p+1} in the response
    assert counts.cycles == len(points)
    expected = [sum(1 for p in points if p + 2 + j <= 39) for j in range(K)]
    assert counts.accepted_through == expected
    summary = counts.summary()
    assert summary["expected_acceptance_length"] == pytest.approx(1 + sum(expected) / len(points), abs=1e-4)
    assert summary["agreement"][0] == pytest.approx(expected[0] / len(points), abs=1e-4)


def test_guesses_inside_the_prompt_never_count() -> None:
    tokens = _text()
    response = torch.zeros(40, dtype=torch.bool)
    response[20:25] = True  # a short answer followed by a new prompt (a multi-turn row)
    counts = chain_acceptance(_oracle(tokens), tokens, _greedy_of(tokens), response)
    assert counts.cycles == 5  # points 19..23
    assert counts.accepted_through == [4, 3, 2]  # only x_21..x_24 can be guessed right


def test_a_drafter_that_is_always_wrong_gives_one_token_per_cycle() -> None:
    tokens = _text()
    wrong = _oracle(tokens) + 1
    summary = chain_acceptance(wrong, tokens, _greedy_of(tokens), torch.ones(40, dtype=torch.bool)).summary()
    assert summary["expected_acceptance_length"] == 1.0 and summary["reached"] == [0.0, 0.0, 0.0]


def test_a_wrong_first_guess_stops_the_chain_even_if_later_guesses_are_right() -> None:
    tokens = _text()
    drafts = _oracle(tokens)
    drafts[0] += 1  # later guesses right, but greedy verification stops at the first miss
    counts = chain_acceptance(drafts, tokens, _greedy_of(tokens), torch.ones(40, dtype=torch.bool))
    assert counts.accepted_through == [0, 0, 0]


def test_right_only_at_the_first_position_gives_two_tokens_per_cycle() -> None:
    tokens = _text()
    drafts = _oracle(tokens)
    drafts[1:] += 1
    summary = chain_acceptance(drafts, tokens, _greedy_of(tokens), torch.ones(40, dtype=torch.bool)).summary()
    cycles = summary["cycles"]
    assert summary["reached"][0] == pytest.approx((cycles - 1) / cycles, abs=1e-4)  # the last point has no x_{p+2}
    assert summary["agreement"][1] == 0.0


def test_every_other_point_right() -> None:
    tokens = _text()
    drafts = _oracle(tokens)
    drafts[:, 1::2] = -1  # no guess at odd points
    counts = chain_acceptance(drafts, tokens, _greedy_of(tokens), torch.ones(40, dtype=torch.bool))
    assert counts.accepted_through[0] == len(range(0, 38, 2))


def test_where_the_text_leaves_the_greedy_path_the_chain_stops() -> None:
    tokens = _text()
    greedy = _greedy_of(tokens)
    greedy[20] = 3  # the target would have written 3 as x_21; the text has another token
    counts = chain_acceptance(_oracle(tokens), tokens, greedy, torch.ones(40, dtype=torch.bool))
    full = chain_acceptance(_oracle(tokens), tokens, _greedy_of(tokens), torch.ones(40, dtype=torch.bool))
    # the guesses of x_21 (points 19, 18, 17 at positions 0, 1, 2) no longer count, nor what follows them
    assert full.accepted_through[0] - counts.accepted_through[0] == 1
    assert full.accepted_through[2] - counts.accepted_through[2] == 3


def test_counts_add_up_and_refuse_another_k() -> None:
    tokens = _text()
    one = chain_acceptance(_oracle(tokens), tokens, _greedy_of(tokens), torch.ones(40, dtype=torch.bool))
    total = AcceptanceCounts(k=K)
    total.add(one)
    total.add(one)
    assert total.cycles == 2 * one.cycles and total.accepted_through == [2 * n for n in one.accepted_through]
    with pytest.raises(ValueError, match="draft positions"):
        total.add(AcceptanceCounts(k=2))


def test_prompt_lookup_proposes_what_followed_the_last_match() -> None:
    tokens = torch.tensor([5, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    drafts = prompt_lookup_drafts(tokens, 3)
    # point 4: context 5 1 2 3 4 1; "1" was last seen at index 1, followed by 2 3 4
    assert drafts[:, 4].tolist() == [2, 3, 4]
    # point 7: context ... 1 2 3 4; "2 3 4" seen at 2..4, followed by 1 2 3
    assert drafts[:, 7].tolist() == [1, 2, 3]
    # point 0: context 5 1, nothing seen before: no proposal
    assert drafts[:, 0].tolist() == [-1, -1, -1]
    summary = chain_acceptance(drafts, tokens, _greedy_of(tokens), torch.ones(11, dtype=torch.bool)).summary()
    assert summary["expected_acceptance_length"] > 2.0  # a periodic text is what prompt lookup is for


def test_prompt_lookup_never_proposes_a_token_the_context_does_not_hold() -> None:
    tokens = torch.tensor([7, 7, 8, 9])
    drafts = prompt_lookup_drafts(tokens, 3)
    # point 0: context 7 7; "7" seen ending at index 1, followed by x_1 = 7 only (x_2 is not yet known)
    assert drafts[:, 0].tolist() == [7, -1, -1]
    for p in range(4):
        context = set(tokens[: p + 2].tolist())
        assert all(t == -1 or t in context for t in drafts[:, p].tolist())


def test_prompt_lookup_refuses_a_bad_ngram_range() -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        prompt_lookup_drafts(torch.tensor([1, 2]), 2, max_ngram=1, min_ngram=2)
