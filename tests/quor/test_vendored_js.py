"""The front-end libraries served from quor/static/vendor/ are exactly the versions that
package-lock.json installs (tools/vendor-js copies them)."""

import filecmp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENDORED = {
    "marked/marked.umd.js": "marked/lib/marked.umd.js",
    "dompurify/purify.min.js": "dompurify/dist/purify.min.js",
    "highlight/highlight.min.js": "@highlightjs/cdn-assets/highlight.min.js",
    "highlight/github.min.css": "@highlightjs/cdn-assets/styles/github.min.css",
    "xterm/xterm.js": "@xterm/xterm/lib/xterm.js",
    "xterm/xterm.css": "@xterm/xterm/css/xterm.css",
    "xterm/addon-fit.js": "@xterm/addon-fit/lib/addon-fit.js",
    "xterm/addon-canvas.js": "@xterm/addon-canvas/lib/addon-canvas.js",
}


@pytest.mark.parametrize(("served", "installed"), VENDORED.items())
def test_each_vendored_library_is_the_locked_version(served, installed):
    assert filecmp.cmp(
        ROOT / "quor/static/vendor" / served, ROOT / "node_modules" / installed, shallow=False
    ), f"quor/static/vendor/{served} differs from node_modules: run tools/vendor-js"
