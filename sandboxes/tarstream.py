"""Editing a tar stream as it passes, without unpacking it: a snapshot leaves out the
managed area (Skills and Library are synchronised again on restore) and must notice an
archive that was cut short. Understands ustar names with a prefix, pax extended headers
and GNU long names; file contents pass through untouched, in the pieces they came in."""

from collections.abc import Iterable, Iterator

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


def without_paths(chunks: Iterable[bytes], excluded: str) -> Iterator[bytes]:
    """The archive without the member `excluded` (a relative path) and everything
    under it; a hard link to a left-out file is left out too. Raises ArchiveError at
    the end of a stream that stops before the end-of-archive block."""
    excluded = _normal(excluded)
    blocks = _Blocks(chunks)
    held: list[bytes] = []  # extended headers, sent only with their member
    extended: dict[str, str] = {}
    left_out: set[str] = set()
    while True:
        header = blocks.take(BLOCK)
        if header is None:
            raise ArchiveError("the archive ends before its end-of-archive block")
        if header == END_OF_ARCHIVE:
            yield header
            yield from blocks.rest()
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
        name = _normal(name)
        link = _normal(extended.get("linkpath") or _field(header[157:257]))
        keep = not (
            name == excluded
            or name.startswith(excluded + "/")
            or (kind == HARD_LINK and link in left_out)
        )
        if keep:
            yield from held
            yield header
        else:
            left_out.add(name)
        held, extended = [], {}
        for piece in blocks.pieces(0 if kind in (HARD_LINK, SYMBOLIC_LINK) else _padded(size)):
            if keep:
                yield piece
