"""Reading files: the type comes from the bytes, and a file that cannot be read fails
alone with a reason, within its time limit."""

import io
import json
import sys
import zipfile

import pytest

from knowledge import extraction
from knowledge.extraction import ExtractionFailed, detect_content_type, extract_text
from tests.knowledge.documents import docx_with, pdf_with_text


def test_the_type_comes_from_the_bytes_not_the_name():
    assert detect_content_type(pdf_with_text("x"), "notes.txt") == "pdf"
    assert detect_content_type(docx_with(["x"]), "report.pdf") == "docx"
    assert detect_content_type(b"<!DOCTYPE html><html><p>x</p></html>", "page.txt") == "html"
    assert detect_content_type(b"# Title\n\ntext", "readme.md") == "markdown"
    assert detect_content_type(b"plain words", "notes.bin") == "text"


@pytest.mark.parametrize(
    "data",
    [b"\x7fELF\x02\x01\x01\x00\x00\x00binary", b"PK\x03\x04not really a zip", b"\x00\x01\x02"],
)
def test_binary_files_and_foreign_archives_are_refused_with_a_reason(data):
    with pytest.raises(ExtractionFailed):
        detect_content_type(data, "file.docx")


def test_a_pdfs_text_is_read():
    text = extract_text(pdf_with_text("Quarterly travel policy (revised)"), "pdf")
    assert "Quarterly travel policy (revised)" in text


def test_a_word_documents_paragraphs_and_tables_are_read():
    data = docx_with(["Onboarding checklist", "Badge photo"], table=[["laptop", "monitor"]])
    text = extract_text(data, "docx")
    assert "Onboarding checklist" in text and "Badge photo" in text
    assert "laptop | monitor" in text


def test_html_text_leaves_out_scripts_and_styles():
    page = (
        b"<html><head><title>Expense rules</title><style>p{color:red}</style></head>"
        b"<body><p>Receipts within 30 days.</p><script>var secret='x'</script></body></html>"
    )
    text = extract_text(page, "html")
    assert "Expense rules" in text and "Receipts within 30 days." in text
    assert "secret" not in text and "color" not in text


def test_text_in_another_encoding_is_decoded():
    text = "Überstunden werden am Monatsende ausgezahlt, sagt die Geschäftsführung."
    assert extract_text(text.encode("latin-1"), "text") == text


def test_a_damaged_pdf_fails_with_a_reason_in_the_child_process():
    damaged = pdf_with_text("hello")[:60]
    with pytest.raises(ExtractionFailed) as failure:
        extraction.extract_text_isolated(damaged, "pdf", timeout=30)
    assert str(failure.value)


def test_a_pdf_without_text_says_it_needs_ocr():
    with pytest.raises(ExtractionFailed, match="OCR"):
        extraction.extract_text_isolated(pdf_with_text(""), "pdf", timeout=30)


def test_a_word_document_that_unpacks_to_too_much_is_refused(monkeypatch):
    monkeypatch.setattr(extraction, "MAX_DOCX_UNPACKED_BYTES", 10_000)
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"<w:document/>")
        archive.writestr("word/media/big.bin", b"\x00" * 100_000)
    with pytest.raises(ExtractionFailed, match="unpacks"):
        extract_text(data.getvalue(), "docx")


def test_a_reader_that_takes_too_long_is_stopped(monkeypatch):
    monkeypatch.setattr(extraction, "_child_argv", lambda *args: ["sleep", "30"])
    with pytest.raises(ExtractionFailed, match="longer than 1 s"):
        extraction.extract_text_isolated(b"text", "text", timeout=1)


def test_a_file_that_needs_more_memory_than_allowed_fails_alone():
    data = b"word " * 8_000_000  # 40 MB of text: several copies of it do not fit in 150 MB
    with pytest.raises(ExtractionFailed, match="memory"):
        extraction.extract_text_isolated(data, "text", timeout=60, memory_bytes=150 << 20)
    text = extraction.extract_text_isolated(data, "text", timeout=60)
    assert len(text) == extraction.MAX_TEXT_CHARS  # within the default limit, and capped


def test_the_reader_gets_none_of_the_workers_secrets(monkeypatch):
    monkeypatch.setenv("QUOR_SECRET_KEY", "a-secret-the-reader-must-not-see")
    script = "import json, os; print(json.dumps({'text': json.dumps(dict(os.environ))}))"
    monkeypatch.setattr(extraction, "_child_argv", lambda *args: [sys.executable, "-c", script])
    environment = extraction.extract_text_isolated(b"text", "text", timeout=30)
    assert "a-secret-the-reader-must-not-see" not in environment
    assert set(json.loads(environment)) <= {"PATH", "PYTHONPATH", "LANG", "LC_CTYPE"}


def test_html_blocks_keep_their_words_apart():
    text = extract_text(
        b"<ul><li>Alpha</li><li>Beta</li></ul><p>One</p><p>Two<br>Three</p>", "html"
    )
    assert text.split() == ["Alpha", "Beta", "One", "Two", "Three"]


def test_xhtml_with_an_encoding_declaration_is_read():
    page = (
        b'<?xml version="1.0" encoding="utf-8"?><html><body><p>Caf\xc3\xa9 hours</p></body></html>'
    )
    assert detect_content_type(page, "page.xhtml") == "text"
    assert "Café hours" in extract_text(page, "html")


def test_byte_order_marks_and_utf16_are_understood():
    assert detect_content_type(b"\xef\xbb\xbf<!DOCTYPE html><html></html>", "page") == "html"
    utf16 = "Gleitzeit gilt ab sofort.".encode("utf-16")
    assert extract_text(utf16, "text") == "Gleitzeit gilt ab sofort."


def test_nul_bytes_and_lone_surrogates_never_reach_the_database():
    data = b"clean start " * 1000 + b"\x00hidden nul" + "\udcff".encode("utf-8", "surrogatepass")
    text = extract_text(data, "text")
    assert "\x00" not in text
    text.encode("utf-8")  # would raise on a lone surrogate
