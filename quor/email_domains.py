"""Organizations' email domains: claimed by an owner, verified by a DNS TXT record.

SCIM and single sign-on create users only at domains their organization holds verified
(`domain_is_verified`), so that no organization takes another's addresses. A claim is
only an intent: several organizations may claim one domain, each with its own token, and
the first to publish its token at `_quor-verification.<domain>` holds it; while one
holds it, no other verifies it. A domain covers its own addresses, not its subdomains'.
"""

import re
import secrets

import dns.exception
import dns.resolver
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from quor.audit import audit_record
from quor.lib.errors import Conflict, InvalidInput, QuorError
from quor.models import EmailDomain, Organization

DOMAIN_PATTERN = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62}")
DNS_TIMEOUT_SECONDS = 5


def clean_domain(domain) -> str:
    """A lowercase host name of two labels or more: no wildcard, address or URL."""
    cleaned = domain.strip().lower() if isinstance(domain, str) else ""
    if len(cleaned) > 253 or not DOMAIN_PATTERN.fullmatch(cleaned):
        raise InvalidInput(
            f"{domain!r} is not an email domain: give a host name such as example.com "
            "(no wildcard; claim each subdomain on its own).",
            code="email_domains.invalid_domain",
        )
    return cleaned


def domain_of(email: str) -> str:
    return email.rpartition("@")[2].strip().lower()


def domain_is_verified(organization: Organization, email: str) -> bool:
    """Whether the organization holds the address's domain, verified."""
    return EmailDomain.objects.filter(
        organization=organization, domain=domain_of(email), verified_at__isnull=False
    ).exists()


@transaction.atomic
def email_domain_claim(*, organization: Organization, domain, actor=None) -> EmailDomain:
    """A pending claim with its own token, to publish in DNS before verifying."""
    domain = clean_domain(domain)
    if EmailDomain.objects.filter(organization=organization, domain=domain).exists():
        raise Conflict(f"The organization already claims {domain}.", code="email_domains.exists")
    claim = EmailDomain.objects.create(
        organization=organization, domain=domain, token=secrets.token_hex(16)
    )
    audit_record(
        "email_domain.claimed",
        target=claim,
        organization=organization,
        actor=actor,
        changes={"domain": domain},
    )
    return claim


def verification_records(name: str) -> list[str]:
    """The TXT strings published at `name`, from `QUOR_DOMAIN_VERIFICATION_DNS_SERVER`
    or the system's resolver; none when the name does not exist."""
    if settings.QUOR_DOMAIN_VERIFICATION_DNS_SERVER:
        host, _, port = settings.QUOR_DOMAIN_VERIFICATION_DNS_SERVER.rpartition(":")
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port = [host], int(port)
    else:
        resolver = dns.resolver.Resolver()
    try:
        answer = resolver.resolve(name, "TXT", lifetime=DNS_TIMEOUT_SECONDS)
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return []
    except dns.exception.DNSException as exc:
        raise QuorError(
            f"DNS could not be asked for {name} ({exc.__class__.__name__}); try again.",
            code="email_domains.dns_unavailable",
            status=503,
        ) from None
    return [b"".join(record.strings).decode(errors="replace") for record in answer]


def email_domain_verify(*, claim: EmailDomain, actor=None) -> EmailDomain:
    """Marks the claim verified once its token is published in DNS, unless another
    organization holds the domain. DNS is asked first, so only the domain's holder learns
    that another organization holds it."""
    if claim.verified_at is not None:
        return claim
    if claim.record_value not in verification_records(claim.record_name):
        raise InvalidInput(
            f"No TXT record {claim.record_value!r} at {claim.record_name} yet: publish it "
            "in the domain's DNS, then verify again (DNS changes may take a while).",
            code="email_domains.record_not_found",
        )
    try:
        with transaction.atomic():
            verified = EmailDomain.objects.filter(pk=claim.pk, verified_at__isnull=True).update(
                verified_at=timezone.now()
            )
            if verified:
                audit_record(
                    "email_domain.verified",
                    target=claim,
                    organization=claim.organization,
                    actor=actor,
                    changes={"domain": claim.domain, "record": claim.record_name},
                )
    except IntegrityError:
        raise Conflict(
            f"Another organization holds {claim.domain}. Ask Quor's operator.",
            code="email_domains.held_elsewhere",
        ) from None
    claim.refresh_from_db()
    return claim


@transaction.atomic
def email_domain_remove(*, claim: EmailDomain, actor=None) -> None:
    """Users are no longer created at the domain; those who were stay."""
    audit_record(
        "email_domain.removed",
        target=claim,
        organization=claim.organization,
        actor=actor,
        changes={"domain": claim.domain, "was_verified": claim.verified_at is not None},
    )
    claim.delete()
