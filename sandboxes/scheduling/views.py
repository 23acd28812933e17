"""The scheduled tasks UI: server-rendered pages over the services of
sandboxes.scheduling.services (the same ones the API uses)."""

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.selectors import enabled_apps
from quor import selectors as quor_selectors
from quor.lib.errors import QuorError
from quor.lib.ids import is_database_id
from quor.lib.permissions import Permission, get_active_membership, page_requires
from sandboxes import selectors
from sandboxes.scheduling import services as scheduled

# The form field an error code is about, so the form shows the message beside it.
FIELD_OF_ERROR = {
    "scheduled.invalid_name": "name",
    "sessions.empty_message": "prompt",
    "sessions.message_too_long": "prompt",
    "scheduled.invalid_cron": "cron",
    "scheduled.invalid_timezone": "timezone",
    "models.unknown_model": "model",
    "access.model_not_allowed": "model",
    "sessions.unknown_skill": "skills",
    "apps.unknown_app": "apps",
    "scheduled.preapproved_not_selected": "preapproved_apps",
}


def _task_or_404(user, task_id):
    try:
        return scheduled.get_scheduled_task_for_user(user, task_id)
    except QuorError:
        raise Http404("No such scheduled task.") from None


def _choices(user) -> dict:
    """What the form offers: the models the user may use, the organization's Skills
    and enabled Apps, and the time zone names."""
    try:
        organization = get_active_membership(user).organization
    except QuorError:
        return {"models": [], "skills": [], "apps": [], "time_zones": scheduled.time_zone_names()}
    return {
        "models": quor_selectors.models_available_to(user, organization),
        "skills": selectors.skills_of(organization),
        "apps": enabled_apps(organization),
        "time_zones": scheduled.time_zone_names(),
    }


def _values_of(task) -> dict:
    return {
        "name": task.name,
        "prompt": task.prompt,
        "cron": task.cron,
        "timezone": task.timezone,
        "model": quor_selectors.make_model_id(task.model_provider_id, task.model_name),
        "skills": list(task.skills),
        "apps": [str(app.pk) for app in task.apps.all()],
        "preapproved_apps": [str(app.pk) for app in task.preapproved_apps.all()],
        "enabled": task.enabled,
    }


def _posted_values(post) -> dict:
    return {
        "name": post.get("name", ""),
        "prompt": post.get("prompt", ""),
        "cron": post.get("cron", ""),
        "timezone": post.get("timezone", "").strip(),
        "model": post.get("model", ""),
        "skills": post.getlist("skills"),
        "apps": post.getlist("apps"),
        "preapproved_apps": post.getlist("preapproved_apps"),
        "enabled": post.get("enabled") == "on",
    }


def _ids(values) -> list:
    """App ids as numbers; anything else is passed on for the service to refuse."""
    return [int(value) if is_database_id(value) else value for value in values]


def _service_fields(values) -> dict:
    return {
        **values,
        "apps": _ids(values["apps"]),
        "preapproved_apps": _ids(values["preapproved_apps"]),
    }


def _render_form(request, *, values, task=None, error=None):
    """The form; an error is shown beside its field (or above the form), and the
    submitted values are kept."""
    choices = _choices(request.user)
    errors = {}
    if error is not None:
        field = FIELD_OF_ERROR.get(error.code, "form")
        shown = {"skills": choices["skills"], "apps": choices["apps"], "model": choices["models"]}
        shown["preapproved_apps"] = choices["apps"]
        errors["form" if field in shown and not shown[field] else field] = error.message
    return render(
        request,
        "sandboxes/scheduled_form.html",
        {
            "task": task,
            "values": values,
            "errors": errors,
            "max_prompt_chars": settings.QUOR_MAX_PROMPT_CHARS,
            **choices,
        },
        status=400 if error else 200,
    )


@page_requires(Permission.SANDBOX_USE)
def task_list(request):
    tasks = list(scheduled.scheduled_tasks_with_latest_run(request.user))
    for task in tasks:
        task.last_run = task.latest_runs[0] if task.latest_runs else None
    return render(request, "sandboxes/scheduled_list.html", {"tasks": tasks})


@page_requires(Permission.SANDBOX_USE)
def task_new(request):
    if request.method != "POST":
        values = {"timezone": "UTC", "enabled": True, "skills": [], "apps": []}
        return _render_form(request, values={**values, "preapproved_apps": []})
    values = _posted_values(request.POST)
    try:
        task = scheduled.scheduled_task_create(user=request.user, **_service_fields(values))
    except QuorError as exc:
        return _render_form(request, values=values, error=exc)
    return redirect("scheduled-detail", task_id=task.pk)


@page_requires(Permission.SANDBOX_USE)
def task_edit(request, task_id):
    task = _task_or_404(request.user, task_id)
    if request.method != "POST":
        return _render_form(request, values=_values_of(task), task=task)
    values = _posted_values(request.POST)
    values.pop("enabled")  # enabling and disabling have their own button
    try:
        scheduled.scheduled_task_update(user=request.user, task=task, **_service_fields(values))
    except QuorError as exc:
        return _render_form(request, values=values, task=task, error=exc)
    return redirect("scheduled-detail", task_id=task.pk)


@page_requires(Permission.SANDBOX_USE)
def task_detail(request, task_id):
    task = _task_or_404(request.user, task_id)
    return render(
        request,
        "sandboxes/scheduled_detail.html",
        {"task": task, "runs": scheduled.runs_of(task)},
    )


@page_requires(Permission.SANDBOX_USE)
@require_POST
def task_enable(request, task_id):
    task = _task_or_404(request.user, task_id)
    try:
        enabled = request.POST.get("enabled") == "1"
        scheduled.scheduled_task_update(user=request.user, task=task, enabled=enabled)
    except QuorError as exc:
        messages.error(request, exc.message)
    return redirect("scheduled-detail", task_id=task.pk)


@page_requires(Permission.SANDBOX_USE)
@require_POST
def task_run_now(request, task_id):
    task = _task_or_404(request.user, task_id)
    try:
        run = scheduled.run_now(user=request.user, task=task)
    except QuorError as exc:
        messages.error(request, exc.message)
        return redirect("scheduled-detail", task_id=task.pk)
    return redirect("session-detail", session_id=run.session_id)


@page_requires(Permission.SANDBOX_USE)
@require_POST
def task_delete(request, task_id):
    task = _task_or_404(request.user, task_id)
    scheduled.scheduled_task_delete(user=request.user, task=task)
    return redirect("scheduled-list")
