"""Editing a tar stream as it passes, without unpacking it: a snapshot leaves out the
managed area (Skills and Library are synchronised again on restore) and must notice an
archive that was cut short. Understands ustar names with a prefix, pax extended headers
and GNU long names; file contents pass through untouched, in the pieces they came in."""

import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

BLOCK = 512
END_OF_ARCHIVE = bytes(BLOCK)
EXTENDED = (b"x", b"L", b"K")  # pax per-file headers, GNU long name and long link name
HARD_LINK, SYMBOLIC_LINK = b"1", b"2"  # links carry no data, whatever their size says


class ArchiveError(Exception):
    """The stream is not a whole tar archive."""


class _Blocks:
    """Takes exact sizes from an iterable of byte strings of any length."""

    def __init__(self, chunks: Iterable[bytes]):
        self.source = iter(chunks)
        self.buffer = bytearray()

    def take(self, size: int) -> bytes | None:
        while len(self.buffer) < size:
            chunk = next(self.source, None)
            if chunk is None:
                return None
            self.buffer += chunk
        taken = bytes(self.buffer[:size])
        del self.buffer[:size]
        return taken

    def pieces(self, size: int) -> Iterator[bytes]:
        """`size` bytes as they come (a large file is never held whole)."""
        if size and self.buffer:
            piece = bytes(self.buffer[:size])
            del self.buffer[: len(piece)]
            size -= len(piece)
            yield piece
        while size:
            chunk = next(self.source, None)
            if chunk is None:
                raise ArchiveError("the archive ends inside a file")
            if len(chunk) > size:
                self.buffer += chunk[size:]
                chunk = chunk[:size]
            size -= len(chunk)
            yield chunk

    def rest(self) -> Iterator[bytes]:
        if self.buffer:
            yield bytes(self.buffer)
            self.buffer.clear()
        yield from self.source


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # GNU base-256, for sizes past 8 GiB
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ArchiveError(f"a tar header has a bad number: {field!r}") from None


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _field(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> dict[str, str]:
    records, position = {}, 0
    while position < len(data) and data[position] != 0:
        length = int(data[position : data.index(b" ", position)])
        record = data[data.index(b" ", position) + 1 : position + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _normal(name: str) -> str:
    return name.removeprefix("./").rstrip("/")


@dataclass
class _Member:
    held: list[bytes]  # its extended headers
    header: bytes
    kind: bytes
    name: str
    link: str
    size: int  # of its data in the archive, padded; 0 for links


def _members(blocks: _Blocks) -> Iterator[_Member]:
    """Each member's headers; its data must be read (blocks.pieces) before the next.
    Ends at the end-of-archive block, which stays in `blocks`."""
    held: list[bytes] = []
    extended: dict[str, str] = {}
    while True:
        header = blocks.take(BLOCK)
        if header is None:
            raise ArchiveError("the archive ends before its end-of-archive block")
        if header == END_OF_ARCHIVE:
            blocks.buffer[:0] = header
            return
        kind = header[156:157]
        size = _number(header[124:136])
        if kind in EXTENDED:
            data = blocks.take(_padded(size))
            if data is None:
                raise ArchiveError("the archive ends inside an extended header")
            held += [header, data]
            if kind == b"x":
                extended.update(_pax_records(data[:size]))
            else:
                extended["path" if kind == b"L" else "linkpath"] = _field(data[:size])
            continue
        name = extended.get("path") or _field(header[:100])
        if "path" not in extended and header[257:262] == b"ustar" and header[345] != 0:
            name = f"{_field(header[345:500])}/{name}"
        link = extended.get("linkpath") or _field(header[157:257])
        data_size = 0 if kind in (HARD_LINK, SYMBOLIC_LINK) else _padded(size)
        yield _Member(held, header, kind, _normal(name), _normal(link), data_size)
        held, extended = [], {}


def _header(like: bytes, name: str, **fields) -> bytes:
    """A member's headers (pax ones when the name needs them) for `name`, with the mode,
    owner and times of the header `like`."""
    info = tarfile.TarInfo.frombuf(like, "utf-8", "surrogateescape")
    info.name = name
    for field, value in fields.items():
        setattr(info, field, value)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _copies_of(links: list[_Member], read_file) -> Iterator[bytes]:
    """The first link becomes a copy of the file the archive left out (read from a
    one-file archive), the others links to that copy."""
    first, *others = links
    blocks = _Blocks(read_file(first.link))
    source = next((m for m in _members(blocks) if m.kind in (b"0", b"\0")), None)
    if source is None:
        raise ArchiveError(f"{first.link} could not be read again")
    size = _number(source.header[124:136])
    yield _header(first.header, first.name, type=tarfile.REGTYPE, linkname="", size=size)
    yield from blocks.pieces(source.size)
    for _ in blocks.rest():  # read to its end, so its connection can be reused
        pass
    for link in others:
        yield _header(link.header, link.name, type=tarfile.LNKTYPE, linkname=first.name, size=0)


def without_paths(
    chunks: Iterable[bytes], excluded: str, *, read_file: Callable[[str], Iterable[bytes]]
) -> Iterator[bytes]:
    """The archive without the member `excluded` (a relative path) and everything under
    it. A hard link elsewhere to a left-out file becomes a copy of it at the end of the
    archive (`read_file(path)` gives a one-file archive of it), further links to that
    file links to the copy. Raises ArchiveError at the end of a stream that stops before
    the end-of-archive block."""
    excluded = _normal(excluded)
    blocks = _Blocks(chunks)
    left_out: set[str] = set()
    orphans: dict[str, list[_Member]] = {}  # left-out file -> links to it from elsewhere
    for member in _members(blocks):
        inside = member.name == excluded or member.name.startswith(excluded + "/")
        if inside:
            left_out.add(member.name)
        elif member.kind == HARD_LINK and member.link in left_out:
            orphans.setdefault(member.link, []).append(member)
        else:
            yield from member.held
            yield member.header
            yield from blocks.pieces(member.size)
            continue
        for _ in blocks.pieces(member.size):
            pass
    for links in orphans.values():
        yield from _copies_of(links, read_file)
    yield from blocks.rest()
