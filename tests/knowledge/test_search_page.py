"""The search page: what the API finds, for the signed-in user, and nothing else."""

from django.test import Client

PAGE = "/knowledge/"


def page_for(user):
    client = Client()
    client.force_login(user)
    return client


def test_the_page_lists_readable_results_with_their_source(world):
    response = page_for(world.finance_colleague).get(PAGE, {"q": "handbook chapter"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "quokkafinance" in html and "quokkaeveryone" in html
    for hidden in ("quokkaowner", "quokkalegal", "quokkanobody", "quokkaglobex"):
        assert hidden not in html
    assert "Handbook" in html


def test_the_source_filter_offers_only_sources_with_something_to_read(world):
    from knowledge import services

    services.source_create(organization=world.acme, name="Board minutes")
    html = page_for(world.owner).get(PAGE).content.decode()
    assert "Handbook" in html and "Board minutes" not in html and "Globex wiki" not in html


def test_a_foreign_or_unknown_source_in_the_address_finds_nothing(world):
    for source in (world.globex_wiki.pk, 999999):
        html = page_for(world.owner).get(PAGE, {"q": "handbook", "source": source}).content.decode()
        assert "quokka" not in html
        assert "Nothing you may read matches." in html


def test_a_query_with_control_characters_gets_a_sentence(world):
    response = page_for(world.owner).get(PAGE, {"q": "hand\x01book"})
    assert response.status_code == 200
    assert "control characters" in response.content.decode()


def test_signed_out_visitors_are_sent_to_log_in(world):
    response = Client().get(PAGE, {"q": "handbook"})
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_an_admin_adds_a_file_on_the_page_and_it_gets_the_sources_access_list(world):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from knowledge import services
    from knowledge.models import KnowledgeDocument, KnowledgeSource
    from knowledge.principals import principal

    everyone = [principal("org", world.acme.pk)]
    KnowledgeSource.objects.filter(pk=world.handbook.pk).update(default_access=everyone)
    admin = page_for(world.admin)
    assert 'action="/knowledge/upload/"' in admin.get(PAGE).content.decode()
    upload = SimpleUploadedFile("travel.md", b"# Travel\n\nTrains over planes, quokkatrain.")
    response = admin.post("/knowledge/upload/", {"source": world.handbook.pk, "file": upload})
    assert response.status_code == 302
    assert "Added “travel” to Handbook" in admin.get(PAGE).content.decode()
    document = KnowledgeDocument.objects.get(source=world.handbook, external_id="travel.md")
    assert document.access == everyone
    services.document_index(document.pk)
    html = page_for(world.legal_colleague).get(PAGE, {"q": "quokkatrain"}).content.decode()
    assert "quokkatrain" in html


def test_only_admins_see_or_use_the_upload_form_and_only_for_their_own_sources(world):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from knowledge.models import KnowledgeDocument

    member = page_for(world.owner)
    assert "/knowledge/upload/" not in member.get(PAGE).content.decode()
    for client, source in ((member, world.handbook), (page_for(world.admin), world.globex_wiki)):
        upload = SimpleUploadedFile("sneaky.md", b"# Sneaky\n\nquokkasneaky")
        client.post("/knowledge/upload/", {"source": source.pk, "file": upload})
        assert not KnowledgeDocument.objects.filter(external_id="sneaky.md").exists()
    follow = page_for(world.admin).post("/knowledge/upload/", {"source": "x"}, follow=True)
    assert "Choose one of your sources." in follow.content.decode()
