"""The session UI: server-rendered pages over the same services as the API."""

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_http_methods, require_POST

from apps.selectors import enabled_apps
from quor import selectors as quor_selectors
from quor.filestore import blob_chunks
from quor.lib.errors import QuorError
from quor.lib.permissions import Permission, get_active_membership, page_requires
from quor.lib.streaming import StreamedResponse
from sandboxes import selectors
from sandboxes.models import Session
from sandboxes.runtime import services
from sandboxes.scheduling import views as scheduled_views
from sandboxes.sessions import services as sessions
from sandboxes.terminal import selectors as terminal_selectors
from webapps import selectors as webapp_selectors
from webapps import services as webapp_services
from webapps.services import session_set_sharing, webapp_payload


def _models_for(user):
    try:
        membership = get_active_membership(user)
    except QuorError:
        return []
    return quor_selectors.models_available_to(user, membership.organization)


def _session_or_404(user, session_id):
    try:
        return services.session_in_use(user, session_id)
    except QuorError:
        raise Http404("No such session.") from None


def _skills_for(user):
    membership = getattr(user, "membership", None)
    return selectors.skills_of(membership.organization_id) if membership else []


def _apps_for(user):
    """The organization's enabled Apps, which a new session may select."""
    membership = getattr(user, "membership", None)
    return enabled_apps(membership.organization) if membership else []


def _app_ids(values):
    """The form's App ids as numbers; anything else is passed on for the service to refuse."""
    ids = []
    for value in values:
        try:
            ids.append(int(value))
        except ValueError:
            ids.append(value)
    return ids


# The new-session form's field an error code is about, so the form shows the message
# beside it; other errors are shown above the form.
FIELD_OF_ERROR = {
    **scheduled_views.FIELD_OF_ERROR,
    "sessions.too_many_attachments": "attachments",
    "sessions.attachment_too_large": "attachments",
    "sessions.bad_attachment": "attachments",
}


def _new_session_form(request, *, values=None, error=None):
    """The session list with the new-session form; after an error, the submitted values
    are kept and the message is shown beside its field."""
    query = request.GET.get("q", "").strip()
    choices = {
        "models": _models_for(request.user),
        "skills": list(_skills_for(request.user)),
        "apps": list(_apps_for(request.user)),
    }
    errors = {}
    if error is not None:
        field = FIELD_OF_ERROR.get(error.code, "form")
        offered = {"model": choices["models"], "skills": choices["skills"], "apps": choices["apps"]}
        if field in offered and not offered[field]:  # nothing left to show it beside
            field = "form"
        errors[field] = error.message
    return render(
        request,
        "sandboxes/session_list.html",
        {
            "sessions": sessions.sessions_matching(request.user, query)[:100],
            "query": query,
            "list_url": reverse("home") + (f"?{urlencode({'q': query})}" if query else ""),
            "sandbox": selectors.sandbox_of(request.user),
            **choices,
            "values": values or {"skills": [], "apps": []},
            "errors": errors,
            "limits": {
                "prompt_chars": settings.QUOR_MAX_PROMPT_CHARS,
                "attachments": settings.QUOR_MAX_ATTACHMENTS,
                "attachment_bytes": settings.QUOR_MAX_ATTACHMENT_BYTES,
                "upload_bytes": settings.QUOR_MAX_UPLOAD_BYTES,
            },
        },
        status=400 if error else 200,
    )


@page_requires(Permission.ACCOUNT)
def session_list(request):
    """The user's sessions (`q`: those whose title or messages contain it) and the form
    that starts a new one."""
    return _new_session_form(request)


@page_requires(Permission.SANDBOX_USE)
@require_POST
def session_new(request):
    values = {
        "prompt": request.POST.get("prompt", ""),
        "model": request.POST.get("model", ""),
        "title": request.POST.get("title", ""),
        "skills": request.POST.getlist("skills"),
        "apps": request.POST.getlist("apps"),
    }
    attachments = request.FILES.getlist("attachments")
    try:
        session = sessions.session_create(
            user=request.user,
            attachments=attachments,
            **{**values, "apps": _app_ids(values["apps"])},
        )
    except QuorError as exc:
        # A browser cannot be given files back: the form asks for them again.
        values["attachments"] = [upload.name for upload in attachments]
        return _new_session_form(request, values=values, error=exc)
    return redirect("session-detail", session_id=session.pk)


