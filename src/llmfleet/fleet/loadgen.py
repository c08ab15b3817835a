"""A small closed-loop load generator for an OpenAI-compatible chat endpoint (asyncio + httpx).

``concurrency`` workers each send a streamed chat completion, wait for its end, and send the next,
like ``vllm bench serve --max-concurrency N`` with an unlimited request rate. A level stops by
itself: after ``requests`` requests, or when ``duration_s`` has passed (no new request after it),
whichever comes first; every request has its own time limit, and the whole level a hard one.

Requests stream (``stream_options.include_usage``) and set ``ignore_eos`` so every answer is exactly
``max_tokens`` long, as the field's load generators do for synthetic prompts. Each request's prompt
starts with its own number and its own words, so no engine serves it from a prefix cache.

The SSE parsing and the per-request arithmetic are the health check's (``llmfleet.health.check``):
one definition of TTFT and decode tok/s across deploy, status and bench.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from llmfleet.fleet.bench import RequestResult
from llmfleet.health.check import chunk_error, iter_sse, stream_stats

# Words for synthetic prompts: common English words, one token each in most BPE vocabularies.
WORDS = (
    "the of and to in is was for on are with as be at by this had not but from or have an they which one you were "
    "her all she there would their we him been has when who will more no if out so said what up its about into than "
    "them can only other new some could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off come since against go came "
    "right used take three"
).split()
TOKENS_PER_WORD_GUESS = 1.3  # before calibration: English words in a BPE vocabulary
MAX_EVENTS_FACTOR = 20  # chunks allowed per requested token (keep-alives, usage, role chunks)


def prompt_text(n_words: int, seed: int) -> str:
    """A prompt of about ``n_words`` words that no other request shares a prefix with."""
    n = max(1, int(n_words))
    k = len(WORDS)
    words = [WORDS[(seed * 7919 + i * (seed % 13 + 1) + i // k) % k] for i in range(n)]
    return f"Request {seed}. Continue this text: " + " ".join(words)


def words_for(target_tokens: int, tokens_per_word: float) -> int:
    """Words that make about ``target_tokens`` prompt tokens (the chat template's own are in the ratio)."""
    return max(1, round(target_tokens / max(tokens_per_word, 0.05)))


@dataclass
class Target:
    base_url: str
    model: str
    api_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def request_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": int(max_tokens),
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def _prompt_tokens(events: list[tuple[float, dict[str, Any]]]) -> int | None:
    for _t, ev in reversed(events):
        usage = ev.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            return usage["prompt_tokens"]
        timings = ev.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("prompt_n"), int):
            # llama.cpp: prompt_n counts only the tokens it processed (a cached prefix is left out)
            return timings["prompt_n"]
    return None


async def one_request(client: httpx.AsyncClient, target: Target, prompt: str, max_tokens: int, timeout_s: float,
                      clock: Callable[[], float] = time.monotonic) -> RequestResult:
    """Send one streamed chat completion; never raises for the server's trouble (``ok=False`` and why)."""
    t0 = clock()
    events: list[tuple[float, dict[str, Any]]] = []
    limit = MAX_EVENTS_FACTOR * max_tokens + 100

    async def run() -> str:
        async with client.stream("POST", "/v1/chat/completions", json=request_body(target.model, prompt, max_tokens),
                                 headers=target.headers()) as resp:
            if resp.status_code != 200:
                body = (await resp.aread())[:200].decode("utf-8", "replace").strip()
                return f"HTTP {resp.status_code}: {body}"
            async for line in resp.aiter_lines():
                for ev in iter_sse([line]):
                    if ev == "[DONE]":
                        return ""
                    assert isinstance(ev, dict)
                    err = chunk_error(ev)
                    if err:
                        return f"error in stream: {err}"
                    events.append((clock(), ev))
                    if len(events) > limit:
                        return f"more than {limit} chunks for {max_tokens} tokens"
            return ""

    try:
        error = await asyncio.wait_for(run(), timeout=timeout_s)
    except TimeoutError:
        error = f"no complete answer within {timeout_s:g}s"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    t1 = clock()
    stats = stream_stats(t0, events, t1)
    if not error and stats.tokens == 0:
        error = "the stream carried no tokens"
    return RequestResult(started=t0, ended=t1, ok=not error, ttft_s=stats.ttft_s if not error else None,
                         decode_tokps=stats.decode_tokps if not error else None,
                         output_tokens=stats.tokens if not error else 0, prompt_tokens=_prompt_tokens(events),
                         error=error)


async def run_level_async(
    target: Target,
    *,
    concurrency: int,
    words: int,
    max_tokens: int,
    requests: int | None,
    duration_s: float | None,
    timeout_s: float,
    seed: int = 0,
    clock: Callable[[], float] = time.monotonic,
    on_done: Callable[[RequestResult], None] | None = None,
) -> list[RequestResult]:
    """One level: ``concurrency`` workers until ``requests`` are sent or ``duration_s`` has passed."""
    if requests is None and duration_s is None:
        raise ValueError("a level needs a request count or a duration")
    results: list[RequestResult] = []
    sent = 0
    start = clock()
    deadline = start + duration_s if duration_s is not None else None
    lock = asyncio.Lock()

    async def take() -> int | None:
        nonlocal sent
        async with lock:
            if requests is not None and sent >= requests:
                return None
            if deadline is not None and clock() >= deadline:
                return None
            sent += 1
            return sent

    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(base_url=target.base_url, timeout=timeout, limits=limits, trust_env=False) as client:

        async def worker() -> None:
            while True:
                n = await take()
                if n is None:
                    return
                res = await one_request(client, target, prompt_text(words, seed + n), max_tokens, timeout_s, clock)
                results.append(res)
                if on_done is not None:
                    on_done(res)

        # The hard bound of the level: every request it may start, each within its own limit.
        cap = (duration_s or 0) + timeout_s * (1 + (requests or 1) / max(concurrency, 1)) + 10
        try:
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout=cap)
        except TimeoutError:
            pass
    return results


def run_level(target: Target, **kwargs: Any) -> list[RequestResult]:
    return asyncio.run(run_level_async(target, **kwargs))


def calibrate(target: Target, prompt_tokens: int, timeout_s: float, seed: int = 10_000_000) -> tuple[float, str]:
    """Tokens per prompt word as the engine counts them (chat template included), from one short
    request (which also warms the engine up). Returns (ratio, note)."""
    words = words_for(prompt_tokens, TOKENS_PER_WORD_GUESS)
    res = asyncio.run(_calibrate(target, words, timeout_s, seed))
    if not res.ok:
        return TOKENS_PER_WORD_GUESS, f"calibration request failed ({res.error}); prompts sized at " \
                                      f"{TOKENS_PER_WORD_GUESS} tokens per word"
    if not res.prompt_tokens:
        return TOKENS_PER_WORD_GUESS, f"the engine reports no prompt token count; prompts sized at " \
                                      f"{TOKENS_PER_WORD_GUESS} tokens per word"
    return res.prompt_tokens / words, f"{res.prompt_tokens / words:.2f} prompt tokens per word (engine's count)"


async def _calibrate(target: Target, words: int, timeout_s: float, seed: int) -> RequestResult:
    async with httpx.AsyncClient(base_url=target.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                 trust_env=False) as client:
        return await one_request(client, target, prompt_text(words, seed), 2, timeout_s)
