"""SCIM 2.0 provisioning (RFC 7643 and 7644): an identity provider creates, changes,
deactivates and deletes an organization's members and groups.

scim2-models parses, checks and writes the protocol's payloads (resources, filters,
PATCH operations, list responses, errors); what is Quor's own is here: which
attributes Quor keeps, and that every change goes through the services the admin and
the operator API use (member_create, user_deactivate, user_delete), audited as theirs.
Quor keeps a user's userName (their email address: it is how Quor knows people),
displayName, active and externalId, and a group's displayName, members and externalId.
Other attributes of the core User schema (name, emails, phone numbers...) are accepted
and not kept, as RFC 7644 §3.3 allows; an attribute of no schema is refused.

Ids are unique across resource types (RFC 7643 §3.1): `user:<key>` and `group:<key>`,
the same strings knowledge access lists take. Paths and group members given the bare
key Quor answered before still name the same resource, for connectors that stored them.
Users are created, or renamed, only at the organization's verified email domains
(quor/email_domains.py), checked before any lookup of the address, so that no answer
depends on whether another organization has it.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth.models import Group as DjangoGroup
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from pydantic import ValidationError
from scim2_models import (
    Context,
    Error,
    Group,
    GroupMember,
    GroupMembership,
    ListResponse,
    Meta,
    PatchOp,
    Required,
    ResourceType,
    SCIMException,
    ScimFilter,
    SearchRequest,
    ServiceProviderConfig,
    User,
)

from quor import email_domains, services
from quor.audit import audit_record, field_changes
from quor.models import Membership, Organization, OrganizationGroup
from quor.models import User as QuorUser

USER_ATTRIBUTES = ("userName", "displayName", "active", "groups")
CORE_USER = "urn:ietf:params:scim:schemas:core:2.0:User"
CORE_GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
ENTERPRISE_USER = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
NUMBER = re.compile(r"[0-9]{1,18}")
GROUP_ATTRIBUTES = ("displayName", "members")
MAX_RESULTS = 200


SCIM_TYPES = {
    "invalidFilter",
    "tooMany",
    "uniqueness",
    "mutability",
    "invalidSyntax",
    "invalidPath",
    "noTarget",
    "invalidValue",
    "invalidVers",
    "sensitive",
}


class ScimError(Exception):
    """An answer in SCIM's error shape (RFC 7644 §3.12)."""

    def __init__(self, status: int, detail: str, scim_type: str | None = None):
        super().__init__(detail)
        self.status, self.detail, self.scim_type = status, detail, scim_type

    def payload(self) -> dict:
        return Error(status=self.status, scim_type=self.scim_type, detail=self.detail).model_dump()


def _invalid(exc: Exception) -> ScimError:
    """A payload scim2-models refused: its first problem, with SCIM's error type."""
    if isinstance(exc, SCIMException):
        return ScimError(400, str(exc), exc.scim_type)
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        kind = first["type"].removeprefix("scim_")
        scim_type = kind if kind in SCIM_TYPES else "invalidValue"
        if kind == "extra_forbidden":
            scim_type = "invalidSyntax"
        where = ".".join(str(part) for part in first["loc"])
        return ScimError(400, f"{where}: {first['msg']}" if where else first["msg"], scim_type)
    return ScimError(400, str(exc), "invalidValue")


def _parse(model, payload, context):
    if not isinstance(payload, dict):
        raise ScimError(400, "The body is a JSON object.", "invalidSyntax")
    try:
        return model.model_validate(payload, scim_ctx=context)
    except (ValidationError, SCIMException, ValueError) as exc:
        raise _invalid(exc) from None


# --- discovery (RFC 7644 §4) -------------------------------------------------------------


def service_provider_config(base_url: str) -> dict:
    config = ServiceProviderConfig(
        documentation_uri=None,
        patch={"supported": True},
        bulk={"supported": False, "max_operations": 0, "max_payload_size": 0},
        filter={"supported": True, "max_results": MAX_RESULTS},
        change_password={"supported": False},
        sort={"supported": False},
        etag={"supported": False},
        authentication_schemes=[
            {
                "type": "oauthbearertoken",
                "name": "Service account token",
                "description": "A Quor service account's token with the scim scope.",
                "primary": True,
            }
        ],
        meta=Meta(
            resource_type="ServiceProviderConfig", location=f"{base_url}/ServiceProviderConfig"
        ),
    )
    return config.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)


