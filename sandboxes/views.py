"""The session UI: server-rendered pages over the same services as the API."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Max
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from apps.selectors import enabled_apps
from quor import selectors as quor_selectors
from quor.lib.errors import QuorError
from quor.lib.permissions import get_active_membership
from sandboxes import selectors
from sandboxes.models import Sandbox, Session, Skill
from sandboxes.runtime import services
from sandboxes.sessions import services as sessions
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
    return Skill.objects.filter(organization_id=membership.organization_id) if membership else []


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


@login_required
def session_list(request):
    return render(
        request,
        "sandboxes/session_list.html",
        {
            "sessions": selectors.sessions_of(request.user)[:100],
            "sandbox": Sandbox.objects.filter(user=request.user).first(),
            "models": _models_for(request.user),
            "skills": _skills_for(request.user),
            "apps": _apps_for(request.user),
        },
    )


@login_required
@require_POST
def session_new(request):
    try:
        session = sessions.session_create(
            user=request.user,
            prompt=request.POST.get("prompt", ""),
            model=request.POST.get("model", ""),
            title=request.POST.get("title", ""),
            attachments=request.FILES.getlist("attachments"),
            skills=request.POST.getlist("skills"),
            apps=_app_ids(request.POST.getlist("apps")),
        )
    except QuorError as exc:
        messages.error(request, exc.message)
        return redirect("home")
    return redirect("session-detail", session_id=session.pk)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def session_detail(request, session_id):
    """The session (owner only). A POST is the web apps' sharing switch (`sharing`)."""
    session = _session_or_404(request.user, session_id)
    if request.method == "POST":
        return _session_sharing(request, session)
    reset = (
        session.sandbox.resets.filter(created_at__gt=session.created_at)
        .order_by("created_at")
        .first()
    )
    return render(
        request,
        "sandboxes/session_detail.html",
        {
            "session": session,
            "sandbox": session.sandbox,
            "workspace_reset": reset,
            "apps": session.apps.order_by("name"),
            "webapps": [webapp_payload(webapp) for webapp in session.webapps.all()],
            # Events up to here are on the page already (web apps: no second load).
            "last_seq": session.events.aggregate(last=Max("seq"))["last"] or 0,
            "sharing_choices": Session.Sharing.choices,
        },
    )


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


@login_required
@require_POST
def session_follow_up(request, session_id):
    session = _session_or_404(request.user, session_id)
    try:
        text = request.POST.get("text", "")
        sessions.session_message(user=request.user, session=session, text=text)
    except QuorError as exc:
        messages.error(request, exc.message)
    return redirect("session-detail", session_id=session.pk)


@login_required
@require_POST
def session_cancel(request, session_id):
    session = _session_or_404(request.user, session_id)
    try:
        sessions.session_cancel(user=request.user, session=session)
    except QuorError as exc:
        messages.error(request, exc.message)
    return redirect("session-detail", session_id=session.pk)


@login_required
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
