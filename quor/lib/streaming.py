"""Streamed responses that stay streamed under daphne."""

from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse


class StreamedResponse(StreamingHttpResponse):
    """A StreamingHttpResponse over a synchronous iterator that Django's ASGI handler
    sends chunk by chunk. Given one, StreamingHttpResponse reads it whole into a list
    before it sends a byte ("must consume synchronous iterators"): a 200 MB archive or
    download would sit in the web process's memory, and the client would wait for all
    of it. Synchronous readers (WSGI, the test client) iterate it as before."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Each chunk is read on Django's sync thread, where the view ran
        # (thread_sensitive): an iterator over a database cursor stays on its
        # connection's thread. The handler closes the iterator (response.close()).
        chunks = iter(self.streaming_content)
        read = sync_to_async(next, thread_sensitive=True)
        while (chunk := await read(chunks, None)) is not None:
            yield chunk