def _schema(model, kept: tuple[str, ...], base_url: str):
    schema = model.to_schema()
    schema.attributes = [a for a in schema.attributes if a.name in kept]
    schema.meta = Meta(resource_type="Schema", location=f"{base_url}/Schemas/{schema.id}")
    return schema


def schemas(base_url: str) -> list[dict]:
    """The core schemas, cut to what Quor keeps: a user's active is required (Quor has
    no "unknown": a PATCH cannot remove it, it sets it false), and a group's members
    are users (no nested groups), named by value, $ref and type."""
    user = _schema(User, USER_ATTRIBUTES, base_url)
    for attribute in user.attributes:
        if attribute.name == "active":
            attribute.required = Required.true
    group = _schema(Group, GROUP_ATTRIBUTES, base_url)
    for attribute in group.attributes:
        if attribute.name == "members":
            attribute.sub_attributes = [
                sub for sub in attribute.sub_attributes if sub.name != "display"
            ]
            for sub in attribute.sub_attributes:
                if sub.name == "$ref":
                    sub.reference_types = ["User"]
                if sub.name == "type":
                    sub.canonical_values = ["User"]
    return [schema.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE) for schema in (user, group)]


def resource_types(base_url: str) -> list[dict]:
    documents = []
    for model in (User, Group):
        resource_type = ResourceType.from_resource(model)
        resource_type.meta = Meta(
            resource_type="ResourceType", location=f"{base_url}/ResourceTypes/{resource_type.id}"
        )
        documents.append(resource_type.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE))
    return documents


def listed(resources: list[dict]) -> dict:
    """Discovery lists: everything on one page, no filter (RFC 7644 §4)."""
    return {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"],
        "totalResults": len(resources),
        "startIndex": 1,
        "itemsPerPage": len(resources),
        "Resources": resources,
    }


# --- listing and filtering ---------------------------------------------------------------


@dataclass
class Page:
    items: list
    total: int
    request: SearchRequest


def search_request(model, parameters: dict) -> SearchRequest:
    """filter, startIndex, count, attributes and excludedAttributes, from a query string
    or a POSTed search (RFC 7644 §3.4.3), checked against the model: an attribute the
    model does not have is an invalidFilter (None: the root search, any resource)."""
    parameters = {key: value for key, value in parameters.items() if value != ""}
    searching = SearchRequest if model is None else SearchRequest[model]
    request = _parse(searching, parameters, Context.SEARCH_REQUEST)
    if request.count is not None and request.count > MAX_RESULTS:
        request.count = MAX_RESULTS
    return request


def _page(resources: list, request: SearchRequest) -> Page:
    """The filter, evaluated on each resource (scim2-models' matcher: case rules and
    operators as RFC 7644 §3.4.2.2 says; bound once per resource type), then the
    1-based page asked for."""
    if request.filter is not None:
        bound = {}
        for resource in resources:
            kind = type(resource)
            if kind not in bound:
                try:
                    bound[kind] = ScimFilter[kind](str(request.filter))
                except (SCIMException, ValidationError, ValueError) as exc:
                    raise _invalid(exc) from None
        resources = [resource for resource in resources if bound[type(resource)].match(resource)]
    start = max(request.start_index or 1, 1) - 1
    count = MAX_RESULTS if request.count is None else max(request.count, 0)
    return Page(items=resources[start : start + count], total=len(resources), request=request)


def list_response(page: Page) -> dict:
    response = ListResponse[User | Group](
        total_results=page.total,
        start_index=max(page.request.start_index or 1, 1),
        items_per_page=len(page.items),
        resources=page.items,
    )
    return response.model_dump(scim_ctx=Context.SEARCH_RESPONSE, response_parameters=page.request)


def resource_response(resource, query: dict) -> dict:
    """One resource, with the attributes the query string asks for (RFC 7644 §3.9)."""
    return resource.model_dump(
        scim_ctx=Context.RESOURCE_QUERY_RESPONSE,
        response_parameters=search_request(type(resource), query) if query else None,
    )


# --- users ---------------------------------------------------------------------------------


