"""OpenAI-compatible servers (tritonfront's OpenAI front, peers that speak the same API) as tests
and benchmarks drive them: the official SDK for what a user does, raw HTTP for what the SDK would
never send (malformed bodies, wrong types) and for headers, and a light streaming chat client
(aiohttp) that fills a harness.load.streaming.Record, for benchmarks whose client shares the
server's cores."""
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Optional, Union

import aiohttp
import openai

from ..load.streaming import Record
from .kserve import check_loopback

API_KEY = "unused"  # the SDK insists on one; tritonfront's front does not check it (README: Exposing)


def sdk(base_url: str, timeout: float = 120, **kwargs) -> openai.OpenAI:
    """The official client, without retries (a test sees the first answer)."""
    return openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=timeout, **kwargs)


def async_sdk(base_url: str, timeout: float = 120, **kwargs) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=timeout, **kwargs)


@dataclass
class Reply:
    status: int
    headers: dict  # names in lower case
    text: str

    def json(self):
        return json.loads(self.text)

    def events(self) -> list:
        """The data of each server-sent event ("[DONE]" as it is, anything else as JSON)."""
        data = [line[5:].strip() for line in self.text.split("\n") if line.startswith("data:")]
        return [item if item == "[DONE]" else json.loads(item) for item in data]


def call(base_url: str, method: str, path: str, body: Union[dict, bytes, None] = None, timeout: float = 120) -> Reply:
    """One HTTP request (path relative to base_url); error statuses are returned, not raised."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(base_url.rstrip("/") + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, _lower(response.headers), response.read().decode())
    except urllib.error.HTTPError as error:
        return Reply(error.code, _lower(error.headers), error.read().decode())


def _lower(headers) -> dict:
    return {name.lower(): value for name, value in headers.items()}


class ChatStreams:
    """Streamed chat completions over one aiohttp session (a connection per request in flight).
    Each fills a Record: the first chunk with content is the first token; every chunk with content
    is an arrival of one response (the OpenAI API does not say how many tokens a chunk holds, so
    gaps are per chunk); tokens are the usage's completion tokens (stream_options.include_usage)."""

    def __init__(self, base_url: str):
        check_loopback(base_url.split("//", 1)[-1].split("/", 1)[0])
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                             connector=aiohttp.TCPConnector(limit=0))

    async def send(self, body: dict, record: Record) -> Record:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            async with self.session.post(self.url, json=body) as response:
                if response.status != 200:
                    record.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                    return record
                async for line in response.content:
                    if not line.startswith(b"data:"):
                        continue
                    now = time.perf_counter()
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        record.done = now
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        record.error = json.dumps(chunk["error"])[:300]
                        return record
                    self._read(chunk, record, now)
        except aiohttp.ClientError as error:
            record.error = f"{type(error).__name__}: {error}"
        return record

    @staticmethod
    def _read(chunk: dict, record: Record, now: float) -> None:
        for choice in chunk.get("choices", []):
            if choice["delta"].get("content"):
                record.first = record.first or now
                record.arrivals.append((now, 1))
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            record.tokens = chunk["usage"]["completion_tokens"]

    async def close(self) -> None:
        await self.session.close()


def error_of(reply: Reply) -> Optional[dict]:
    """The OpenAI error object of a reply, None when it has none."""
    try:
        return reply.json().get("error")
    except (ValueError, AttributeError):
        return None
