"""Users, organizations (Quor workspaces), memberships, model providers, API tokens and
the file store's blobs."""

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, Group, PermissionsMixin
from django.db import models
from django.utils import timezone

from quor.lib.fields import EncryptedTextField


class UserManager(BaseUserManager):
    use_in_migrations = True

    def create_user(self, email, password=None, **extra_fields):
        if not email:
            raise ValueError("A user needs an email address")
        user = self.model(email=self.normalize_email(email).lower(), **extra_fields)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_superuser(self, email, password=None, **extra_fields):
        extra_fields.setdefault("is_staff", True)
        extra_fields.setdefault("is_superuser", True)
        return self.create_user(email, password, **extra_fields)


class User(AbstractBaseUser, PermissionsMixin):
    """A person who logs in with their email address."""

    email = models.EmailField(unique=True)
    full_name = models.CharField(max_length=200, blank=True)
    is_staff = models.BooleanField(default=False, help_text="May log in to the admin site.")
    is_active = models.BooleanField(default=True)
    date_joined = models.DateTimeField(default=timezone.now)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        ordering = ["email"]

    def __str__(self):
        return self.email


class Organization(models.Model):
    """A Quor workspace. Everything a user does happens inside their organization."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(unique=True)
    is_active = models.BooleanField(
        default=True, help_text="A disabled organization's members cannot use Quor."
    )
    sandbox_enabled = models.BooleanField(default=True)
    workspace_instructions = models.TextField(
        blank=True, help_text="Written into every session's agent instructions."
    )
    allow_public_links = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Members may give people outside Quor a link to a web app of a session. "
        "Switching it off stops every link of the organization at once.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        """What each role may do is in quor/lib/permissions.py (ROLE_PERMISSIONS)."""

        OWNER = "owner", "Owner"
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"
        AUDITOR = "auditor", "Auditor (read-only)"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership"
    )
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    can_use_sandbox = models.BooleanField(default=True)
    external_id = models.CharField(
        max_length=255, blank=True, help_text="The identity provider's id for the member (SCIM)."
    )
    sso_subject = models.CharField(
        max_length=255,
        blank=True,
        db_index=True,
        help_text="The issuer and `sub` of the member's single sign-on: only that account "
        "of the provider is them.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["organization", "user__email"]

    def __str__(self):
        return f"{self.user} in {self.organization} ({self.role})"


class SingleSignOn(models.Model):
    """An organization's OpenID Connect identity provider (quor/sso.py): who may sign in
    through it, and which of its claims say the member's email, name, role and groups."""

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, related_name="single_sign_on"
    )
    enabled = models.BooleanField(default=True)
    issuer = models.URLField(
        help_text="The provider's issuer, e.g. https://login.example.com/tenant/v2.0. "
        "Its discovery document is read from <issuer>/.well-known/openid-configuration."
    )
    client_id = models.CharField(max_length=255)
    client_secret = EncryptedTextField(blank=True)
    scopes = models.CharField(max_length=255, default="openid email profile")
    email_claim = models.CharField(max_length=100, default="email")
    require_verified_email = models.BooleanField(
        default=True,
        help_text="Refuse a sign-in unless the email_verified claim is true. Turn off only "
        "for a provider that never sends it (Entra ID) and whose email claim its users "
        "cannot change.",
    )
    name_claim = models.CharField(max_length=100, default="name", blank=True)
    groups_claim = models.CharField(
        max_length=100,
        blank=True,
        help_text="A claim listing group names: the member is put in exactly those of "
        "the organization's groups (new names become groups). Empty: groups are left alone.",
    )
    role_claim = models.CharField(
        max_length=100,
        blank=True,
        help_text="A claim whose value is admin, member or auditor. Empty: roles are left "
        "alone. The owner role is never given or taken by sign-in.",
    )
    creates_users = models.BooleanField(
        default=False,
        help_text="Create a member at their first sign-in. Otherwise only existing "
        "members may sign in.",
    )
    password_login = models.BooleanField(
        default=True,
        help_text="Members may also log in with a password. Owners always may, so that "
        "a broken identity provider never locks the organization out.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "single sign-on"
        verbose_name_plural = "single sign-on"

    def __str__(self):
        return f"Single sign-on of {self.organization}"

    @property
    def has_client_secret(self) -> bool:
        return bool(self.client_secret)


class ModelProvider(models.Model):
    """An organization's account with a model provider, and which members may use it."""

    class Kind(models.TextChoices):
        ANTHROPIC = "anthropic", "Anthropic"
        OPENAI = "openai", "OpenAI"
        OPENROUTER = "openrouter", "OpenRouter"

    OFFICIAL_BASE_URLS = {
        Kind.ANTHROPIC: "https://api.anthropic.com",
        Kind.OPENAI: "https://api.openai.com/v1",
        Kind.OPENROUTER: "https://openrouter.ai/api/v1",
    }

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="model_providers"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    display_name = models.CharField(max_length=200)
    base_url = models.URLField(blank=True, help_text="Leave empty for the provider's official API.")
    api_key = EncryptedTextField("API key", blank=True)
    model_names = models.JSONField(default=list, help_text="Model names members may choose.")
    available_to_everyone = models.BooleanField(default=True)
    allowed_users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    allowed_groups = models.ManyToManyField(Group, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["organization", "display_name"]

    def __str__(self):
        return self.display_name

    @property
    def effective_base_url(self) -> str:
        return self.base_url or self.OFFICIAL_BASE_URLS[self.kind]

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key)


class ApiToken(models.Model):
    """A personal API token. Only its SHA-256 is stored; the token is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise it.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class StoredBlob(models.Model):
    """A file committed to the file store (quor/filestore.py), with what a read checks.
    Every reference to a blob is a ForeignKey with on_delete=PROTECT: a row nothing
    refers to for an hour is garbage, and so is an object with no row."""

    key = models.CharField(max_length=200, unique=True, help_text="Name in the file store.")
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.key


class FileStoreIdentity(models.Model):
    """Which file store this database's blobs are in: the id written in that store's
    marker object (quor/filestore.py). One row. A process whose store holds another
    marker, or none, is pointed at the wrong directory or bucket."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    marker = models.CharField(max_length=64)
    location = models.CharField(max_length=500, help_text="Where the store was first set up.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "file store identity"

    def __str__(self):
        return f"file store {self.marker} ({self.location})"


class AuditEntry(models.Model):
    """One administrative or security-relevant change (quor/audit.py): who, when, what,
    from which request. Never a secret's value: a credential is "set", "replaced" or
    "removed". Kept QUOR_AUDIT_RETENTION_DAYS."""

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    organization = models.ForeignKey(
        Organization, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(
        max_length=254, help_text="The actor's email, or who else acted (system, operator)."
    )
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=100, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_label = models.CharField(max_length=200, blank=True)
    changes = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=64, blank=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["organization", "-created_at"], name="audit_by_organization")
        ]

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action}"


