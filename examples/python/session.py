#!/usr/bin/env python3
"""A switchyard session from Python (docs/protocol.md section 11b).

Opens a session through a coordinator, keeps a stable prefix warm, prefills a
suffix, streams a decode, and closes. Prints one JSON object with what each step
reported. Needs `pip install nats-py msgpack`.

    python examples/python/session.py --nats nats://127.0.0.1:4222 \
        --prefix-text "You are a careful reviewer." --suffix "\\nReview: fn f() {}\\nReview:"
"""

import argparse
import asyncio
import json
import sys
import uuid

import msgpack
import nats

V = 1


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


async def call(nc, subject: str, body: dict) -> dict:
    """One request/reply; raises RuntimeError with the wire error code."""
    try:
        msg = await nc.request(subject, pack(body), timeout=120)
    except nats.errors.NoRespondersError:
        raise RuntimeError(f"session_closed: nothing answers on {subject}")
    reply = msgpack.unpackb(msg.data, raw=False)
    if "error" in reply:  # ErrorReply
        raise RuntimeError(f"{reply['error']['code']}: {reply['error']['message']}")
    return reply


async def run(args) -> dict:
    nc = await nats.connect(args.nats)
    try:
        opened = await call(nc, f"{args.subject_prefix}.v1.session.open",
                            {"v": V, "fence": args.fence, "model": args.model})
        sid = opened["session_id"]
        base = f"{args.subject_prefix}.v1.session.{sid}"
        manifest = {"profile": args.profile}
        segment = lambda text: {"v": V, "fence": args.fence, "text": text, "manifest": manifest}
        cold = await call(nc, f"{base}.ensure_prefix", segment(args.prefix_text))
        warm = await call(nc, f"{base}.ensure_prefix", segment(args.prefix_text))
        suffix = await call(nc, f"{base}.prefill_suffix", segment(args.suffix))

        # decode streams StreamChunks to our inbox, exactly like generate.
        request_id = uuid.uuid4().hex
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"{base}.decode", pack({"v": V, "fence": args.fence, "request_id": request_id,
                                                  "config": {"max_tokens": args.max_tokens}}), reply=inbox)
        text, ids = [], []
        while True:
            chunk = msgpack.unpackb((await sub.next_msg(timeout=30)).data, raw=False)
            for tok in chunk.get("tokens") or []:
                ids.append(tok["id"])
                text.append(tok["text"])
            if chunk.get("done"):
                if chunk.get("error"):
                    raise RuntimeError(f"{chunk['error']['code']}: {chunk['error']['message']}")
                break
        report = await call(nc, f"{base}.close", {"v": V, "fence": args.fence})
        return {"session_id": sid, "worker_id": opened["worker_id"], "cold": cold, "warm": warm,
                "suffix": suffix, "text": "".join(text), "token_ids": ids, "closed": report["closed"]}
    finally:
        await nc.drain()


def main() -> int:
    p = argparse.ArgumentParser(description="Run one switchyard session and print what it reported.")
    p.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    p.add_argument("--subject-prefix", default="sy", help="subject prefix")
    p.add_argument("--fence", default="python-example", help="owner instance id")
    p.add_argument("--model", default="", help='model name; "" = any served model')
    p.add_argument("--profile", default="example", help="manifest profile (part of the cache key)")
    p.add_argument("--prefix-text", required=True, help="the stable prefix")
    p.add_argument("--suffix", required=True, help="the volatile suffix")
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args()
    try:
        print(json.dumps(asyncio.run(run(args))), flush=True)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
