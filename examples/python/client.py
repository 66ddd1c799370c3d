#!/usr/bin/env python3
"""Minimal switchyard client: one streaming request over NATS + MessagePack.

Protocol: docs/protocol.md.  Needs `pip install nats-py msgpack` (Python 3.11+).

    python examples/python/client.py --nats nats://127.0.0.1:4222 --prompt "Once upon a time"
    python examples/python/client.py --chat "Say hi" --json

Exit status: 0 success; 2 error chunk or no responders; 3 worker_lost (no chunk for
--stall-ms, or a seq gap) after --resume-attempts resumes on other workers.
"""

import argparse
import asyncio
import json
import os
import sys
import uuid

import msgpack
import nats
import nats.errors

PROTOCOL_VERSION = 1


def fail(code: str, message: str) -> None:
    print(f"error: {code}: {message}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    nc = await nats.connect(args.nats)
    try:
        return await stream(nc, args)
    finally:
        await nc.drain()


async def cancel(nc, prefix: str, request_id: str, inbox: str) -> None:
    """Asks the worker to stop. The body names the request's inbox: a worker ignores
    a cancel that does not, so nobody else can cancel our request."""
    body = msgpack.packb({"v": PROTOCOL_VERSION, "inbox": inbox}, use_bin_type=True)
    await nc.publish(f"{prefix}.v1.cancel.{request_id}", body)
    await nc.flush()


async def stream(nc, args: argparse.Namespace) -> int:
    first_id = uuid.uuid4().hex
    req = {"v": PROTOCOL_VERSION, "request_id": first_id, "model": args.model,
           "config": {"max_tokens": args.max_tokens}}
    if args.chat is not None:
        verb, req["messages"] = "chat", [{"role": "user", "content": args.chat}]
    else:
        verb, req["prompt"] = "generate", args.prompt
    subject = f"{args.prefix}.v1.{verb}"

    text, token_ids, worker_id, resumes = [], [], None, 0
    while True:
        # Resuming a lost stream (section 8a): the same request with the tokens we
        # already have; the worker goes on after them.
        request_id = first_id if resumes == 0 else f"{first_id}-r{resumes}"
        req["request_id"] = request_id
        if token_ids:
            req["resume_tokens"] = list(token_ids)
            req["config"]["max_tokens"] = args.max_tokens - len(token_ids)
        # 1. Subscribe to a fresh inbox BEFORE publishing, so no chunk can be missed.
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.flush()
        # 2. Publish the request with the inbox as the NATS reply subject.
        headers = {"Sy-Request-Id": request_id,
                   "traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"}
        await nc.publish(subject, msgpack.packb(req, use_bin_type=True), reply=inbox, headers=headers)
        outcome = await read(sub, nc, args, request_id, inbox, subject, text, token_ids)
        await sub.unsubscribe()
        lost, chunk = outcome
        if lost is not None:
            # The worker is gone (or chunks were lost): resume on another one.
            if resumes < args.resume_attempts and len(token_ids) < args.max_tokens:
                resumes += 1
                print(f"note: {lost}; resuming on another worker ({resumes})", file=sys.stderr, flush=True)
                continue
            fail("worker_lost", lost)
            return 3
        worker_id = chunk.get("worker_id") or worker_id
        err = chunk.get("error")
        metrics = chunk.get("metrics")
        if metrics is not None:
            metrics["resumes"] = resumes
        if args.json:
            print(json.dumps({"text": "".join(text), "token_ids": token_ids,
                              "finish_reason": chunk.get("finish_reason"),
                              "worker_id": worker_id, "metrics": metrics,
                              "error": err}), flush=True)
        if err:
            fail(err.get("code"), err.get("message", ""))
            return 2
        return 0


async def read(sub, nc, args, request_id, inbox, subject, text, token_ids):
    """Reads one worker's stream into `text`/`token_ids`. Returns (why it was lost,
    None) when the stream must be resumed, else (None, the final chunk)."""
    expected_seq = 0
    while True:
        # 3. Read chunks; keep-alives arrive at least every keepalive_ms, so silence
        #    longer than the stall limit means the worker is gone.
        try:
            msg = await sub.next_msg(timeout=args.stall_ms / 1000)
        except nats.errors.TimeoutError:
            # Tell the worker (if it is alive after all) to stop.
            await cancel(nc, args.prefix, request_id, inbox)
            return f"no chunk for {args.stall_ms} ms", None
        # NATS "no responders" status (503, empty body): nobody listens on the subject.
        if msg.headers and msg.headers.get("Status") == "503":
            return None, {"done": True, "error": {"code": "no_worker", "message": f"no responders on {subject}"}}
        chunk = msgpack.unpackb(msg.data, raw=False)  # unknown keys are simply ignored
        if chunk.get("request_id") not in (request_id, ""):
            continue  # not ours (cannot normally happen on a fresh inbox)
        seq = chunk.get("seq")
        if seq != expected_seq:
            await cancel(nc, args.prefix, request_id, inbox)
            return f"seq gap: expected {expected_seq}, got {seq}", None
        expected_seq += 1
        for tok in chunk.get("tokens") or []:
            token_ids.append(tok["id"])
            text.append(tok["text"])  # may be "" mid-UTF-8 character
            if not args.json:
                sys.stdout.write(tok["text"])
                sys.stdout.flush()
        if not chunk.get("done"):
            continue  # seq 0 (admission) and keep-alives carry no tokens
        err = chunk.get("error")
        if err and err.get("code") == "worker_lost":
            return err.get("message", "worker_lost"), None
        return None, chunk


def main() -> int:
    p = argparse.ArgumentParser(description="Stream a generation from switchyard.")
    p.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    p.add_argument("--prefix", default="sy", help="subject prefix")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="raw prompt (sent to {prefix}.v1.generate)")
    what.add_argument("--chat", help="one user message (sent to {prefix}.v1.chat)")
    p.add_argument("--model", default="", help='model name; "" = any served model')
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--stall-ms", type=int, default=10000,
                   help="give up (worker_lost) after this long without a chunk")
    p.add_argument("--resume-attempts", type=int, default=2,
                   help="resume a stream whose worker is lost on another worker, this many times")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object at the end instead of streaming text")
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