class OrganizationGroup(models.Model):
    """A Django group that belongs to one organization, named there by its display name
    (Django's group names are unique across organizations: theirs is prefixed with the
    organization's slug). Groups decide model and knowledge access."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="groups")
    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="organization_group")
    display_name = models.CharField(max_length=120)
    external_id = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["organization", "display_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "display_name"], name="group_name_per_organization"
            )
        ]

    def __str__(self):
        return self.display_name


class EmailDomain(models.Model):
    """An email domain an organization claims (quor/email_domains.py). SCIM and single
    sign-on create users only in domains their organization has verified, by a DNS TXT
    record that only the domain's holder can publish. Several organizations may claim a
    domain; at most one holds it verified."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="email_domains"
    )
    domain = models.CharField(max_length=253, help_text="e.g. example.com; not its subdomains.")
    token = models.CharField(max_length=64, editable=False)
    verified_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["organization", "domain"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "domain"], name="email_domain_per_organization"
            ),
            models.UniqueConstraint(
                fields=["domain"],
                condition=models.Q(verified_at__isnull=False),
                name="email_domain_verified_once",
            ),
        ]

    def __str__(self):
        return self.domain

    @property
    def record_name(self) -> str:
        """Where the TXT record that proves the claim is published."""
        return f"_quor-verification.{self.domain}"

    @property
    def record_value(self) -> str:
        return f"quor-verification={self.token}"


class ServiceAccount(models.Model):
    """An integration's identity in an organization: a member without a login (it has
    its own sandbox and sessions), reached with scoped, expiring tokens
    (quor/service_accounts.py)."""

    class Scope(models.TextChoices):
        SESSIONS = "sessions", "Start, read, follow up and cancel sessions"
        EXEC = "exec", "Run commands in the sessions' sandbox"
        FILES = "files", "Read and write the sessions' files"
        EVENTS = "events", "Read the sessions' events and approval requests"
        SCIM = "scim", "Provision the organization's members and groups (SCIM 2.0)"

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="service_accounts"
    )
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="service_account"
    )
    name = models.CharField(max_length=100)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    disabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["organization", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name"], name="service_account_name_per_organization"
            )
        ]

    def __str__(self):
        return self.name


class ServiceAccountToken(models.Model):
    """Only its SHA-256 is stored; the token is shown once. It expires, and a new one
    can be made before the old one is revoked (rotation without downtime)."""

    service_account = models.ForeignKey(
        ServiceAccount, on_delete=models.CASCADE, related_name="tokens"
    )
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.service_account} ({self.prefix}…)"