@page_requires(Permission.SANDBOX_USE)
@require_http_methods(["GET", "HEAD", "POST"])
def session_detail(request, session_id):
    """The session (owner only). A POST is the web apps' sharing switch (`sharing`)."""
    session = _session_or_404(request.user, session_id)
    if request.method == "POST":
        return _session_sharing(request, session)
    return _session_page(request, session)


def _session_page(request, session, *, follow_up=None, status=200):
    """The session page; `follow_up` is a refused follow-up (its `text` and `error`),
    shown again in the form."""
    return render(
        request,
        "sandboxes/session_detail.html",
        {
            "session": session,
            "sandbox": session.sandbox,
            "workspace_reset": selectors.workspace_reset_after(session),
            "apps": selectors.session_apps(session),
            "webapps": [webapp_payload(webapp) for webapp in webapp_selectors.webapps_of(session)],
            # Events up to here are on the page already (web apps: no second load).
            "last_seq": selectors.last_event_seq(session),
            "sharing_choices": Session.Sharing.choices,
            "follow_up": follow_up or {"text": "", "error": ""},
            "max_prompt_chars": settings.QUOR_MAX_PROMPT_CHARS,
            "public_links_allowed": _public_links_allowed(request.user, session),
            "public_links": [
                webapp_services.public_link_payload(link)
                for link in webapp_selectors.public_links_of(session)
            ],
            "public_link_max_days": settings.QUOR_PUBLIC_LINK_MAX_DAYS,
            "email_links_possible": bool(settings.EMAIL_HOST),
            "terminal_recordings": terminal_selectors.session_recordings(session),
            "terminal_retention_days": settings.QUOR_TERMINAL_RECORDING_RETENTION_DAYS,
        },
        status=status,
    )


def _public_links_allowed(user, session) -> bool:
    organization = user.membership.organization
    return organization.allow_public_links and not session.confidential


@page_requires(Permission.SANDBOX_USE)
@require_POST
def session_public_link_create(request, session_id):
    """The session page's form: a link for one of its web apps, for `days` days, with a
    password or email domains (separated by commas or spaces) if given."""
    session = _session_or_404(request.user, session_id)
    password = request.POST.get("password", "")
    email_domains = request.POST.get("email_domains", "").lower().replace(",", " ").split()
    days = request.POST.get("days", "")
    days = (
        int(days) if days.isascii() and days.isdigit() and len(days) <= 4 else 0
    )  # else refused as no expiry
    try:
        link = webapp_services.public_link_create(
            user=request.user,
            session=session,
            webapp_id=request.POST.get("webapp", ""),
            expires_at=timezone.now() + timedelta(days=days),
            visitor_auth="email" if email_domains else "password" if password else "none",
            password=password,
            email_domains=email_domains,
        )
    except QuorError as exc:
        messages.error(request, exc.message)
    else:
        url = webapp_services.public_link_payload(link)["url"]
        messages.success(request, f"Public link made: {url}")
    return redirect("session-detail", session_id=session.pk)


@page_requires(Permission.SANDBOX_USE)
@require_POST
def session_public_link_revoke(request, session_id, link_id):
    session = _session_or_404(request.user, session_id)
    try:
        link = webapp_selectors.get_public_link_for_owner(request.user, link_id)
    except QuorError:
        raise Http404("No such public link.") from None
    if link.webapp.session_id != session.pk:
        raise Http404("No such public link.")
    webapp_services.public_link_revoke(user=request.user, link=link)
    messages.success(request, "Public link revoked: it no longer opens the app.")
    return redirect("session-detail", session_id=session.pk)


def _session_sharing(request, session):
    try:
        session_set_sharing(
            user=request.user, session=session, sharing=request.POST.get("sharing", "")
        )
    except QuorError as exc:
        messages.error(request, exc.message)
    else:
        label = Session.Sharing(session.sharing).label
        messages.success(request, f"Web apps of this session: {label}.")
    return redirect("session-detail", session_id=session.pk)


