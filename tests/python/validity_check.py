"""Many schema-constrained answers at temperature 1.0, checked with `jsonschema`.

    validity_check.py BASE_URL API_KEY MODEL RUNS [CONCURRENCY] [BACKEND]

Sends RUNS chat requests (seeds 0..RUNS-1, CONCURRENCY at a time) through the
official `openai` SDK with `response_format` json_schema (a nested schema: a list
of objects, an enum, an optional field, bounded integers, a nested object;
no bounds on non-integer numbers, which llama.cpp's schema converter ignores), pinned
to BACKEND when given (switchyard's `backend` extra). Prints one JSON object:
`n`, `valid` (answers that parse and validate), `stop`, `length`, `distinct`
(different answers), `failures` (the first few that did not validate, with their
text) and `seconds`. Exits 1 when any answer is invalid.
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

SCHEMA = {
    "type": "object",
    "properties": {
        "team": {"type": "string", "minLength": 1, "maxLength": 20},
        "size": {"type": "integer", "minimum": 1, "maximum": 50},
        "lead": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 20},
                "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
            },
            "required": ["name", "role"],
            "additionalProperties": False,
        },
        "members": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 20},
                    "age": {"type": "integer", "minimum": 18, "maximum": 99},
                    "score": {"type": "integer", "minimum": 0, "maximum": 10},
                    "nickname": {"type": "string", "maxLength": 20},
                },
                "required": ["name", "age", "score"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["team", "size", "lead", "members"],
    "additionalProperties": False,
}


def main():
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    base_url, key, model, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    concurrency = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    backend = sys.argv[6] if len(sys.argv) > 6 else None
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)
    extra = {"backend": backend} if backend else None

    def one(seed):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Describe team number {seed} of a small company as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "team", "strict": True, "schema": SCHEMA}},
            temperature=1.0,
            seed=seed,
            max_tokens=500,
            extra_body=extra,
        )
        c = r.choices[0]
        text = c.message.content or ""
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            error = None
        except Exception as e:  # noqa: BLE001 - any parse or validation failure counts
            error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        return {"seed": seed, "finish": c.finish_reason, "error": error, "text": text}

    started = time.time()
    try:
        client.models.list()
    except openai.APIConnectionError as e:
        print(f"validity_check: cannot reach {base_url}: {e}", file=sys.stderr)
        sys.exit(2)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(runs)))
    bad = [r for r in results if r["error"]]
    out = {
        "n": len(results),
        "valid": len(results) - len(bad),
        "stop": sum(r["finish"] == "stop" for r in results),
        "length": sum(r["finish"] == "length" for r in results),
        "distinct": len({r["text"] for r in results}),
        "failures": bad[:5],
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(out))
    if bad:
        print(f"validity_check: {len(bad)} of {len(results)} answers invalid; first: {bad[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
