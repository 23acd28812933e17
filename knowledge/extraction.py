"""Text out of the files people index: PDF, DOCX, HTML, Markdown and plain text.

The type comes from the bytes, never from the client's name or MIME type alone (the
name only tells Markdown from plain text). Parsing runs in a child process
(`python -m knowledge.extraction`) with a time limit and a memory limit, so a file
that makes a parser spin or blow up fails alone, with the reason recorded."""

import codecs
import io
import json
import os
import re
import resource
import subprocess
import sys
import zipfile

PDF = "pdf"
DOCX = "docx"
HTML = "html"
MARKDOWN = "markdown"
TEXT = "text"
CONTENT_TYPES = (PDF, DOCX, HTML, MARKDOWN, TEXT)

MAX_DOCX_UNPACKED_BYTES = 200 << 20  # a zip bomb stops here
MAX_TEXT_CHARS = 2_000_000  # about 2000 passages; the rest of a longer text is left out
CHILD_MEMORY_BYTES = 1 << 30
# Elements after which text continues on a new line (lxml's text_content() joins them).
HTML_BLOCKS = {
    "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "figcaption",
    "footer", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav", "ol",
    "p", "pre", "section", "table", "td", "th", "title", "tr", "ul",
}  # fmt: skip
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")


class ExtractionFailed(Exception):
    """The file cannot be read; the message says why, for people."""


def detect_content_type(data: bytes, filename: str) -> str:
    name = filename.lower()
    if data.startswith(b"%PDF-"):
        return PDF
    if data.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                if "word/document.xml" in archive.namelist():
                    return DOCX
        except zipfile.BadZipFile:
            pass
        raise ExtractionFailed("This archive is not a Word document (.docx).")
    text = _decode(data)
    head = text[:1000].lstrip().lower()
    if name.endswith((".html", ".htm")) or head.startswith(("<!doctype html", "<html")):
        return HTML
    if name.endswith((".md", ".markdown")):
        return MARKDOWN
    return TEXT


def _decode(data: bytes) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise ExtractionFailed("The UTF-16 text is damaged.") from None
    if b"\x00" in data[:8192]:
        raise ExtractionFailed("This is a binary file, not a document Quor can read.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None:
        raise ExtractionFailed("The text's encoding could not be recognised.")
    return str(best)


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractionFailed("The PDF is protected by a password.")
        text = "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except PdfReadError as error:
        raise ExtractionFailed(f"The PDF is damaged: {error}") from None
    if not text.strip():
        raise ExtractionFailed("The PDF has no text (a scan needs OCR, which Quor does not do).")
    return text


def _docx_text(data: bytes) -> str:
    import docx

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        if sum(info.file_size for info in archive.infolist()) > MAX_DOCX_UNPACKED_BYTES:
            raise ExtractionFailed("The Word document unpacks to more than 200 MB.")
    document = docx.Document(io.BytesIO(data))
    parts = [paragraph.text for paragraph in document.paragraphs]
    for table in document.tables:
        parts.extend(" | ".join(cell.text for cell in row.cells) for row in table.rows)
    return "\n\n".join(parts)


def _html_text(data: bytes) -> str:
    from lxml import etree, html

    parser = html.HTMLParser(remove_comments=True, no_network=True)
    try:
        root = html.document_fromstring(_XML_DECLARATION.sub("", _decode(data)), parser=parser)
    except (etree.ParserError, ValueError) as error:
        raise ExtractionFailed(f"The HTML cannot be parsed: {error}") from None
    for element in root.xpath("//script | //style | //noscript | //template"):
        element.drop_tree()
    for element in root.iter(*HTML_BLOCKS):
        element.tail = "\n" + (element.tail or "")
    title = root.findtext(".//title") or ""
    body = root.find("body")
    text = (body if body is not None else root).text_content()
    return f"{title}\n{text}" if title else text


def extract_text(data: bytes, content_type: str) -> str:
    """The text of `data`, in this process (the child runs this)."""
    if content_type == PDF:
        text = _pdf_text(data)
    elif content_type == DOCX:
        text = _docx_text(data)
    elif content_type == HTML:
        text = _html_text(data)
    elif content_type in (MARKDOWN, TEXT):
        text = _decode(data)
    else:
        raise ExtractionFailed(f"Unknown content type {content_type!r}.")
    # PostgreSQL text holds neither NUL nor lone surrogates.
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    text = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").splitlines())
    return text[:MAX_TEXT_CHARS]


def _child_argv(content_type: str, memory_bytes: int) -> list[str]:
    return [sys.executable, "-m", "knowledge.extraction", content_type, str(memory_bytes)]


def extract_text_isolated(
    data: bytes, content_type: str, *, timeout: float, memory_bytes: int = CHILD_MEMORY_BYTES
) -> str:
    """extract_text in a child process with `timeout` seconds and `memory_bytes` of
    address space, which gets none of this process's environment (its secrets)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(sys.path),
        "LANG": "C.UTF-8",
    }
    try:
        result = subprocess.run(  # noqa: S603 (this interpreter, this module)
            _child_argv(content_type, memory_bytes),
            input=data,
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ExtractionFailed(f"Reading the file took longer than {timeout:g} s.") from None
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        raise ExtractionFailed(
            "The reader stopped without an answer (the file may need more memory than allowed)."
        ) from None
    if "error" in answer:
        raise ExtractionFailed(answer["error"])
    return answer["text"]


def _child_main(content_type: str, memory_bytes: int) -> None:
    """Limits itself before it reads anything (the parsers are imported on first use)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    data = sys.stdin.buffer.read()
    try:
        answer = {"text": extract_text(data, content_type)}
    except ExtractionFailed as error:
        answer = {"error": str(error)}
    except MemoryError:
        answer = {"error": "The file needs more memory than allowed to read."}
    except Exception as error:
        answer = {"error": f"The file could not be read ({type(error).__name__}: {error})."}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    _child_main(sys.argv[1], int(sys.argv[2]))
