from django.conf import settings
from rest_framework import serializers

from quor.lib.serializers import StrictSerializer
from webapps import services
from webapps.models import PublicLink, Tunnel


class WebAppSerializer(serializers.Serializer):
    """A web server the agent started in the session (as webapps.services.webapp_payload)."""

    id = serializers.UUIDField()
    label = serializers.CharField()
    port = serializers.IntegerField()
    command = serializers.CharField()
    status = serializers.CharField()
    url = serializers.URLField(help_text="The app's own origin.")
    open_url = serializers.CharField(
        help_text="On Quor's origin: logs the viewer in and hands them off to the app."
    )


class PublicLinkCreateSerializer(StrictSerializer):
    """Checked further by webapps.services.public_link_create (its own error codes)."""

    webapp = serializers.UUIDField(help_text="The session's web app the link opens.")
    expires_at = serializers.DateTimeField(
        help_text="When the link stops working: in the future, at most "
        "QUOR_PUBLIC_LINK_MAX_DAYS away (`webapps.invalid_link_expiry`)."
    )
    visitor_auth = serializers.ChoiceField(
        choices=PublicLink.VisitorAuth.choices,
        required=False,
        default=PublicLink.VisitorAuth.NONE,
        help_text="`none`: anyone with the link; `password`: visitors give `password`; "
        "`email`: visitors give an email address of `email_domains` and the one-time code "
        "mailed to it (`webapps.email_not_configured` without QUOR_EMAIL_HOST).",
    )
    password = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=200,
        write_only=True,
        help_text="For `password` links: 8 to 200 characters (`webapps.invalid_link_password`).",
    )
    email_domains = serializers.ListField(
        child=serializers.RegexField(
            services.EMAIL_DOMAIN_PATTERN,
            max_length=services.MAX_EMAIL_DOMAIN_CHARS,
        ),
        required=False,
        max_length=services.MAX_LINK_EMAIL_DOMAINS,
        help_text="For `email` links: 1 to 20 lowercase domains whose addresses may open it, "
        "each exactly (`example.com` admits no `a.example.com`; no wildcards) "
        "(`webapps.invalid_link_email_domains`).",
    )
    requests_per_minute = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.QUOR_PUBLIC_LINK_MAX_REQUESTS_PER_MINUTE,
        help_text="Visitors' requests per minute, across every proxy (default: the most).",
    )
    bandwidth_bytes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.QUOR_PUBLIC_LINK_MAX_BANDWIDTH_BYTES,
        help_text="Bytes the link may serve over its life (default: the most).",
    )


class PublicLinkSerializer(serializers.Serializer):
    """A public link to a web app (as webapps.services.public_link_payload)."""

    id = serializers.UUIDField()
    webapp = serializers.UUIDField()
    url = serializers.URLField(help_text="The link: an origin of its own, not the app's.")
    visitor_auth = serializers.ChoiceField(choices=PublicLink.VisitorAuth.choices)
    email_domains = serializers.ListField(
        child=serializers.CharField(), help_text="For `email` links: who may open it."
    )
    requests_per_minute = serializers.IntegerField()
    bandwidth_bytes = serializers.IntegerField()
    expires_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()


class TunnelSerializer(serializers.Serializer):
    """An open local relay tunnel (as webapps.tunnels.tunnel_payload)."""

    id = serializers.UUIDField()
    url = serializers.URLField(help_text="The tunnel's URL, an origin of its own.")
    port = serializers.IntegerField(help_text="The loopback port its client relays to.")
    sharing = serializers.ChoiceField(choices=Tunnel.Sharing.choices)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(help_text="Its hard end, connected or not.")


class TunnelUpdateSerializer(serializers.Serializer):
    sharing = serializers.ChoiceField(
        choices=Tunnel.Sharing.choices,
        help_text="`organization`: every member of your organization may open it, as "
        "a web app shared with them.",
    )


class PublicLinkVisitSerializer(serializers.Serializer):
    """A visitor who opened the link: the first request of a browser, or a password or
    an email's one-time code accepted."""

    opened_at = serializers.DateTimeField()
    address = serializers.IPAddressField(allow_null=True)
    user_agent = serializers.CharField()
    authenticated_by = serializers.CharField(help_text="`password`, `email`, or empty.")
    email = serializers.CharField(help_text="The address an email link's code went to, or empty.")
