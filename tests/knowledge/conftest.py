from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group

from knowledge import embeddings, extraction, services
from knowledge.principals import principal
from quor.models import Membership, OrganizationGroup
from tests import factories


def add_document(source, name: str, text: str, access: list[str]):
    """A document of `source`, indexed now (the task's work, in the test)."""
    document = services.document_put_content(source=source, name=name, data=text.encode())
    services.document_set_access(document, access)
    return services.document_index(document.pk)


@dataclass
class World:
    """Two organizations, their people, and one document per kind of access list. Every
    document holds the word "handbook" and a word of its own (its key)."""

    acme: object
    globex: object
    admin: object
    owner: object
    finance_colleague: object
    legal_colleague: object
    deactivated: object
    stranger: object
    finance: Group
    legal: Group
    handbook: object
    globex_wiki: object
    documents: dict


class RememberingEmbedder:
    """The process's embedder, which embeds each list of passages once: every world
    embeds the same seven documents."""

    def __init__(self, embedder, memory: dict):
        self.embedder, self.memory = embedder, memory
        self.name, self.dimensions = embedder.name, embedder.dimensions

    def embed_passages(self, texts):
        key = tuple(texts)
        if key not in self.memory:
            self.memory[key] = self.embedder.embed_passages(texts)
        return self.memory[key].copy()

    def embed_query(self, text):
        return self.embedder.embed_query(text)


@pytest.fixture(scope="session")
def embedded():
    """The world's passages and their vectors, for the whole run."""
    return {}


@pytest.fixture
def world(db, monkeypatch, embedded):
    """The documents are read in this process (about a second less per test); the
    child process that reads uploads is tested in test_extraction.py and test_api.py.
    Their passages are embedded once for the run (RememberingEmbedder)."""
    with monkeypatch.context() as inline:
        inline.setattr(
            extraction,
            "extract_text_isolated",
            lambda data, content_type, timeout: extraction.extract_text(data, content_type),
        )
        remembering = RememberingEmbedder(embeddings.get_embedder(), embedded)
        inline.setattr(embeddings, "get_embedder", lambda: remembering)
        return _make_world()


def _organization_group(organization, name: str) -> Group:
    group = Group.objects.create(name=f"{organization.slug}: {name}")
    OrganizationGroup.objects.create(organization=organization, group=group, display_name=name)
    return group


def _make_world():
    acme = factories.make_org(name="Acme", slug="acme")
    globex = factories.make_org(name="Globex", slug="globex")
    admin = factories.make_user(acme, role=Membership.Role.ADMIN, email="admin@acme.test")
    owner = factories.make_user(acme, email="owner@acme.test")
    finance_colleague = factories.make_user(acme, email="finance@acme.test")
    legal_colleague = factories.make_user(acme, email="legal@acme.test")
    deactivated = factories.make_user(acme, email="gone@acme.test")
    stranger = factories.make_user(globex, email="stranger@globex.test")
    finance = _organization_group(acme, "finance")
    legal = _organization_group(acme, "legal")
    owner.groups.add(finance)
    finance_colleague.groups.add(finance)
    legal_colleague.groups.add(legal)
    handbook = services.source_create(organization=acme, name="Handbook")
    globex_wiki = services.source_create(organization=globex, name="Globex wiki")
    access = {
        "nobody": [],
        "owner": [principal("user", owner.pk)],
        "finance": [principal("group", finance.pk)],
        "legal": [principal("group", legal.pk)],
        "everyone": [principal("org", acme.pk)],
        "deactivated": [principal("user", deactivated.pk)],
    }
    documents = {
        key: add_document(
            handbook, f"{key}.md", f"Handbook chapter for {key}. Codeword quokka{key}.", acl
        )
        for key, acl in access.items()
    }
    documents["globex"] = add_document(
        globex_wiki,
        "globex.md",
        "Handbook chapter for globex. Codeword quokkaglobex.",
        [principal("org", globex.pk)],
    )
    deactivated.is_active = False
    deactivated.save()
    return World(
        acme, globex, admin, owner, finance_colleague, legal_colleague, deactivated, stranger,
        finance, legal, handbook, globex_wiki, documents,
    )  # fmt: skip
