"""Managing knowledge through the API, and bad input: a clear 4xx that changes nothing."""

import pytest

from knowledge.models import KnowledgeDocument, KnowledgeSource
from knowledge.principals import principal
from tests.knowledge.documents import docx_with, pdf_with_text

SEARCH = "/api/v1/knowledge/search"


def upload(client, source, name, data, **fields):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post(
        f"/api/v1/knowledge/sources/{source.pk}/documents/",
        {"file": SimpleUploadedFile(name, data), **fields},
        format="multipart",
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x" * 1001}, "query"),
        ({}, "query"),
        ({"query": ["handbook"]}, "query"),
        ({"query": "ok\x00"}, None),
        ({"query": "\u200b\ufeff"}, None),  # characters, but no word to look for
        ({"query": "ok", "limit": 0}, "limit"),
        ({"query": "ok", "limit": 51}, "limit"),
        ({"query": "ok", "sources": "Handbook"}, "sources"),
        ({"query": "ok", "sources": [0]}, "sources"),
        ({"query": "ok", "types": ["exe"]}, "types"),
    ],
)
def test_a_malformed_search_is_a_400_that_names_the_problem(world, client_for, body, field):
    response = client_for(world.owner).post(SEARCH, body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["message"]
    if field:
        assert field in (error.get("fields") or {})


def test_a_body_that_is_not_json_is_a_400(world, client_for):
    response = client_for(world.owner).post(
        SEARCH, b"\xff\xfe{not json", content_type="application/json"
    )
    assert response.status_code == 400


def test_websearch_syntax_is_accepted_and_never_an_error(world, client_for):
    client = client_for(world.owner)
    for query in ['"chapter for owner"', "handbook -everyone", "quokkaowner or quokkafinance",
                  "&&& ||| !!! ((", "'", ":*"]:  # fmt: skip
        response = client.post(SEARCH, {"query": query}, format="json")
        assert response.status_code == 200, (query, response.content)
    titles = {
        r["title"]
        for r in client.post(SEARCH, {"query": "handbook -everyone"}, format="json").json()[
            "results"
        ]
    }
    assert titles == {"owner", "finance"}


def test_an_admin_uploads_every_supported_type_and_each_is_found(world, client_for):
    client = client_for(world.admin)
    source = KnowledgeSource.objects.create(
        organization=world.acme, name="Policies", default_access=[principal("org", world.acme.pk)]
    )
    files = {
        "travel.pdf": pdf_with_text("Travel policy: economy class for flights under six hours"),
        "onboarding.docx": docx_with(["Onboarding: collect the badge from reception"]),
        "expenses.html": b"<html><body><p>Expenses: submit receipts monthly</p></body></html>",
        "security.md": b"# Security\n\nRotate the vault passphrase quarterly.",
        "lunch.txt": b"Lunch is served in the atrium from noon.",
    }
    for name, data in files.items():
        response = upload(client, source, name, data)
        assert response.status_code == 201, response.content
        from knowledge import services

        services.document_index(response.json()["id"])
    member = client_for(world.owner)
    for query, title in [("economy flights", "travel"), ("badge reception", "onboarding"),
                         ("receipts monthly", "expenses"), ("vault passphrase", "security"),
                         ("atrium", "lunch")]:  # fmt: skip
        results = member.post(SEARCH, {"query": query}, format="json").json()["results"]
        assert [r["title"] for r in results] == [title]
    types = member.post(SEARCH, {"query": "policy OR badge", "types": ["pdf"]}, format="json")
    assert [r["type"] for r in types.json()["results"]] == ["pdf"]


@pytest.mark.parametrize(
    ("name", "data", "status", "code"),
    [
        ("empty.txt", b"", 400, None),
        ("program.bin", b"\x7fELF\x02\x01\x01\x00\x00\x00\x00", 400, "knowledge.unsupported_file"),
        ("fake.docx", b"PK\x03\x04garbage", 400, "knowledge.unsupported_file"),
    ],
)
def test_a_file_that_cannot_be_indexed_is_refused_and_nothing_is_recorded(
    world, client_for, name, data, status, code
):
    before = KnowledgeDocument.objects.count()
    response = upload(client_for(world.admin), world.handbook, name, data)
    assert response.status_code == status, response.content
    if code:
        assert response.json()["error"]["code"] == code
    assert KnowledgeDocument.objects.count() == before


def test_a_file_over_the_size_limit_is_a_413(world, client_for, settings):
    settings.QUOR_KNOWLEDGE_MAX_FILE_BYTES = 100
    before = KnowledgeDocument.objects.count()
    response = upload(client_for(world.admin), world.handbook, "big.txt", b"word " * 100)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "knowledge.file_too_large"
    assert KnowledgeDocument.objects.count() == before


def test_a_damaged_pdf_is_recorded_with_its_reason_and_the_others_still_index(world, client_for):
    from knowledge import services

    client = client_for(world.admin)
    broken = upload(client, world.handbook, "broken.pdf", pdf_with_text("hello")[:80]).json()
    fine = upload(client, world.handbook, "fine.txt", b"Handbook addendum quokkafine").json()
    assert services.document_index(broken["id"]) is None
    assert services.document_index(fine["id"]) is not None
    document = KnowledgeDocument.objects.get(pk=broken["id"])
    assert document.state == KnowledgeDocument.State.FAILED and document.error


def test_a_file_with_no_words_is_recorded_as_failed_not_crashed(world):
    from knowledge import services

    wordless = services.document_put_content(
        source=world.handbook, name="blank.txt", data="\u200b\u200b".encode(), title="\u200b"
    )
    assert services.document_index(wordless.pk) is None
    wordless.refresh_from_db()
    assert (wordless.state, wordless.error) == (
        KnowledgeDocument.State.FAILED,
        "The file has no words to index.",
    )
    assert not wordless.chunks.exists()


def test_indexing_twice_changes_nothing(world):
    from knowledge import services

    document = world.documents["everyone"]
    chunk_ids = list(document.chunks.values_list("pk", flat=True))
    services.document_index(document.pk)
    assert list(document.chunks.values_list("pk", flat=True)) == chunk_ids


def test_members_cannot_manage_knowledge(world, client_for):
    client = client_for(world.owner)
    document = world.documents["owner"]
    assert (
        client.post("/api/v1/knowledge/sources/", {"name": "Mine"}, format="json").status_code
        == 403
    )
    assert upload(client, world.handbook, "a.txt", b"text").status_code == 403
    response = client.put(
        f"/api/v1/knowledge/documents/{document.pk}/access", {"access": []}, format="json"
    )
    assert response.status_code == 403
    document.refresh_from_db()
    assert document.access == [principal("user", world.owner.pk)]


def test_another_organizations_admin_gets_a_404_for_our_documents(world, client_for):
    from quor.models import Membership
    from tests import factories

    globex_admin = factories.make_user(
        world.globex, role=Membership.Role.ADMIN, email="a@globex.test"
    )
    client = client_for(globex_admin)
    document = world.documents["everyone"]
    assert client.get(f"/api/v1/knowledge/documents/{document.pk}/").status_code == 404
    response = client.put(
        f"/api/v1/knowledge/documents/{document.pk}/access",
        {"access": [principal("org", world.globex.pk)]},
        format="json",
    )
    assert response.status_code == 404
    assert upload(client, world.handbook, "x.txt", b"text").status_code == 404


@pytest.mark.parametrize(
    "access",
    [["everyone"], ["user:abc"], ["org:{globex}"], ["user:{stranger}"], ["group:999999"], "org:1"],
)
def test_an_access_list_naming_anything_outside_the_organization_is_refused(
    world, client_for, access
):
    document = world.documents["owner"]
    if isinstance(access, list):
        access = [a.format(globex=world.globex.pk, stranger=world.stranger.pk) for a in access]
    response = client_for(world.admin).put(
        f"/api/v1/knowledge/documents/{document.pk}/access", {"access": access}, format="json"
    )
    assert response.status_code == 400
    document.refresh_from_db()
    assert document.access == [principal("user", world.owner.pk)]
    assert {tuple(a) for a in document.chunks.values_list("access", flat=True)} == {
        (principal("user", world.owner.pk),)
    }


def test_another_organizations_group_reads_as_one_that_does_not_exist(world, client_for):
    """An access list's answer never depends on another organization's groups."""
    from django.contrib.auth.models import Group

    from quor.models import OrganizationGroup

    theirs = OrganizationGroup.objects.create(
        organization=world.globex,
        group=Group.objects.create(name="globex: Board"),
        display_name="Board",
    ).group_id
    unknown = theirs + 1000
    document = world.documents["owner"]
    client = client_for(world.admin)

    def answer(group_id):
        response = client.put(
            f"/api/v1/knowledge/documents/{document.pk}/access",
            {"access": [principal("group", group_id)]},
            format="json",
        )
        return response.status_code, response.content.decode().replace(str(group_id), "N")

    assert answer(theirs) == answer(unknown)
    assert answer(theirs)[0] == 400
    document.refresh_from_db()
    assert document.access == [principal("user", world.owner.pk)]


def test_an_admin_changes_an_access_list_and_the_chunks_follow(world, client_for):
    document = world.documents["nobody"]
    access = [principal("group", world.legal.pk), principal("user", world.owner.pk)]
    response = client_for(world.admin).put(
        f"/api/v1/knowledge/documents/{document.pk}/access", {"access": access}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["access"] == sorted(access)
    assert {tuple(a) for a in document.chunks.values_list("access", flat=True)} == {
        tuple(sorted(access))
    }


def test_a_stuck_document_is_sent_again_once_per_period_not_at_every_run(world, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from knowledge import services

    sent = []
    monkeypatch.setattr(services, "send_on_commit", lambda task, *args: sent.append(args))
    document = world.documents["owner"]
    KnowledgeDocument.objects.filter(pk=document.pk).update(
        state=KnowledgeDocument.State.PENDING, updated_at=timezone.now() - timedelta(minutes=11)
    )
    assert services.documents_requeue_stuck() == [document.pk]
    assert services.documents_requeue_stuck() == []
    assert sent == [(str(document.pk),)]
