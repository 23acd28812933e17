#!/usr/bin/env python3
"""File operations inside a session workspace, run by Quor as the sandbox user.

Usage: quor_fs.py {stat|list|read} ROOT RELPATH | quor_fs.py write ROOT RELPATH SIZE

Every path component below ROOT is opened with O_NOFOLLOW, so a symlink anywhere
in the path (even one that points back inside the workspace) is refused: a path
cannot leave ROOT, and no check can be raced by swapping a link. `write` reads the
new content from stdin and renames it into place only if exactly SIZE bytes came.
Results and errors are one JSON line on stdout (file content for `read`); exit
status 0 on success, 2 on refusal.
Standard library only: this runs in the sandbox image, not in Quor.
"""

import contextlib
import json
import os
import stat
import sys

ERROR_EXIT = 2
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def split_relative(relpath):
    if "\x00" in relpath:
        raise Refused("files.invalid_path", "The path contains a NUL byte.")
    if relpath.startswith("/"):
        raise Refused("files.invalid_path", "The path must be relative to the workspace.")
    parts = [part for part in relpath.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise Refused("files.invalid_path", "The path must not contain '..'.")
    return parts


def open_dir(root, parts):
    """A descriptor of ROOT/parts..., refusing any symlink on the way (ROOT included)."""
    fd = os.open("/", DIR_FLAGS)
    try:
        for part in [*split_relative(root.lstrip("/")), *parts]:
            try:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise Refused("files.not_found", "No such directory.") from None
            except (NotADirectoryError, OSError) as exc:
                if _is_symlink(fd, part):
                    raise Refused(
                        "files.symlink_refused", "The path goes through a symlink."
                    ) from None
                if isinstance(exc, NotADirectoryError):
                    raise Refused(
                        "files.not_a_directory", "A path component is not a directory."
                    ) from None
                raise
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_symlink(dir_fd, name):
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def entry_type(mode):
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def describe(name, st):
    return {
        "name": name,
        "type": entry_type(st.st_mode),
        "size": st.st_size,
        "modified": st.st_mtime,
    }


def do_stat(root, parts):
    if not parts:
        fd = open_dir(root, [])
        try:
            return describe("", os.fstat(fd))
        finally:
            os.close(fd)
    fd = open_dir(root, parts[:-1])
    try:
        return describe(parts[-1], os.stat(parts[-1], dir_fd=fd, follow_symlinks=False))
    except FileNotFoundError:
        raise Refused("files.not_found", "No such file or directory.") from None
    finally:
        os.close(fd)


def do_list(root, parts):
    fd = open_dir(root, parts)
    try:
        entries = []
        for name in sorted(os.listdir(fd)):
            try:
                entries.append(describe(name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            except FileNotFoundError:
                continue
        return {"entries": entries}
    finally:
        os.close(fd)


def open_file(root, parts, flags):
    if not parts:
        raise Refused("files.not_a_file", "The path is a directory.")
    dir_fd = open_dir(root, parts[:-1])
    try:
        return os.open(
            parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        ), dir_fd
    except FileNotFoundError:
        os.close(dir_fd)
        raise Refused("files.not_found", "No such file.") from None
    except OSError:
        symlink = _is_symlink(dir_fd, parts[-1])
        os.close(dir_fd)
        if symlink:
            raise Refused("files.symlink_refused", "The path is a symlink.") from None
        raise


def do_read(root, parts):
    fd, dir_fd = open_file(root, parts, os.O_RDONLY)
    os.close(dir_fd)
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise Refused("files.not_a_file", "The path is not a regular file.")
        out = sys.stdout.buffer
        while chunk := source.read(1 << 16):
            out.write(chunk)
        out.flush()


def do_write(root, parts, expected_size):
    if not parts:
        raise Refused("files.invalid_path", "A file name is required.")
    dir_fd = open_dir(root, parts[:-1])
    temporary = f".{parts[-1]}.quor-upload-{os.getpid()}"
    try:
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd
        )
        size = 0
        with os.fdopen(fd, "wb") as target:
            while chunk := sys.stdin.buffer.read(1 << 16):
                target.write(chunk)
                size += len(chunk)
        if size != expected_size:
            raise Refused("files.incomplete_upload", f"Received {size} of {expected_size} bytes.")
        if _is_symlink(dir_fd, parts[-1]):
            raise Refused("files.symlink_refused", "The target is a symlink.")
        os.rename(temporary, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return {"name": parts[-1], "size": size}
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    finally:
        os.close(dir_fd)


OPERATIONS = {"stat": do_stat, "list": do_list, "read": do_read, "write": do_write}


def main(argv):
    operation = argv[1] if len(argv) > 1 else ""
    arity = 5 if operation == "write" else 4
    if operation not in OPERATIONS or len(argv) != arity:
        print(json.dumps({"error": {"code": "files.usage", "message": __doc__.splitlines()[2]}}))
        return ERROR_EXIT
    root, relpath, extra = argv[2], argv[3], [int(a) for a in argv[4:]]
    try:
        result = OPERATIONS[operation](root, split_relative(relpath), *extra)
    except Refused as exc:
        print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
        return ERROR_EXIT
    except IsADirectoryError:
        print(
            json.dumps(
                {"error": {"code": "files.not_a_file", "message": "The path is a directory."}}
            )
        )
        return ERROR_EXIT
    except PermissionError:
        print(
            json.dumps(
                {"error": {"code": "files.permission_denied", "message": "Permission denied."}}
            )
        )
        return ERROR_EXIT
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