@page_requires(Permission.SANDBOX_USE)
@require_POST
def session_follow_up(request, session_id):
    session = _session_or_404(request.user, session_id)
    text = request.POST.get("text", "")
    try:
        sessions.session_message(user=request.user, session=session, text=text)
    except QuorError as exc:
        follow_up = {"text": text, "error": exc.message}
        return _session_page(request, session, follow_up=follow_up, status=400)
    return redirect("session-detail", session_id=session.pk)


@page_requires(Permission.SANDBOX_USE)
@require_http_methods(["GET", "HEAD", "POST"])
def session_rename(request, session_id):
    session = _session_or_404(request.user, session_id)
    title, error = session.title, ""
    if request.method == "POST":
        title = request.POST.get("title", "")
        try:
            sessions.session_rename(user=request.user, session=session, title=title)
        except QuorError as exc:
            error = exc.message
        else:
            messages.success(request, "Session renamed.")
            return redirect(_back_to_list(request))
    return render(
        request,
        "sandboxes/session_rename.html",
        {"session": session, "title": title, "error": error, "next": _back_to_list(request)},
        status=400 if error else 200,
    )


@page_requires(Permission.SANDBOX_USE)
@require_http_methods(["GET", "HEAD", "POST"])
def session_delete(request, session_id):
    """A page that asks for confirmation; its POST deletes the session."""
    session = _session_or_404(request.user, session_id)
    error = ""
    if request.method == "POST":
        try:
            sessions.session_delete(user=request.user, session=session)
        except QuorError as exc:
            error = exc.message
        else:
            messages.success(request, f"Deleted “{session}”.")
            return redirect(_back_to_list(request))
    return render(
        request,
        "sandboxes/session_delete.html",
        {"session": session, "error": error, "next": _back_to_list(request)},
        status=409 if error else 200,
    )


def _back_to_list(request) -> str:
    """Where rename and delete return: the session list as it was (its search), by `next`."""
    back = request.POST.get("next") or request.GET.get("next", "")
    if back.startswith("/") and url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}
    ):
        return back
    return reverse("home")


@page_requires(Permission.SANDBOX_USE)
@require_POST
def session_cancel(request, session_id):
    session = _session_or_404(request.user, session_id)
    try:
        sessions.session_cancel(user=request.user, session=session)
    except QuorError as exc:
        messages.error(request, exc.message)
    return redirect("session-detail", session_id=session.pk)


@page_requires(Permission.SANDBOX_USE)
@require_POST
def sandbox_start_empty(request):
    """The notice's button: only for a workspace that cannot be restored, and only
    with the box ticked."""
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = reverse("home")
    if request.POST.get("confirm") != "yes":
        messages.error(request, "Tick the box to confirm that your earlier files are gone.")
        return redirect(back)
    try:
        services.sandbox_start_empty(
            sandbox=selectors.get_sandbox_for_user(request.user), actor=request.user, via="page"
        )
    except QuorError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Your sandbox starts with an empty workspace.")
    return redirect(back)


def _asciicast_response(recording):
    response = StreamedResponse(blob_chunks(recording.cast), content_type="application/x-asciicast")
    response["Content-Disposition"] = (
        f'attachment; filename="terminal-{recording.started_at:%Y%m%d-%H%M%S}-{recording.pk}.cast"'
    )
    response["Content-Length"] = str(recording.cast.size)
    return response


@page_requires(Permission.SANDBOX_USE)
def session_terminal_recording(request, session_id, recording_id):
    """A recording of the session's terminal, to its owner (the page replays it)."""
    try:
        recording = terminal_selectors.get_recording_for_owner(
            request.user, session_id, recording_id
        )
    except QuorError:
        raise Http404("No such terminal recording.") from None
    return _asciicast_response(recording)


@page_requires(Permission.AUDIT_VIEW)
def terminal_recording_audit(request, recording_id):
    """Any recording of the organization's terminals, to those who read its audit log
    (linked from the admin's list of recordings)."""
    try:
        recording = terminal_selectors.get_recording_for_auditor(request.user, recording_id)
    except QuorError:
        raise Http404("No such terminal recording.") from None
    return _asciicast_response(recording)
