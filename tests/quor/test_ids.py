"""Ids that arrive as text (URLs, forms, query strings)."""


def test_only_ascii_digits_that_fit_a_bigint_are_database_ids():
    from quor.lib.ids import is_database_id

    assert is_database_id("42") and is_database_id(42)
    for refused in ("²", "0", "-1", "1.5", "", str(2**63), "9" * 40, True, None, 3.0):
        assert not is_database_id(refused), refused
