"""The catalog is data: every file is checked when loaded, and a broken one is a clear
error that names the file."""

import pytest

from apps import policy
from apps.catalog import CatalogError, load_catalog, parse_catalog_file, read_catalog

VALID = """
name = "Example"
description = "An example."
url_patterns = ["https://api.example.com"]
credential_style = "bearer"
agent_env = "EXAMPLE_TOKEN"

[[actions]]
key = "read_things"
name = "Read things"
methods = ["GET"]
paths = ["/things/{id}", "/things/**"]
default_policy = "auto"

[[actions]]
key = "delete_things"
name = "Delete things"
methods = ["DELETE"]
paths = ["/things/{id}"]
default_policy = "deny"
"""


def write(tmp_path, text, name="example.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_built_in_catalog_has_github_slack_jira_and_notion():
    catalog = load_catalog()
    assert set(catalog) == {"github", "slack", "jira", "notion"}
    assert catalog["github"].agent_env == "GH_TOKEN"
    assert catalog["slack"].url_patterns == ("https://slack.com/api",)
    assert catalog["jira"].credential_style == "basic"
    assert catalog["notion"].credential_style == "bearer"


def test_the_catalog_is_loaded_once_and_cannot_be_changed_by_callers():
    assert load_catalog() is load_catalog()
    with pytest.raises(TypeError):
        load_catalog()["evil"] = None


def test_every_built_in_app_has_reads_on_auto_and_something_it_denies_or_asks():
    for app in load_catalog().values():
        policies = {action.default_policy for action in app.actions}
        assert policy.AUTO in policies, app.key
        assert policies & {policy.ASK, policy.DENY}, app.key


def test_a_valid_file_becomes_a_catalog_app_keyed_by_its_file_name(tmp_path):
    app = parse_catalog_file(write(tmp_path, VALID))
    assert app.key == "example"
    assert app.action("delete_things").default_policy == "deny"
    assert app.action("read_things").methods == ("GET",)
    assert app.action("missing") is None


def test_read_catalog_reads_every_toml_file_of_a_directory(tmp_path):
    write(tmp_path, VALID, "one.toml")
    write(tmp_path, VALID.replace('"Example"', '"Another"'), "two.toml")
    write(tmp_path, "not toml", "notes.txt")
    assert list(read_catalog(tmp_path)) == ["two", "one"]  # sorted by name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("[[actions]]", "[[actions]\n"), "not valid TOML"),
        (('agent_env = "EXAMPLE_TOKEN"', 'agent_env = "EXAMPLE_TOKEN"\ncolour = "red"'),
         "unknown field(s) colour"),
        (('name = "Example"\n', ""), "name is required"),
        (('"https://api.example.com"', '"ftp://api.example.com"'), "https:// or http://"),
        (('"https://api.example.com"', '"https://api.example.com/v1/*"'), "plain prefix"),
        (('credential_style = "bearer"', 'credential_style = "cookie"'), "credential_style"),
        (('credential_style = "bearer"', 'credential_style = "header"'), "credential_header"),
        (('agent_env = "EXAMPLE_TOKEN"', 'agent_env = "example token"'), "agent_env"),
        (('"/things/{id}", "/things/**"', '"/things/**/more"'), "only at the end"),
        (('"/things/{id}", "/things/**"', '"things"'), "starts with /"),
        (('paths = ["/things/{id}"]', "paths = []"), "at least one path"),
        (('default_policy = "deny"', 'default_policy = "maybe"'), "unknown policy"),
        (('methods = ["DELETE"]', 'methods = ["delete"]'), "upper-case"),
        (('key = "delete_things"', 'key = "read_things"'), "duplicate action key(s) read_things"),
        (('key = "delete_things"', 'key = "Delete Things"'), "lowercase letters"),
        (('methods = ["GET"]', 'methods = "GET"'), "methods must be a list"),
    ],
)  # fmt: skip
def test_a_broken_catalog_file_is_an_error_naming_the_file_and_the_problem(
    tmp_path, change, message
):
    old, new = change
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new, 1), "broken.toml")
    with pytest.raises(CatalogError) as error:
        read_catalog(tmp_path)
    assert str(error.value).startswith("apps/catalog/broken.toml")
    assert message in str(error.value)
    assert path.exists()


def test_a_file_name_that_is_not_a_key_is_refused(tmp_path):
    with pytest.raises(CatalogError, match="file name"):
        parse_catalog_file(write(tmp_path, VALID, "My App.toml"))
