"""Who a caller is, for document access lists: computed by Quor from its own tables for
every request, never taken from the request.

A deactivated user, a user without a membership and a member of a disabled
organization have no principals, so they match no access list. A Skill, an App, a
shared web app or a sandbox adds none: a sandbox searches as its owner."""

import re

from django.contrib.auth.models import Group

from quor.models import Membership

USER = "user"
GROUP = "group"
ORGANIZATION = "org"
KINDS = (USER, GROUP, ORGANIZATION)


def principal(kind: str, pk: int) -> str:
    return f"{kind}:{pk}"


def principals_for(user) -> list[str]:
    if user is None or not user.is_authenticated or not user.is_active:
        return []
    membership = (
        Membership.objects.select_related("organization")
        .filter(user=user, organization__is_active=True)
        .first()
    )
    if membership is None:
        return []
    groups = Group.objects.filter(user=user).values_list("pk", flat=True)
    return [
        principal(USER, user.pk),
        principal(ORGANIZATION, membership.organization_id),
        *(principal(GROUP, pk) for pk in groups),
    ]


_ID = re.compile(r"[1-9][0-9]{0,17}", re.ASCII)


def parse_principal(value: str) -> tuple[str, int] | None:
    """(kind, id) of a principal written exactly as `principal` writes it, or None: no
    other digits, no leading zeros, so that a stored principal always matches a caller's."""
    kind, _, pk = value.partition(":")
    if kind not in KINDS or not _ID.fullmatch(pk):
        return None
    return kind, int(pk)
