"""Formatting shared by Quor's pages."""

from datetime import UTC

from django import template
from django.utils.html import format_html

register = template.Library()


@register.simple_tag
def local_time(moment):
    """A time as `<time>`: "2026-12-01 14:05 UTC" as written, shown in the reader's own
    time zone by quor.js."""
    if moment is None:
        return ""
    utc = moment.astimezone(UTC)
    return format_html(
        '<time datetime="{}" data-local>{} UTC</time>',
        utc.isoformat(),
        utc.strftime("%Y-%m-%d %H:%M"),
    )
