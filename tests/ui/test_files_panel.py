"""The session page's Files panel in a real browser, on a real sandbox: folders as
folders, Quor's own entries labelled, breadcrumbs, human sizes, an empty folder said to
be empty, recently changed files marked, a folder downloaded as an archive, and a
refusal of the files API as a sentence for people.

The listing runs in the sandbox, so the panel needs one: one sandbox serves both widths
(starting one costs seconds), each width in its own browser."""

import tarfile

import pytest
from playwright.sync_api import expect

from sandboxes.library import files as library
from sandboxes.library.managed import sync_managed_area
from sandboxes.runtime import services
from tests import factories
from tests.ui.conftest import (
    VIEWPORTS,
    BrowserPages,
    assert_accessible,
    assert_fits_the_width,
)

pytestmark = [pytest.mark.browser, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

WORKSPACE = (
    "mkdir -p src/empty data && printf 'print(1)\\n' > src/hello.py"
    " && head -c 1234567 /dev/zero > data/big.bin"
    " && printf 'old notes' > old.txt && touch -d '2 hours ago' old.txt data"
    " && printf 'rules' > AGENTS.md && printf 'KEY=1' > .env"
)


@pytest.fixture
def session(owner, running_sandbox, quor_web, headless_chromium):
    library.library_file_put(user=owner, path="notes/todo.txt", content=b"buy milk")
    session = factories.make_session(owner, title="Files")
    services.session_workspace_ensure(session=session)
    sync_managed_area(session=session)
    done = services.sandbox_exec(user=owner, session=session, argv=["sh", "-c", WORKSPACE])
    assert done.exit_code == 0, done.stderr
    return session


def entry(page, name):
    return page.locator("#files li.file-entry").filter(
        has=page.locator(".file-name", has_text=name)
    )


def check_the_panel(ui, owner, session):
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    files = page.locator("#files")
    try:  # the first listing of a new sandbox's folder, on a loaded machine: seconds
        expect(files.locator(".file-entry")).to_have_count(7, timeout=20_000)
    except AssertionError:
        panel = page.locator("#files-panel").inner_text()
        raise AssertionError(
            f"the panel shows: {panel!r}; sandbox {session.sandbox}; script errors: "
            f"{ui.errors}\n{ui.network.report()}"
        ) from None
    # Folders first, as folders; Quor's runtime folder is not shown.
    names = files.locator(".file-name").all_text_contents()
    assert names == [
        "attachments/",
        "data/",
        "library/",
        "skills/",
        "src/",
        "AGENTS.md",
        "old.txt",
    ], names
    expect(files.get_by_role("button", name="src/")).to_be_visible()
    expect(entry(page, "library/")).to_contain_text("Your Library · read-only")
    expect(entry(page, "AGENTS.md")).to_contain_text("The agent's instructions · written by Quor")
    expect(entry(page, "old.txt")).to_contain_text("9 B")
    # Recently changed: by the files' times, and by what the stream reports.
    expect(entry(page, "old.txt").locator(".file-recent")).to_have_count(0)
    expect(entry(page, "library/").locator(".file-recent")).to_have_count(0)  # Quor's
    expect(entry(page, "data/").locator(".file-recent")).to_have_count(0)
    page.evaluate(
        """() => document.dispatchEvent(new CustomEvent("quor:session-event", {detail:
            {kind: "file_changed", seq: 99, payload: {path: "data/big.bin"}}}))"""
    )
    expect(entry(page, "data/").locator(".file-recent")).to_have_count(1)
    assert_accessible(page)
    assert_fits_the_width(page)
    ui.screenshot(page, "files-panel")

    files.get_by_role("button", name="data/").click()
    expect(entry(page, "big.bin")).to_contain_text("1.2 MB")
    expect(entry(page, "big.bin").locator(".file-recent")).to_have_count(1)
    crumbs = page.get_by_role("navigation", name="Folder")
    expect(crumbs.get_by_role("listitem")).to_have_text(["All files", "data"])
    expect(page.locator("#files-archive")).to_have_text("Download this folder")

    crumbs.get_by_role("button", name="All files").click()
    files.get_by_role("button", name="src/").click()
    files.get_by_role("button", name="empty/").click()
    expect(files).to_have_text("This folder is empty.")
    expect(crumbs.get_by_role("listitem")).to_have_text(["All files", "src", "empty"])
    crumbs.get_by_role("button", name="src").click()
    expect(entry(page, "hello.py")).to_contain_text("9 B")
    expect(entry(page, "hello.py").locator(".file-recent")).to_have_count(1)  # just written

    # The Library, read through its link, and said to be read-only.
    crumbs.get_by_role("button", name="All files").click()
    files.get_by_role("button", name="library/").click()
    expect(page.locator("#files-note")).to_contain_text("Your Library · read-only")
    files.get_by_role("button", name="notes/").click()
    files.get_by_role("link", name="todo.txt").click()
    expect(page.locator("#preview pre")).to_have_text("buy milk")

    # A file the conversation names (its cards' links) opens here, in its folder.
    opened_here = page.evaluate(
        """() => !document.dispatchEvent(new CustomEvent("quor:open-file",
            {detail: {path: "src/hello.py"}, cancelable: true}))"""
    )
    assert opened_here
    expect(page.locator("#preview pre")).to_have_text("print(1)")
    expect(crumbs.get_by_role("listitem")).to_have_text(["All files", "src"])
    return page


# Holds the answers to the requests whose URL ends with one of `window.held`'s keys
# until `window.release(key)`: answers then arrive in the order the test chooses.
HOLD_ANSWERS = """() => {
    const fetchNow = window.fetch;
    window.held = {};
    window.fetch = (url, options) => {
        const answer = fetchNow(url, options);
        const key = Object.keys(window.held).find((end) => String(url).endsWith(end));
        if (!key) return answer;
        return new Promise((resolve) => window.held[key].push(() => resolve(answer)));
    };
    window.release = (key) => { window.held[key].forEach((go) => go()); delete window.held[key]; };
}"""


def open_from_the_conversation(page, path):
    return page.evaluate(
        """(path) => !document.dispatchEvent(new CustomEvent("quor:open-file",
            {detail: {path}, cancelable: true}))""",
        path,
    )


def check_answers_in_order_and_files_from_the_conversation(page):
    """Only the latest listing and preview asked for are shown, whatever order the
    answers come in; a file the conversation names opens even if it is a dotfile, and
    one that is gone says so."""
    files = page.locator("#files")
    crumbs = page.get_by_role("navigation", name="Folder")
    crumbs.get_by_role("button", name="All files").click()
    expect(crumbs.get_by_role("listitem")).to_have_text(["All files"])
    page.evaluate(HOLD_ANSWERS)

    # The root's listing (a reload for a changed file) answers after src's.
    page.evaluate("() => { window.held['/files/?path='] = []; }")
    page.evaluate(
        """() => document.dispatchEvent(new CustomEvent("quor:session-event", {detail:
            {kind: "file_changed", seq: 100, payload: {path: "old.txt"}}}))"""
    )
    assert open_from_the_conversation(page, "src/hello.py")
    expect(page.locator("#preview pre")).to_have_text("print(1)")
    page.evaluate("() => window.release('/files/?path=')")
    page.wait_for_timeout(500)  # the old answer has come, and is dropped
    expect(crumbs.get_by_role("listitem")).to_have_text(["All files", "src"])
    expect(page.locator("#preview h3")).to_have_text("hello.py")

    # File A's text answers after file B was opened: only B's is shown.
    crumbs.get_by_role("button", name="All files").click()
    page.evaluate("() => { window.held['/files/content?path=old.txt'] = []; }")
    files.get_by_role("link", name="old.txt").click()
    files.get_by_role("link", name="AGENTS.md").click()
    expect(page.locator("#preview pre")).to_have_text("rules")
    page.evaluate("() => window.release('/files/content?path=old.txt')")
    page.wait_for_timeout(500)
    expect(page.locator("#preview pre")).to_have_count(1)
    expect(page.locator("#preview pre")).to_have_text("rules")

    # "Created .env": a dotfile, not listed in the panel, still opens from its card.
    assert open_from_the_conversation(page, ".env")
    expect(page.locator("#preview h3")).to_have_text(".env")
    expect(page.locator("#preview pre")).to_have_text("KEY=1")
    # A file gone since the card was written: a sentence, not nothing.
    assert open_from_the_conversation(page, "src/gone.py")
    expect(page.locator("#files-problem")).to_contain_text("This file or folder is no longer there")
    expect(crumbs.get_by_role("listitem")).to_have_text(["All files", "src"])


def check_the_archive_and_a_refusal(page, owner, session):
    page.get_by_role("navigation", name="Folder").get_by_role("button", name="All files").click()
    archive = page.get_by_role("link", name="Download all")
    with page.expect_download() as download:
        archive.click()
    assert download.value.suggested_filename == f"session-{str(session.pk)[:8]}.tar.gz"
    with tarfile.open(download.value.path(), mode="r:gz") as got:
        names = set(got.getnames())
    assert {"./src/hello.py", "./data/big.bin", "./src/empty", "./.env"} <= names
    quors_own = ("./.quor", "./library", "./skills", "./AGENTS.md")
    assert not any(name.startswith(quors_own) for name in names), names

    # A file gone since it was listed: a sentence, never the API's JSON.
    services.sandbox_exec(user=owner, session=session, argv=["rm", "old.txt"])
    page.get_by_role("link", name="old.txt").click()
    problem = page.locator("#preview .files-problem")
    expect(problem).to_contain_text("This file or folder is no longer there")
    expect(page.locator("#files-panel")).not_to_contain_text('{"error"')
    problem.get_by_text("Details").click()
    expect(problem.locator("code")).to_have_text("files.not_found")
    assert_accessible(page)


def check_a_wake_from_the_page(ui, owner, session):
    """Asleep, the panel says so; its button wakes the sandbox (by listing the folder),
    shows the wake under way, then the files."""
    services.sandbox_sleep(sandbox=session.sandbox, force=True)
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    heading = page.locator("#sandbox-state h3")
    expect(heading).to_have_text("Your sandbox is asleep")
    expect(page.locator("#files-browser")).to_be_hidden()
    page.get_by_role("button", name="Wake it up and show the files").click()
    expect(heading).to_have_text("Waking up your sandbox")
    expect(page.locator("#sandbox-progress progress")).to_be_visible()
    expect(page.locator("#files").get_by_role("button", name="src/")).to_be_visible(timeout=60_000)
    expect(page.locator("#sandbox-state")).to_be_hidden()
    expect(page.locator("#sandbox-state-label")).to_have_text("Sandbox: running")


def test_the_files_panel_is_a_file_browser_at_both_widths(owner, session, headless_chromium):
    for viewport in VIEWPORTS:
        ui = BrowserPages(headless_chromium, viewport)
        try:
            page = check_the_panel(ui, owner, session)
            if viewport == list(VIEWPORTS)[-1]:  # last: it deletes a file, sleeps
                check_answers_in_order_and_files_from_the_conversation(page)
                check_the_archive_and_a_refusal(page, owner, session)
                check_a_wake_from_the_page(ui, owner, session)
        finally:
            ui.close()
        assert not ui.errors, f"script errors on the page at {viewport}: {ui.errors}"
