// The npm `@anthropic-ai/sdk` package against a switchyard gateway: one streamed message and
// one streamed tool call (run by tests/anthropic_api.rs).
//
// Usage: node tests/js/anthropic_check.mjs BASE_URL API_KEY MODEL
//
// The package is not installed in the repository: scripts/setup.sh puts it in
// $SWITCHYARD_CACHE/node/node_modules and prints SWITCHYARD_NODE_MODULES=...; this script loads
// it from $SWITCHYARD_NODE_MODULES (else ~/.cache/switchyard/node/node_modules).
//
// Prints ONE JSON object on stdout; hard failures are listed under "failures" (and on stderr),
// and the script then exits 1; it exits 3 when the npm package is not installed.
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';

const [base, apiKey, model] = process.argv.slice(2, 5);
if (!model) {
  console.error('usage: anthropic_check.mjs BASE_URL API_KEY MODEL');
  process.exit(64);
}
const nodeModules = process.env.SWITCHYARD_NODE_MODULES
  || join(process.env.SWITCHYARD_CACHE || join(homedir(), '.cache', 'switchyard'), 'node', 'node_modules');
const require = createRequire(import.meta.url);
let Anthropic;
let sdkVersion;
try {
  const mod = require(join(nodeModules, '@anthropic-ai', 'sdk'));
  Anthropic = mod.Anthropic ?? mod.default ?? mod;
  sdkVersion = require(join(nodeModules, '@anthropic-ai', 'sdk', 'package.json')).version;
} catch (e) {
  console.error(`anthropic_check: @anthropic-ai/sdk is not in ${nodeModules} (run scripts/setup.sh): ${e.message}`);
  process.exit(3);
}

const client = new Anthropic({ baseURL: base, apiKey, maxRetries: 0, timeout: 120_000 });
const out = { sdk: sdkVersion, node: process.version };
const failures = [];
const check = (cond, what) => { if (!cond) failures.push(what); return Boolean(cond); };

async function section(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: `${e?.constructor?.name}: ${e?.message}` };
    failures.push(`${name}: raised ${e?.constructor?.name}: ${e?.message}`);
    console.error(e);
  }
}

await section('stream', async () => {
  const stream = client.messages.stream({
    model, max_tokens: 24, messages: [{ role: 'user', content: 'Name three colors.' }],
  });
  const deltas = [];
  stream.on('text', (t) => deltas.push(t));
  const final = await stream.finalMessage();
  const text = final.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(deltas.length >= 2, `stream: ${deltas.length} text deltas`);
  check(deltas.join('') === text, 'stream: the deltas add up to the final message');
  check(['end_turn', 'max_tokens'].includes(final.stop_reason), `stream: stop_reason ${final.stop_reason}`);
  return { deltas: deltas.length, text, stop_reason: final.stop_reason, output_tokens: final.usage.output_tokens };
});

await section('tool_stream', async () => {
  const stream = client.messages.stream({
    model, max_tokens: 200, messages: [{ role: 'user', content: 'Weather in Oslo?' }],
    tools: [{ name: 'get_weather', description: 'The weather in a city now.',
      input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 20 } },
        required: ['city'], additionalProperties: false } }],
    tool_choice: { type: 'tool', name: 'get_weather' },
  });
  const final = await stream.finalMessage();
  const uses = final.content.filter((b) => b.type === 'tool_use');
  check(final.stop_reason === 'tool_use', `tool_stream: stop_reason ${final.stop_reason}`);
  check(uses.length === 1 && typeof uses[0].input?.city === 'string', `tool_stream: ${JSON.stringify(uses)}`);
  return { stop_reason: final.stop_reason, calls: uses.map((u) => ({ name: u.name, input: u.input })) };
});

out.failures = failures;
console.log(JSON.stringify(out));
if (failures.length) {
  console.error(`anthropic_check: FAILED:\n  ${failures.join('\n  ')}`);
  process.exit(1);
}