def _members(organization: Organization):
    """The organization's people: its service accounts are Quor's own, not the IdP's."""
    return (
        Membership.objects.filter(organization=organization, user__service_account__isnull=True)
        .select_related("user")
        .prefetch_related("user__groups__organization_group")
        .order_by("user_id")
    )


USER_ID_PREFIX = "user:"
GROUP_ID_PREFIX = "group:"


def scim_user_id(pk: int) -> str:
    return f"{USER_ID_PREFIX}{pk}"


def scim_group_id(pk: int) -> str:
    return f"{GROUP_ID_PREFIX}{pk}"


def _key(raw_id, prefix: str) -> int | None:
    """The database key an id names: `<prefix><key>`, or the bare key of earlier
    answers; None for anything else (another type's id included)."""
    number = raw_id.removeprefix(prefix) if isinstance(raw_id, str) else ""
    return int(number) if NUMBER.fullmatch(number) else None


def _by_id(queryset, field: str, raw_id: str, what: str, prefix: str):
    """The row whose `field` is the key the id in the URL names."""
    key = _key(raw_id, prefix)
    found = queryset.filter(**{field: key}).first() if key is not None else None
    if found is None:
        raise ScimError(404, f"No {what} {raw_id}.")
    return found


def _membership(organization: Organization, user_id: str) -> Membership:
    return _by_id(_members(organization), "user_id", user_id, "user", USER_ID_PREFIX)


def user_resource(membership: Membership, base_url: str) -> User:
    user = membership.user
    groups = [
        GroupMembership(
            value=scim_group_id(group.pk),
            display=group.organization_group.display_name,
            ref=f"{base_url}/Groups/{scim_group_id(group.pk)}",
        )
        for group in user.groups.all()
        if hasattr(group, "organization_group")
    ]
    return User(
        id=scim_user_id(user.pk),
        external_id=membership.external_id or None,
        user_name=user.email,
        display_name=user.full_name or None,
        active=user.is_active,
        groups=groups or None,
        meta=Meta(
            resource_type="User",
            created=user.date_joined,
            last_modified=user.date_joined,
            location=f"{base_url}/Users/{scim_user_id(user.pk)}",
        ),
    )


def users(organization: Organization, base_url: str) -> list[User]:
    return [user_resource(membership, base_url) for membership in _members(organization)]


def user_get(organization: Organization, user_id: str, base_url: str) -> User:
    return user_resource(_membership(organization, user_id), base_url)


def _email(user_name) -> str:
    email = (user_name or "").strip().lower() if isinstance(user_name, str) else ""
    try:
        if len(email) > 254:  # User.email's column
            raise DjangoValidationError("too long")
        validate_email(email)
    except DjangoValidationError:
        raise ScimError(
            400,
            f"userName {user_name!r} is not an email address (Quor's users are).",
            "invalidValue",
        ) from None
    return email


def _display_name(resource: User) -> str:
    """displayName, or what the IdP sent as the person's name."""
    if resource.display_name:
        return resource.display_name.strip()[:200]
    name = resource.name
    if name is None:
        return ""
    return (name.formatted or " ".join(filter(None, [name.given_name, name.family_name]))).strip()[
        :200
    ]


@transaction.atomic
def user_create(organization: Organization, payload, actor, base_url: str) -> User:
    resource = _parse(User, _without_extension(payload), Context.RESOURCE_CREATION_REQUEST)
    email = _email(resource.user_name)
    _check_domain(organization, email)
    if QuorUser.objects.filter(email=email).exists():
        raise ScimError(409, f"A user {email} exists.", "uniqueness")
    user = services.member_create(email=email, organization=organization)
    membership = user.membership
    _write_user(membership, resource, actor, email=email, active_when_absent=True)
    return user_get(organization, scim_user_id(user.pk), base_url)


def _check_domain(organization: Organization, email: str) -> None:
    """An address outside the organization's verified domains is refused before anyone
    looks it up: the same answer whether another organization has it or nobody does."""
    if not email_domains.domain_is_verified(organization, email):
        raise ScimError(
            400,
            f"{email_domains.domain_of(email)} is not one of the organization's verified "
            "email domains: an owner claims and verifies it first (admin: Email domains).",
            "invalidValue",
        )


