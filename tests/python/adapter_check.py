"""The official openai client against the gateway with a LoRA adapter: `model` as
"base:adapter", the models list naming adapters with their parent. Prints JSON."""
import json
import sys

import openai

base_url, model, adapter = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key="unused")
ids = {m.id: (m.model_extra or {}).get("parent") for m in client.models.list().data}


def complete(name):
    r = client.completions.create(model=name, prompt="The capital of France is", max_tokens=12, temperature=0)
    return {"text": r.choices[0].text, "model": r.model}


out = {"models": ids, "base": complete(model), "adapted": complete(f"{model}:{adapter}")}
try:
    complete(f"{model}:no-such-adapter")
    out["unknown"] = None
except openai.NotFoundError as e:
    out["unknown"] = {"status": e.status_code, "message": str(e)}
print(json.dumps(out))
