"""The web app proxy's own pages (waking up, not running, not found): styled like the
rest of Quor by Quor's stylesheet from Quor's origin, under the app's sandbox CSP, with
no script or inline style, and the message escaped."""

from django.conf import settings

from webapps import headers as header_rules
from webapps import pages


def test_the_waking_page_looks_like_quor_and_keeps_the_sandbox_csp():
    headers, body = pages.page(503, "Waking <up> & soon.", refresh=3)
    page = body.decode()
    assert ("content-security-policy", header_rules.SANDBOX_CSP) in headers
    assert ("refresh", "3") in headers
    assert ("content-length", str(len(body))) in headers
    stylesheet = f'<link rel="stylesheet" href="{settings.QUOR_PUBLIC_URL.rstrip("/")}/static/'
    assert stylesheet in page
    assert "<h1>The app is waking up</h1>" in page
    assert "Waking &lt;up&gt; &amp; soon." in page
    assert "<progress" in page
    assert "<script" not in page and "<style" not in page and "style=" not in page


def test_other_answers_are_titled_by_their_status_without_a_progress_bar():
    _, body = pages.page(404, "There is no such app, or it is not shared with you.")
    page = body.decode()
    assert "<h1>App not found</h1>" in page
    assert "<progress" not in page
