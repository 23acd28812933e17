"""The search page: the same search as the API, as the signed-in user; organization
admins also add files there."""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from knowledge import selectors, services
from knowledge.extraction import CONTENT_TYPES
from knowledge.search import search_for_user, sources_readable_by
from quor.lib.errors import InvalidInput, QuorError
from quor.lib.ids import is_database_id
from quor.lib.permissions import Permission, page_requires, require_permission

TYPE_LABELS = {"pdf": "PDF", "docx": "Word", "html": "HTML", "markdown": "Markdown", "text": "Text"}


@page_requires(Permission.KNOWLEDGE_SEARCH)
def knowledge_search(request):
    query = request.GET.get("q", "")
    source = request.GET.get("source", "")
    content_type = request.GET.get("type", "")
    context = {
        "query": query,
        "source": source,
        "type": content_type,
        "sources": sources_readable_by(request.user),
        "types": [(value, TYPE_LABELS[value]) for value in CONTENT_TYPES],
        "results": None,
        "upload_sources": _upload_sources(request.user),
    }
    if query.strip():
        try:
            context["results"] = search_for_user(
                request.user,
                query,
                source_ids=[int(source)] if is_database_id(source) else None,
                content_types=[content_type] if content_type in CONTENT_TYPES else None,
                limit=20,
            )
        except QuorError as error:
            context["error"] = error.message
    return render(request, "knowledge/search.html", context)


def _upload_sources(user):
    """An organization admin's upload sources, for the page's upload form; None for
    everyone else (the form is not shown)."""
    try:
        membership = require_permission(user, Permission.ORGANIZATION_MANAGE)
    except QuorError:
        return None
    return selectors.upload_sources_of(membership.organization_id)


@page_requires(Permission.ORGANIZATION_MANAGE)
@require_POST
def knowledge_upload(request):
    try:
        membership = require_permission(request.user, Permission.ORGANIZATION_MANAGE)
        source_id = request.POST.get("source", "")
        source = None
        if is_database_id(source_id):
            source = selectors.source_of(membership.organization, int(source_id))
        if source is None:
            raise InvalidInput("Choose one of your sources.", code="knowledge.invalid_source")
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidInput("Choose a file to add.", code="knowledge.invalid_file")
        document = services.document_upload(source=source, upload=upload)
    except QuorError as error:
        messages.error(request, error.message)
    else:
        messages.success(
            request, f"Added “{document.title}” to {source.name}: it is searchable once indexed."
        )
    return redirect("knowledge-search")
