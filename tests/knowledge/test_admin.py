"""Knowledge in the Django admin: an organization admin's sources and documents only,
access lists checked and applied to the chunks at once, bad input as form errors."""

from django.urls import reverse

from knowledge.models import KnowledgeDocument, KnowledgeSource
from knowledge.principals import principal
from quor.models import Membership
from tests import factories
from tests.knowledge.documents import pdf_with_text

SOURCE_ADD = reverse("admin:knowledge_knowledgesource_add")


def document_change(document):
    return reverse("admin:knowledge_knowledgedocument_change", args=[document.pk])


def test_an_organization_admin_adds_a_source_with_its_access_list_and_a_file(world, client):
    client.force_login(world.admin)
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = client.post(SOURCE_ADD, {
        "name": "Policies",
        "kind": "upload",
        "access_text": f"{principal('org', world.acme.pk)}\n{principal('group', world.legal.pk)}",
        "upload": SimpleUploadedFile("travel.pdf", pdf_with_text("Travel by train")),
    })  # fmt: skip
    assert response.status_code == 302, response.content.decode()[-2000:]
    source = KnowledgeSource.objects.get(name="Policies")
    assert source.organization == world.acme
    assert source.default_access == sorted(
        [principal("org", world.acme.pk), principal("group", world.legal.pk)]
    )
    document = source.documents.get()
    assert document.access == source.default_access and document.content_type == "pdf"


def test_a_taken_name_or_a_foreign_principal_is_a_form_error_that_saves_nothing(world, client):
    client.force_login(world.admin)
    before = KnowledgeSource.objects.count()
    taken = client.post(SOURCE_ADD, {"name": "Handbook", "access_text": ""})
    assert taken.status_code == 200 and "already a source named" in taken.content.decode()
    foreign = client.post(
        SOURCE_ADD, {"name": "New", "access_text": principal("org", world.globex.pk)}
    )
    assert (
        foreign.status_code == 200
        and "not principals of this organization" in foreign.content.decode()
    )
    assert KnowledgeSource.objects.count() == before


def test_changing_a_documents_access_in_the_admin_reaches_its_chunks(world, client):
    client.force_login(world.admin)
    document = world.documents["nobody"]
    access = principal("user", world.legal_colleague.pk)
    response = client.post(document_change(document), {"access_text": access})
    assert response.status_code == 302
    document.refresh_from_db()
    assert document.access == [access]
    assert [list(a) for a in document.chunks.values_list("access", flat=True)] == [[access]]


def test_another_organizations_admin_sees_none_of_our_sources_or_documents(world, client):
    globex_admin = factories.make_user(
        world.globex, role=Membership.Role.ADMIN, email="b@globex.test"
    )
    client.force_login(globex_admin)
    listing = client.get(reverse("admin:knowledge_knowledgedocument_changelist")).content.decode()
    assert "quokka" not in listing and ">owner<" not in listing and ">everyone<" not in listing
    assert client.get(document_change(world.documents["owner"])).status_code in (302, 404)
    response = client.post(document_change(world.documents["owner"]), {"access_text": ""})
    assert response.status_code in (302, 404)
    assert KnowledgeDocument.objects.get(pk=world.documents["owner"].pk).access == [
        principal("user", world.owner.pk)
    ]


def test_a_sources_organization_cannot_be_changed(world, client, superuser):
    client.force_login(superuser)
    url = reverse("admin:knowledge_knowledgesource_change", args=[world.handbook.pk])
    client.post(url, {"organization": world.globex.pk, "name": "Handbook", "access_text": ""})
    world.handbook.refresh_from_db()
    assert world.handbook.organization == world.acme
