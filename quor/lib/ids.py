"""Checks for ids that arrive as text, before they reach a query."""


def is_database_id(value) -> bool:
    """A value that can be a primary key (so a huge number is 404, not a database error,
    and a non-ASCII digit such as "²" is refused rather than crashing `int`)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 20:
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63
