"""How every list of the API is paginated: one cursor scheme (README, "API").

A list answers `{"next": url|null, "previous": url|null, "results": [...]}` with at most
`page_size` items (`QUOR_API_PAGE_SIZE` when not given; more than `QUOR_API_MAX_PAGE_SIZE`
is capped). `next` and `previous` are the same request with an opaque `cursor`; following
`next` until it is null lists every item once. A cursor is a position in a fixed order of
an unchanging key (keyset pagination): no COUNT(*), and an item that exists throughout is
listed exactly once even when others are added meanwhile.

Cursors are signed (with the path they were issued for), so a forged, altered or foreign
cursor is refused (`pagination.invalid_cursor`, 400) before any query runs; so is a
`page_size` that is not a whole number from 1 up (`pagination.invalid_page_size`). Views
make their paginator first thing, so that bad parameters change nothing.
"""

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence

from django.conf import settings
from django.core import signing
from rest_framework import pagination
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from quor.lib.errors import InvalidInput

CURSOR_PARAM = "cursor"
PAGE_SIZE_PARAM = "page_size"
NEWEST_FIRST = ("-created_at", "-id")


def page_size_from(request, *, default: int | None = None, maximum: int | None = None) -> int:
    """The `page_size` asked for, capped at `maximum`; 400 unless it is a whole number >= 1."""
    maximum = max(1, maximum or settings.QUOR_API_MAX_PAGE_SIZE)
    default = min(max(1, default or settings.QUOR_API_PAGE_SIZE), maximum)
    value = request.query_params.get(PAGE_SIZE_PARAM)
    if value is None:
        return default
    digits = value.lstrip("0") if value.isascii() and value.isdigit() else ""
    if not digits:
        raise InvalidInput(
            f"page_size must be a whole number from 1 (at most {maximum} are returned).",
            code="pagination.invalid_page_size",
        )
    return min(int(digits), maximum) if len(digits) <= 9 else maximum


def _signer(request) -> signing.Signer:
    return signing.Signer(salt=f"quor.pagination:{request.path}")


def sign_cursor(request, position: dict) -> str:
    return _signer(request).sign_object(position)


def read_cursor(request) -> dict | None:
    """The position in the request's `cursor`; 400 for one Quor did not issue for this path
    (or issued before its secret key changed: start again from the first page)."""
    token = request.query_params.get(CURSOR_PARAM)
    if token is None:
        return None
    try:
        position = _signer(request).unsign_object(token)
    except (signing.BadSignature, ValueError):
        position = None
    if not isinstance(position, dict):
        raise invalid_cursor()
    return position


def invalid_cursor() -> InvalidInput:
    return InvalidInput(
        "The cursor is not valid here: use the `next` or `previous` link of this list "
        "unchanged, or start again without a cursor.",
        code="pagination.invalid_cursor",
    )


class CursorPagination(pagination.CursorPagination):
    """DRF's cursor pagination with Quor's parameters, limits and signed cursors, for a
    queryset in `ordering` (an unchanging key, then a unique tie-breaker such as `id`).

    Give the request to check `cursor` and `page_size` at once, then call `response()`:

        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        ...  # access checks, the queryset
        return pages.response(queryset, lambda page: Serializer(page, many=True).data)
    """

    cursor_query_param = CURSOR_PARAM
    page_size_query_param = PAGE_SIZE_PARAM
    ordering = NEWEST_FIRST
    template = None

    def __init__(self, request=None, *, ordering: Sequence[str] | None = None):
        if ordering is not None:
            self.ordering = tuple(ordering)
        self.page_size = settings.QUOR_API_PAGE_SIZE
        self.max_page_size = settings.QUOR_API_MAX_PAGE_SIZE
        self._request = request
        self._checked = None
        if request is not None:
            self._checked = (self.get_page_size(request), self.decode_cursor(request))

    def get_page_size(self, request):
        if self._checked is not None:
            return self._checked[0]
        return page_size_from(request, default=self.page_size, maximum=self.max_page_size)

    def decode_cursor(self, request):
        if self._checked is not None:
            return self._checked[1]
        position = read_cursor(request)
        if position is None:
            return None
        try:
            offset, reverse, key = int(position["o"]), bool(position["r"]), position["p"]
        except (KeyError, TypeError, ValueError):
            raise invalid_cursor() from None
        return pagination.Cursor(
            offset=min(max(offset, 0), self.offset_cutoff), reverse=reverse, position=key
        )

    def encode_cursor(self, cursor):
        token = sign_cursor(
            self.request, {"o": cursor.offset, "r": cursor.reverse, "p": cursor.position}
        )
        return replace_query_param(self.base_url, self.cursor_query_param, token)

    def get_previous_link(self):
        # From a last page whose items all share one position with the page before, DRF
        # steps back a whole page_size; when that last page is short, items were skipped.
        if self.page and not self.has_next and len(self.page) < self.page_size:
            page_size, self.page_size = self.page_size, len(self.page)
            try:
                return super().get_previous_link()
            finally:
                self.page_size = page_size
        return super().get_previous_link()

    def response(self, queryset, serialize: Callable[[list], list]) -> Response:
        """The page of `queryset` the request asks for, `serialize`d, with its links."""
        if self._request is None:
            raise RuntimeError("Give the request when making the paginator.")
        page = self.paginate_queryset(queryset, self._request)
        return self.get_paginated_response(serialize(page))

    def get_paginated_response_schema(self, schema):
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": link, "results": schema},
        }

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        descriptions = {
            self.cursor_query_param: "From a `next` or `previous` link; give it unchanged.",
            self.page_size_query_param: (
                f"Items per page (default {settings.QUOR_API_PAGE_SIZE}; more than "
                f"{settings.QUOR_API_MAX_PAGE_SIZE} is capped)."
            ),
        }
        for parameter in parameters:
            parameter["description"] = descriptions[parameter["name"]]
        return parameters


class ListPagination:
    """The same pages and cursors over a list computed in memory (the models, the App
    catalog), in the order of `key`: a tuple of ints and strings that identifies the item."""

    def __init__(self, request):
        self.request = request
        self.page_size = page_size_from(request)
        self.position = read_cursor(request)
        if self.position is not None and not {"after", "before"} & set(self.position):
            raise invalid_cursor()

    def response(self, items: Iterable, *, key: Callable, serialize: Callable) -> Response:
        items = sorted(items, key=key)
        keys = [list(key(item)) for item in items]
        position = self.position or {}
        if "after" in position:
            start = bisect_right(keys, position["after"])
            end = min(start + self.page_size, len(items))
        elif "before" in position:
            before = position["before"]
            end = len(items) if before is None else bisect_left(keys, before)
            start = max(0, end - self.page_size)
        else:
            start, end = 0, min(self.page_size, len(items))
        following = None
        if end < len(items):
            following = {"after": keys[end - 1]} if end else None
        preceding = None
        if start > 0:
            preceding = {"before": keys[start] if start < len(items) else None}
        return Response(
            {
                "next": self._link(following) if end < len(items) else None,
                "previous": self._link(preceding) if start > 0 else None,
                "results": serialize(items[start:end]),
            }
        )

    def _link(self, position: dict | None) -> str:
        url = self.request.build_absolute_uri()
        if position is None:
            return remove_query_param(url, CURSOR_PARAM)
        return replace_query_param(url, CURSOR_PARAM, sign_cursor(self.request, position))