def _write_user(
    membership: Membership, resource: User, actor, *, email: str, active_when_absent=None
) -> None:
    """What a replacement says (a creation is a replacement of nothing): the fields
    Quor keeps, then deactivation or reactivation through their services. Without
    `active`, a new user is active and an existing one stays as they are (a partial
    PUT never lets a deactivated user back in)."""
    user = membership.user
    before = {
        "email": user.email,
        "full_name": user.full_name,
        "external_id": membership.external_id,
    }
    if email != user.email:
        _check_domain(membership.organization, email)
        if QuorUser.objects.filter(email=email).exclude(pk=user.pk).exists():
            raise ScimError(409, f"A user {email} exists.", "uniqueness")
    user.email, user.full_name = email, _display_name(resource)
    user.save(update_fields=["email", "full_name"])
    membership.external_id = (resource.external_id or "")[:255]
    membership.save(update_fields=["external_id"])
    after = {
        "email": user.email,
        "full_name": user.full_name,
        "external_id": membership.external_id,
    }
    changed = field_changes(before, after)
    if changed:
        audit_record(
            "scim.user_changed",
            target=user,
            organization=membership.organization,
            actor=actor,
            changes=changed,
        )
    active = resource.active
    if active is None:
        active = user.is_active if active_when_absent is None else active_when_absent
    if active and not user.is_active:
        services.user_reactivate(user=user, actor=actor, via="scim")
    elif not active and user.is_active:
        services.user_deactivate(user=user, actor=actor, via="scim")


@transaction.atomic
def user_replace(organization: Organization, user_id: str, payload, actor, base_url: str) -> User:
    membership = _membership(organization, user_id)
    resource = _parse(User, _without_extension(payload), Context.RESOURCE_REPLACEMENT_REQUEST)
    if resource.id is not None and _key(resource.id, USER_ID_PREFIX) != membership.user_id:
        raise ScimError(400, "id is immutable.", "mutability")
    _write_user(membership, resource, actor, email=_email(resource.user_name))
    return user_get(organization, user_id, base_url)


@transaction.atomic
def user_patch(organization: Organization, user_id: str, payload, actor, base_url: str) -> User:
    membership = _membership(organization, user_id)
    resource = user_resource(membership, base_url)
    _apply_patch(User, resource, payload)
    if resource.active is None:
        raise ScimError(400, "active cannot be removed: set it to false.", "mutability")
    _write_user(membership, resource, actor, email=_email(resource.user_name))
    return user_get(organization, user_id, base_url)


def user_delete(organization: Organization, user_id: str, actor) -> None:
    membership = _membership(organization, user_id)
    services.user_delete(user=membership.user, actor=actor, via="scim")


def _without_extension(payload):
    """Entra's and Okta's default mappings send the enterprise extension (department,
    manager...): accepted and not kept, like the core attributes Quor does not keep."""
    if not isinstance(payload, dict):
        return payload
    kept = {key: value for key, value in payload.items() if key != ENTERPRISE_USER}
    if isinstance(kept.get("schemas"), list):
        kept["schemas"] = [schema for schema in kept["schemas"] if schema != ENTERPRISE_USER]
    return kept


def _attribute_of(path: str, core: str) -> str | None:
    """The attribute a PATCH path starts with (None: another schema's)."""
    if path.startswith(core + ":"):
        path = path[len(core) + 1 :]
    elif path.startswith("urn:"):
        return None
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def _kept_operations(payload, kept: tuple[str, ...], core: str):
    """Operations on what Quor does not keep are dropped (an IdP maps emails, phone
    numbers, the enterprise extension... whatever the application), and a remove of
    group members listed in its value (what Entra sends) becomes one remove per member,
    as RFC 7644 §3.5.2.2 selects them with a filter."""
    if not isinstance(payload, dict) or not isinstance(payload.get("Operations"), list):
        return payload
    names = {name.lower() for name in kept}
    operations = []
    for operation in payload["Operations"]:
        path = operation.get("path") if isinstance(operation, dict) else None
        if not isinstance(path, str) or not path:
            if isinstance(operation, dict) and isinstance(operation.get("value"), dict):
                operation = {**operation, "value": _without_extension(operation["value"])}
            operations.append(operation)
            continue
        attribute = _attribute_of(path, core)
        if attribute is None or attribute.lower() not in names:
            continue
        value = operation.get("value")
        if (
            str(operation.get("op", "")).lower() == "remove"
            and path == "members"
            and isinstance(value, list)
        ):
            operations += [
                {"op": "remove", "path": _member_filter(m.get("value"))}
                for m in value
                if isinstance(m, dict)
            ]
            continue
        if (bare := LEGACY_MEMBER_FILTER.fullmatch(path)) is not None:
            operation = {**operation, "path": _member_filter(bare.group(1))}
        operations.append(operation)
    return {**payload, "Operations": operations}


