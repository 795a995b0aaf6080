"""Request ids: the only strings that ever become a dump directory name."""

from __future__ import annotations

import pytest

from hsextract.contract.rids import MAX_ROW, check_prefix, make_rid, parse_rid
from hsextract.errors import BadSampleError, ConfigError


def test_round_trip() -> None:
    rid = make_rid(42, 1234, "hsx")
    assert rid == "hsx-000000042-n1234"
    parsed = parse_rid(rid, "hsx")
    assert parsed is not None and (parsed.row, parsed.num_tokens) == (42, 1234) and str(parsed) == rid


@pytest.mark.parametrize(
    "rid",
    [
        "hsx-000000042-n0",
        "hsx-42-n5",
        "other-000000042-n5",
        "hsx-000000042-n5/../x",
        "../hsx-000000042-n5",
        "HEALTH_CHECK_1",
        7,
        None,
    ],
)
def test_anything_else_is_not_a_rid(rid: object) -> None:
    assert parse_rid(rid, "hsx") is None


@pytest.mark.parametrize("prefix", ["", "a-b", "x" * 33, "../"])
def test_bad_prefix_is_a_config_error(prefix: str) -> None:
    with pytest.raises(ConfigError, match="1-32 letters or digits"):
        check_prefix(prefix)


def test_rows_beyond_the_field_are_bad_samples() -> None:
    with pytest.raises(BadSampleError) as caught:
        make_rid(MAX_ROW + 1, 5)
    assert caught.value.reason == "row_out_of_range"
