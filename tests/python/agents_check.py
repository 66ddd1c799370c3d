"""One agent turn with a tool through the OpenAI Agents SDK (`openai-agents`) over the gateway's
/v1/responses (run by tests/responses_api.rs, with the venv scripts/setup.sh makes for it).

Usage: agents_check.py BASE_URL MODEL

The agent must call its tool first (`tool_choice: "required"`, enforced by a constraint); the SDK
runs the tool, sends its output back as a `function_call_output` item and (its tool choice reset
to auto, as it does after a call) takes the model's next answer as the final output. The model is
tiny, so what is checked is what the server guarantees: the call names the tool with arguments
that match its schema, the SDK's loop goes through with the tool's output in the conversation, and
the run ends with a final output.

Prints ONE JSON object on stdout; hard failures are listed under "failures" (and the script exits 1).
"""
import json
import sys

import agents
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

base, model = sys.argv[1:3]
out = {"sdk": agents.__version__ if hasattr(agents, "__version__") else "?", "failures": []}


def check(cond, what):
    if not cond:
        out["failures"].append(what)


set_tracing_disabled(True)
client = AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
cities = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city now.

    Args:
        city: The city's name.
    """
    cities.append(city)
    return f"It is sunny in {city}, 21 degrees."


agent = Agent(
    name="weather",
    instructions="You answer questions about the weather. Use the tool.",
    tools=[get_weather],
    model=OpenAIResponsesModel(model=model, openai_client=client),
    model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=200),
)
try:
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    items = [i.type for i in result.new_items]
    out.update({"items": items, "cities": cities, "final": str(result.final_output)[:200],
                "responses": len(result.raw_responses)})
    check(len(cities) >= 1 and all(isinstance(c, str) for c in cities), f"the tool ran: {cities}")
    check("tool_call_item" in items and "tool_call_output_item" in items, f"a call and its output: {items}")
    check(len(result.raw_responses) >= 2, "the model answered again after the tool's output")
    check(result.final_output is not None, "a final output")
except Exception as e:  # noqa: BLE001 - every error is reported
    out["error"] = f"{type(e).__name__}: {e}"
    check(False, f"the run raised {type(e).__name__}: {e}")

print(json.dumps(out))
sys.exit(1 if out["failures"] else 0)