LEGACY_MEMBER_FILTER = re.compile(r'members\[value eq "([0-9]{1,18})"\]')
"""A member selected by the bare key of earlier answers (connectors that stored it)."""


def _member_filter(value) -> str:
    """The filter selecting the member a value names, by its id as Quor answers it."""
    key = _key(value, USER_ID_PREFIX)
    named = scim_user_id(key) if key is not None else str(value)
    return f"members[value eq {ScimFilter.quote(named)}]"


def _apply_patch(model, resource, payload) -> None:
    if model is User:
        payload = _kept_operations(payload, (*USER_ATTRIBUTES, "externalId"), CORE_USER)
    else:
        payload = _kept_operations(payload, (*GROUP_ATTRIBUTES, "externalId"), CORE_GROUP)
    if isinstance(payload, dict) and payload.get("Operations") == []:
        return  # only attributes Quor does not keep
    patch = _parse(PatchOp[model], payload, Context.RESOURCE_PATCH_REQUEST)
    try:
        patch.patch(resource)
    except (SCIMException, ValidationError, ValueError) as exc:
        raise _invalid(exc) from None


# --- groups --------------------------------------------------------------------------------


def _groups(organization: Organization):
    return (
        OrganizationGroup.objects.filter(organization=organization)
        .select_related("group")
        .prefetch_related("group__user_set")
        .order_by("group_id")
    )


def _organization_group(organization: Organization, group_id: str) -> OrganizationGroup:
    return _by_id(_groups(organization), "group_id", group_id, "group", GROUP_ID_PREFIX)


def group_resource(organization_group: OrganizationGroup, base_url: str) -> Group:
    members = [
        GroupMember(
            value=scim_user_id(user.pk),
            ref=f"{base_url}/Users/{scim_user_id(user.pk)}",
            type="User",
        )
        for user in sorted(organization_group.group.user_set.all(), key=lambda user: user.pk)
    ]
    return Group(
        id=scim_group_id(organization_group.group_id),
        external_id=organization_group.external_id or None,
        display_name=organization_group.display_name,
        members=members or None,
        meta=Meta(
            resource_type="Group",
            created=organization_group.created_at,
            last_modified=organization_group.updated_at,
            location=f"{base_url}/Groups/{scim_group_id(organization_group.group_id)}",
        ),
    )


def groups(organization: Organization, base_url: str) -> list[Group]:
    return [group_resource(group, base_url) for group in _groups(organization)]


SEARCHED = {"Users": (User, users), "Groups": (Group, groups), "": (None, None)}


def search(organization: Organization, kind: str, parameters: dict, base_url: str) -> dict:
    """A list or a search: of the organization's users, its groups, or both ("")."""
    model, resources = SEARCHED[kind]
    request = search_request(model, parameters)
    if resources is None:
        found = users(organization, base_url) + groups(organization, base_url)
    else:
        found = resources(organization, base_url)
    return list_response(_page(found, request))


def group_get(organization: Organization, group_id: str, base_url: str) -> Group:
    return group_resource(_organization_group(organization, group_id), base_url)


def _group_name(organization: Organization, resource: Group) -> str:
    name = (resource.display_name or "").strip()
    if not name or len(name) > 120:
        raise ScimError(400, "A group needs a displayName of 1 to 120 characters.", "invalidValue")
    return name


def _member_users(organization: Organization, resource: Group) -> list:
    keys = [_key(member.value, USER_ID_PREFIX) for member in resource.members or []]
    if None in keys:
        raise ScimError(400, "Group members are users of this organization, by id.", "invalidValue")
    users = list(QuorUser.objects.filter(pk__in=keys, membership__organization=organization))
    if len(users) != len(set(keys)):
        raise ScimError(400, "Group members are users of this organization, by id.", "invalidValue")
    return users


