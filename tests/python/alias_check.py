"""Model aliases through the official OpenAI client (run by tests/gateway.rs).

Usage: alias_check.py BASE_URL KEY MODEL_ONLY_KEY MODEL
The gateway maps `gpt-4o-mini` and `text-embedding-3-small` to MODEL, and `ghost` to a
model no worker serves; MODEL_ONLY_KEY may use MODEL alone. Prints one JSON object; the
Rust test asserts on it.
"""
import json
import sys

import openai

base, key, model_only, model = sys.argv[1:5]
c = openai.OpenAI(base_url=base, api_key=model_only, max_retries=0)
anyone = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
out = {}

out["models"] = sorted(m.id for m in c.models.list().data)
out["retrieve"] = c.models.retrieve("gpt-4o-mini").model_dump()


def ask(name, c=c):
    r = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Name a color."}],
                                  max_tokens=8, temperature=0)
    return {"content": r.choices[0].message.content, "model": r.model}


out["aliased"] = ask("gpt-4o-mini")
out["direct"] = ask(model)
out["embed_aliased"] = c.embeddings.create(model="text-embedding-3-small", input="water").data[0].embedding
out["embed_direct"] = c.embeddings.create(model=model, input="water").data[0].embedding
for name in ("ghost", "gpt-4o"):
    try:
        ask(name, anyone)
        out[name] = {"class": None}
    except openai.APIStatusError as e:
        out[name] = {"class": type(e).__name__, "status": e.status_code, "message": str(e)}
print(json.dumps(out))
