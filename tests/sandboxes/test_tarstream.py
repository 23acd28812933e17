"""Leaving a directory out of a tar stream as it passes (sandboxes/tarstream.py), checked
by reading the result back with the standard library's tarfile."""

import io
import tarfile

import pytest

from sandboxes.runtime.tarstream import ArchiveError, without_paths

MANAGED = ".quor-managed"


def archive(members, fmt=tarfile.PAX_FORMAT) -> bytes:
    """`members`: (name, content bytes | None for a directory | ("link", target))."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, tuple):
                info.type = tarfile.LNKTYPE if content[0] == "link" else tarfile.SYMTYPE
                info.linkname = content[1]
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def members(data: bytes) -> dict[str, bytes | None]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {
            m.name.removeprefix("./"): (tar.extractfile(m).read() if m.isfile() else None)
            for m in tar.getmembers()
        }


def in_pieces(data: bytes, size: int):
    return (data[i : i + size] for i in range(0, len(data), size))


def no_reads(path):
    raise AssertionError(f"{path} read again, though no link needs it")


LONG = "./sessions/" + "deep/" * 40 + "file.txt"  # past ustar's 100 + 155 characters


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("piece", [1, 511, 512, 4096, 1 << 20])
def test_the_managed_area_is_left_out_and_everything_else_arrives_byte_for_byte(fmt, piece):
    big = bytes(range(256)) * 5000
    source = [
        (".", None),
        (f"./{MANAGED}", None),
        (f"./{MANAGED}/skills/report/SKILL.md", b"skill"),
        ("./sessions", None),
        ("./sessions/a/big.bin", big),
        ("./sessions/a/empty", b""),
        ("./sessions/a/" + "n" * 90 + "/" + "m" * 90, b"ustar prefix"),
        (f"./{MANAGED}-not-managed/keep", b"a sibling with a longer name stays"),
    ]
    if fmt != tarfile.USTAR_FORMAT:  # names past ustar's limits
        source += [(LONG, b"long"), (f"./{MANAGED}/" + "x" * 120, b"long managed name")]
    result = b"".join(
        without_paths(in_pieces(archive(source, fmt), piece), MANAGED, read_file=no_reads)
    )
    expected = {
        name.removeprefix("./"): content
        for name, content in source
        if name != f"./{MANAGED}" and not name.startswith(f"./{MANAGED}/")
    }
    assert members(result) == expected


def test_hard_links_to_a_left_out_file_become_one_copy_of_it_and_links_to_that_copy():
    managed_file = f"./{MANAGED}/library/notes.md"
    long_link = "./sessions/b/" + "l" * 150  # needs a pax header of its own
    source = [
        (managed_file, b"old notes"),
        ("./sessions/a/notes-link", ("link", managed_file)),
        ("./sessions/a/real", b"real"),
        ("./sessions/a/real-link", ("link", "./sessions/a/real")),
        ("./sessions/a/to-managed", ("symlink", f"../../{MANAGED}/library")),
        (long_link, ("link", managed_file)),
    ]
    asked = []

    def read_file(path):  # as Docker's archive of one file: its base name, its bytes
        asked.append(path)
        return in_pieces(archive([("notes.md", b"notes as they are now")]), 300)

    data = b"".join(without_paths(in_pieces(archive(source), 700), MANAGED, read_file=read_file))

    assert asked == [f"{MANAGED}/library/notes.md"]  # once, however many links
    assert members(data) == {
        "sessions/a/notes-link": b"notes as they are now",
        "sessions/a/real": b"real",
        "sessions/a/real-link": None,  # links (members() reads regular files only)
        "sessions/a/to-managed": None,
        long_link.removeprefix("./"): None,
    }
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        copy, link = tar.getmember("sessions/a/notes-link"), tar.getmember(long_link[2:])
        assert copy.isfile() and copy.mode == 0o644
        assert link.islnk() and link.linkname == "sessions/a/notes-link"


def test_a_left_out_file_that_cannot_be_read_again_is_an_error():
    source = [
        (f"./{MANAGED}/library/notes.md", b"notes"),
        ("./sessions/a/notes-link", ("link", f"./{MANAGED}/library/notes.md")),
    ]
    with pytest.raises(ArchiveError, match="could not be read again"):
        b"".join(without_paths([archive(source)], MANAGED, read_file=lambda path: [bytes(1024)]))


def test_an_archive_cut_short_is_an_error_wherever_it_stops():
    data = archive([("./sessions/a/f", b"f" * 5000), ("./sessions/a/g", b"g")])
    end = data.index(bytes(1024), 1024)  # where the end-of-archive blocks start
    for cut in (100, 512, 700, 3000, end):
        with pytest.raises(ArchiveError):
            b"".join(without_paths([data[:cut]], MANAGED, read_file=no_reads))
    assert (
        b"".join(without_paths([data], MANAGED, read_file=no_reads)) == data
    )  # nothing left out: unchanged


def test_a_pax_path_decides_not_the_short_name_in_the_header():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for short, real in (
            ("./sessions/innocent", f"./{MANAGED}/secret"),
            (f"./{MANAGED}/looks-managed", "./sessions/kept"),
        ):
            info = tarfile.TarInfo(short)
            info.pax_headers = {"path": real}
            info.size = 4
            tar.addfile(info, io.BytesIO(b"data"))
    assert members(b"".join(without_paths([buffer.getvalue()], MANAGED, read_file=no_reads))) == {
        "sessions/kept": b"data"
    }
