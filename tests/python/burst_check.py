"""A burst through the gateway with the official `openai` package, as a user's app
would send it: N streamed chat requests, C at a time, no SDK retries
(`max_retries=0`). Prints one JSON report: how many were served, refused with 429 (and
their Retry-After), failed otherwise; each request's wall time and time to first
token; and the hard failures.

Usage: burst_check.py BASE_URL [--requests N] [--concurrency C] [--max-tokens T]
       [--timeout-s S] [--key KEY]

With --timeout-s S (the gateway's queue timeout): a 429 must carry Retry-After and
come within S plus a margin; served requests must have started within S plus the
margin. Without it every request must be served. Either way none may end without an
outcome or with a stream that did not finish."""

import argparse
import asyncio
import json
import sys
import time

import openai

from checks import check, failures, out, reach

MARGIN_S = 3.0


async def one(client, i, args, results):
    start = time.monotonic()
    r = {"i": i}
    try:
        stream = await client.chat.completions.create(
            model="",
            messages=[{"role": "user", "content": f"Count from {i} to {i + 40}, one number per line."}],
            max_tokens=args.max_tokens,
            temperature=0,
            stream=True,
        )
        text, finish = "", None
        async for chunk in stream:
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            if c.delta and c.delta.content:
                if "ttft" not in r:
                    r["ttft"] = time.monotonic() - start
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
        r.update(outcome="served", finish=finish, chars=len(text))
    except openai.RateLimitError as e:
        r.update(outcome="429", retry_after=e.response.headers.get("retry-after"), message=str(e)[:200])
    except Exception as e:  # noqa: BLE001 - every outcome is counted
        r.update(outcome="error", message=f"{type(e).__name__}: {e}"[:300])
    r["wall"] = time.monotonic() - start
    results.append(r)


async def run(args):
    client = openai.AsyncOpenAI(base_url=args.base, api_key=args.key, max_retries=0, timeout=600)
    sem = asyncio.Semaphore(args.concurrency)
    results = []

    async def gated(i):
        async with sem:
            await one(client, i, args, results)

    start = time.monotonic()
    await asyncio.gather(*(gated(i) for i in range(args.requests)))
    return results, time.monotonic() - start


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout-s", type=float, default=None)
    ap.add_argument("--key", default="none")
    args = ap.parse_args()
    reach(args.base, args.key, "burst_check")
    results, elapsed = asyncio.run(run(args))
    by = {}
    for r in results:
        by.setdefault(r["outcome"], []).append(r)
    served, refused, errors = by.get("served", []), by.get("429", []), by.get("error", [])
    out.update(
        requests=args.requests,
        concurrency=args.concurrency,
        served=len(served),
        refused_429=len(refused),
        errors=len(errors),
        elapsed_s=round(elapsed, 2),
        served_per_s=round(len(served) / elapsed, 2),
        ttft_p50_s=pct([r["ttft"] for r in served if "ttft" in r], 0.5),
        ttft_p99_s=pct([r["ttft"] for r in served if "ttft" in r], 0.99),
        wall_max_s=max((r["wall"] for r in results), default=None),
        error_samples=[r["message"] for r in errors[:5]],
        refused_samples=[{"retry_after": r["retry_after"], "wall": round(r["wall"], 2)} for r in refused[:5]],
    )
    check(len(results) == args.requests, f"{len(results)} outcomes for {args.requests} requests")
    check(not errors, f"{len(errors)} requests failed otherwise than 429: {out['error_samples']}")
    unfinished = [r["i"] for r in served if r.get("finish") not in ("stop", "length")]
    check(not unfinished, f"streams without a finish reason: {unfinished[:10]}")
    if args.timeout_s is None:
        check(len(served) == args.requests, f"only {len(served)} of {args.requests} served")
    else:
        limit = args.timeout_s + MARGIN_S
        no_hint = [r["i"] for r in refused if not (r["retry_after"] or "").isdigit()]
        check(not no_hint, f"429s without a Retry-After: {no_hint[:10]}")
        late = [round(r["wall"], 2) for r in refused if r["wall"] > limit]
        check(not late, f"429s after more than {limit} s: {late[:10]}")
        slow_start = [round(r["ttft"], 2) for r in served if r.get("ttft", 0) > limit]
        check(not slow_start, f"served requests that started after more than {limit} s: {slow_start[:10]}")
        check(served, "nothing was served")
    out["failures"] = failures
    print(json.dumps(out, indent=1))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
