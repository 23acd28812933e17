#!/usr/bin/env python3
"""Search your company's knowledge from the sandbox: `quor-search "travel policy"`.

Asks Quor's API through the egress proxy, which puts in the sandbox's credential: the
search runs as the sandbox's owner and finds only documents the owner may read. Where
the index lives is Quor's business; the sandbox never connects to it. The agent's
search tool uses the same functions. Standard library only: this runs in the sandbox
image, not in Quor.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException

SEARCH_PATH = "/api/v1/runtime/knowledge/search"
TYPES = ("pdf", "docx", "html", "markdown", "text")
TIMEOUT = 30


class SearchFailed(Exception):
    pass


def proxy_opener():
    """Always through the proxy of HTTP(S)_PROXY, whatever NO_PROXY says (urllib's
    ProxyHandler consults NO_PROXY even for explicit proxies, through this function;
    Quor's in-sandbox programs are its only users of urllib)."""
    urllib.request.proxy_bypass = lambda host: False
    proxies = {
        scheme: os.environ.get(f"{scheme.upper()}_PROXY") or os.environ.get(f"{scheme}_proxy")
        for scheme in ("http", "https")
    }
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({k: v for k, v in proxies.items() if v})
    )


def _error_message(body: bytes) -> str:
    try:
        error = json.loads(body)["error"]
        return str(error.get("message") or error.get("code"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def search(api_url, token, query, *, sources=(), types=(), limit=10, timeout=TIMEOUT):
    """The results (dicts with title, url, passage, source_name, type, updated_at)."""
    if urllib.parse.urlsplit(api_url).scheme not in ("http", "https"):
        raise SearchFailed("QUOR_API_URL is not an http(s) URL.")
    body = {"query": query, "limit": limit}
    if sources:
        body["sources"] = list(sources)
    if types:
        body["types"] = list(types)
    request = urllib.request.Request(  # noqa: S310  (checked to be http(s) above)
        api_url.rstrip("/") + SEARCH_PATH,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with proxy_opener().open(request, timeout=timeout) as response:
            return json.loads(response.read())["results"]
    except urllib.error.HTTPError as error:
        message = _error_message(error.read(65536))
        raise SearchFailed(
            f"Quor refused the search (HTTP {error.code})" + (f": {message}" if message else ".")
        ) from None
    except (OSError, HTTPException, ValueError, KeyError) as error:
        raise SearchFailed(f"Quor could not be reached: {error or type(error).__name__}") from None


def format_results(results) -> str:
    if not results:
        return "No document you may read matches."
    lines = []
    for number, result in enumerate(results, start=1):
        when = (result.get("updated_at") or "")[:10]
        where = " · ".join(filter(None, [result.get("source_name"), result.get("type"), when]))
        lines.append(f"{number}. {result.get('title')} ({where})")
        if result.get("url"):
            lines.append(f"   {result['url']}")
        lines.append(f"   {result.get('passage', '')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="quor-search",
        description="Search your company's documents (only those you may read).",
    )
    parser.add_argument("query", nargs="+", help='words; "a phrase", or, -leave-out')
    parser.add_argument("--source", type=int, action="append", default=[], help="a source id")
    parser.add_argument("--type", choices=TYPES, action="append", default=[])
    parser.add_argument("--limit", type=int, default=10, help="1 to 50 (default 10)")
    parser.add_argument("--json", action="store_true", help="print Quor's JSON answer")
    args = parser.parse_args(argv)
    try:
        results = search(
            os.environ.get("QUOR_API_URL", ""),
            os.environ.get("QUOR_API_TOKEN", ""),
            " ".join(args.query),
            sources=args.source,
            types=args.type,
            limit=args.limit,
        )
    except SearchFailed as error:
        print(f"quor-search: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"results": results}, indent=2) if args.json else format_results(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