def _group_name_taken(name: str) -> ScimError:
    return ScimError(409, f"A Django group {name!r} exists; choose another name.", "uniqueness")


def _django_group_named(name: str) -> DjangoGroup:
    try:
        with transaction.atomic():
            return DjangoGroup.objects.create(name=name[:150])
    except IntegrityError:
        raise _group_name_taken(name[:150]) from None


def _unique_name(organization: Organization, name: str, organization_group=None) -> None:
    others = OrganizationGroup.objects.filter(organization=organization, display_name=name)
    if organization_group is not None:
        others = others.exclude(pk=organization_group.pk)
    if others.exists():
        raise ScimError(409, f"A group {name!r} exists.", "uniqueness")


@transaction.atomic
def group_create(organization: Organization, payload, actor, base_url: str) -> Group:
    resource = _parse(Group, payload, Context.RESOURCE_CREATION_REQUEST)
    name = _group_name(organization, resource)
    _unique_name(organization, name)
    users = _member_users(organization, resource)
    group = _django_group_named(f"{organization.slug}: {name}")
    organization_group = OrganizationGroup.objects.create(
        organization=organization,
        group=group,
        display_name=name,
        external_id=(resource.external_id or "")[:255],
    )
    group.user_set.set(users)
    audit_record(
        "group.added",
        target=organization_group,
        organization=organization,
        actor=actor,
        changes={
            "display_name": name,
            "members": sorted(user.email for user in users),
            "via": "scim",
        },
    )
    return group_get(organization, scim_group_id(group.pk), base_url)


def _write_group(organization_group: OrganizationGroup, resource: Group, actor) -> None:
    organization = organization_group.organization
    name = _group_name(organization, resource)
    _unique_name(organization, name, organization_group)
    users = _member_users(organization, resource)
    before = {
        "display_name": organization_group.display_name,
        "external_id": organization_group.external_id,
        "members": sorted(user.email for user in organization_group.group.user_set.all()),
    }
    organization_group.display_name = name
    organization_group.external_id = (resource.external_id or "")[:255]
    organization_group.save()
    organization_group.group.name = f"{organization.slug}: {name}"[:150]
    try:
        with transaction.atomic():
            organization_group.group.save(update_fields=["name"])
    except IntegrityError:
        raise _group_name_taken(organization_group.group.name) from None
    organization_group.group.user_set.set(users)
    after = {
        "display_name": name,
        "external_id": organization_group.external_id,
        "members": sorted(user.email for user in users),
    }
    changed = field_changes(before, after)
    if changed:
        audit_record(
            "group.changed",
            target=organization_group,
            organization=organization,
            actor=actor,
            changes=changed | {"via": "scim"},
        )


@transaction.atomic
def group_replace(
    organization: Organization, group_id: str, payload, actor, base_url: str
) -> Group:
    organization_group = _organization_group(organization, group_id)
    resource = _parse(Group, payload, Context.RESOURCE_REPLACEMENT_REQUEST)
    _write_group(organization_group, resource, actor)
    return group_get(organization, group_id, base_url)


@transaction.atomic
def group_patch(organization: Organization, group_id: str, payload, actor, base_url: str) -> Group:
    organization_group = _organization_group(organization, group_id)
    resource = group_resource(organization_group, base_url)
    _apply_patch(Group, resource, payload)
    _write_group(organization_group, resource, actor)
    return group_get(organization, group_id, base_url)


@transaction.atomic
def group_delete(organization: Organization, group_id: str, actor) -> None:
    organization_group = _organization_group(organization, group_id)
    audit_record(
        "group.deleted",
        target=organization_group,
        organization=organization,
        actor=actor,
        changes={"display_name": organization_group.display_name, "via": "scim"},
    )
    organization_group.group.delete()


@dataclass(frozen=True)
class ResourceKind:
    """What the endpoints of one resource type call."""

    create: Callable
    get: Callable
    replace: Callable
    patch: Callable
    delete: Callable


RESOURCE_KINDS = {
    "Users": ResourceKind(user_create, user_get, user_replace, user_patch, user_delete),
    "Groups": ResourceKind(group_create, group_get, group_replace, group_patch, group_delete),
}
