"""Reads of web apps and their public links, always for a given session, link or user."""

from django.utils import timezone

from quor.lib.errors import NotFound
from sandboxes.models import Session
from webapps.models import PublicLink


def webapps_of(session: Session):
    """The web apps the agent started in the session."""
    return session.webapps.all()


def public_links_of(session: Session):
    """The session's links that can still be used by someone (not revoked, not expired)."""
    return PublicLink.objects.filter(
        webapp__session=session, revoked_at__isnull=True, expires_at__gt=timezone.now()
    ).select_related("webapp")


def get_public_link_for_owner(user, link_id) -> PublicLink:
    """A link of one of the user's own sessions; revoked and expired links are gone."""
    link = (
        PublicLink.objects.select_related("webapp__session")
        .filter(pk=link_id, webapp__session__owner=user, revoked_at__isnull=True)
        .first()
    )
    if link is None or link.expires_at <= timezone.now():
        raise NotFound("No such public link.", code="webapps.public_link_not_found")
    return link


def visits_of(link: PublicLink):
    """Who opened the link."""
    return link.visits.all()
