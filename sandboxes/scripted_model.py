"""The scripted model provider behind the "Demo (scripted)" model of `make dev`, and the
fake provider of the tests: a real HTTP(S) server on loopback that speaks the Anthropic
Messages API and OpenAI Chat Completions (also OpenRouter's), both streaming as the real
providers do, and plays a script.

A script is a list of steps, `{"text": ..., "tool_calls": [{"name": ..., "input": {...}}],
"usage": {"input_tokens": ..., "output_tokens": ...}}` (every key optional). The step played
is the number of assistant messages in the request, so the server keeps no state and a
follow-up conversation continues the script; past its end it answers a short text. Usage
defaults to input_tokens = 100 * (step + 1) and output_tokens = 10 * (step + 1).
"""

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PROGRAM = """\
squares = [n * n for n in range(1, 11)]
print(f"The sum of the squares of 1 to 10 is {sum(squares)}.")
"""


def demo_script() -> list[dict]:
    """Writes a small Python program, runs it, and reports what it printed."""
    return [
        {
            "text": "I'll write a small Python program that computes something.",
            "tool_calls": [
                {"name": "write_file", "input": {"path": "hello.py", "content": PROGRAM}}
            ],
        },
        {
            "text": "Now I'll run it.",
            "tool_calls": [{"name": "run_command", "input": {"command": "python3 hello.py"}}],
        },
        {
            "text": "I wrote hello.py and ran it with python3. It printed: "
            "The sum of the squares of 1 to 10 is 385."
        },
    ]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedModelServer:
    """Records each request in `requests` ({"path", "headers" (names in lower case),
    "body" (parsed JSON)}). `fail_with = (status, body)` makes it answer that error to
    every request while set (a dict body is sent as JSON); `stall_seconds` delays every
    answer; `chunk_size` (characters of text or tool-input JSON per delta) and
    `chunk_delay` (seconds between stream events) shape the stream."""

    def __init__(self, host: str, port: int, *, tls: tuple[Path, Path] | None = None):
        self.script: list[dict] = []
        self.requests: list[dict] = []
        self.fail_with: tuple[int, dict | str | bytes] | None = None
        self.stall_seconds = 0.0
        self.chunk_size = 4
        self.chunk_delay = 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
                if fake.stall_seconds:
                    time.sleep(fake.stall_seconds)
                if fake.fail_with:
                    self._send_error(*fake.fail_with)
                elif self.path.endswith("/v1/messages"):
                    self._stream(fake._anthropic_events(body), named=True)
                elif self.path.endswith("/chat/completions"):
                    self._stream(fake._openai_events(body), named=False)
                else:
                    self._send_error(404, {"error": {"message": f"No route for {self.path}"}})

            def _send_error(self, status, body):
                if isinstance(body, dict):
                    body = json.dumps(body)
                payload = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _stream(self, events, *, named):
                """Server-sent events in chunked transfer encoding, one event per chunk."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for data in events:
                        if named:
                            text = f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"
                        else:
                            text = (
                                f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
                            )
                        chunk = text.encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                        if fake.chunk_delay:
                            time.sleep(fake.chunk_delay)
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def base_url(self, kind: str, host: str = "127.0.0.1") -> str:
        """QUOR_MODEL_BASE_URL for this server and a model kind."""
        root = f"{self.scheme}://{host}:{self.port}"
        return root if kind == "anthropic" else f"{root}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # --- what is played -------------------------------------------------------------

    def _step(self, body: dict) -> tuple[int, dict]:
        index = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        step = self.script[index] if index < len(self.script) else {"text": "(end of script)"}
        usage = {"input_tokens": 100 * (index + 1), "output_tokens": 10 * (index + 1)}
        return index, {**step, "usage": {**usage, **step.get("usage", {})}}

    def _anthropic_events(self, body: dict):
        index, step = self._step(body)
        usage = step["usage"]
        yield {
            "type": "message_start",
            "message": {
                "id": f"msg_fake_{index}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model"),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1},
            },
        }
        yield {"type": "ping"}
        block = 0
        if step.get("text"):
            yield {
                "type": "content_block_start",
                "index": block,
                "content_block": {"type": "text", "text": ""},
            }
            for piece in _pieces(step["text"], self.chunk_size):
                yield {
                    "type": "content_block_delta",
                    "index": block,
                    "delta": {"type": "text_delta", "text": piece},
                }
            yield {"type": "content_block_stop", "index": block}
            block += 1
        calls = step.get("tool_calls") or []
        for number, call in enumerate(calls):
            yield {
                "type": "content_block_start",
                "index": block,
                "content_block": {
                    "type": "tool_use",
                    "id": f"toolu_fake_{index}_{number}",
                    "name": call["name"],
                    "input": {},
                },
            }
            for piece in ["", *_pieces(json.dumps(call.get("input", {})), self.chunk_size)]:
                yield {
                    "type": "content_block_delta",
                    "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
            yield {"type": "content_block_stop", "index": block}
            block += 1
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        }
        yield {"type": "message_stop"}

    def _openai_events(self, body: dict):
        index, step = self._step(body)
        base = {
            "id": f"chatcmpl-fake-{index}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model"),
        }
        with_usage = (body.get("stream_options") or {}).get("include_usage")

        def chunk(delta, finish_reason=None):
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**base, "choices": [choice], **({"usage": None} if with_usage else {})}

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(step.get("text") or "", self.chunk_size):
            yield chunk({"content": piece})
        calls = step.get("tool_calls") or []
        for number, call in enumerate(calls):
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": number,
                            "id": f"call_fake_{index}_{number}",
                            "type": "function",
                            "function": {"name": call["name"], "arguments": ""},
                        }
                    ]
                }
            )
            for piece in _pieces(json.dumps(call.get("input", {})), self.chunk_size):
                yield chunk({"tool_calls": [{"index": number, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls" if calls else "stop")
        if with_usage:
            usage = step["usage"]
            yield {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage["input_tokens"],
                    "completion_tokens": usage["output_tokens"],
                    "total_tokens": usage["input_tokens"] + usage["output_tokens"],
                },
            }
        yield "[DONE]"
