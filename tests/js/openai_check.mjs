// The npm `openai` package against a switchyard gateway: structured output and a tool call
// (run by the gateway's tests).
//
// Usage: node tests/js/openai_check.mjs BASE_URL API_KEY MODEL
//
// The package is not installed in the repository: scripts/setup.sh puts it in
// $SWITCHYARD_CACHE/node/node_modules and prints SWITCHYARD_NODE_MODULES=...; this script loads
// it from $SWITCHYARD_NODE_MODULES (else ~/.cache/switchyard/node/node_modules).
//
// Prints ONE JSON object on stdout with what each call returned; the Rust test asserts on it.
// Every hard failure is also listed under "failures" and on stderr, and the script then exits 1;
// it exits 2 when the gateway cannot be reached, 3 when the npm package is not installed.
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';

const [base, apiKey, model] = process.argv.slice(2, 5);
if (!model) {
  console.error('usage: openai_check.mjs BASE_URL API_KEY MODEL');
  process.exit(64);
}
const nodeModules = process.env.SWITCHYARD_NODE_MODULES
  || join(process.env.SWITCHYARD_CACHE || join(homedir(), '.cache', 'switchyard'), 'node', 'node_modules');
const require = createRequire(import.meta.url);
let OpenAI;
let sdkVersion;
try {
  const mod = require(join(nodeModules, 'openai'));
  OpenAI = mod.OpenAI ?? mod.default ?? mod;
  sdkVersion = require(join(nodeModules, 'openai', 'package.json')).version;
} catch (e) {
  console.error(`openai_check: the npm openai package is not in ${nodeModules} (run scripts/setup.sh): ${e.message}`);
  process.exit(3);
}

const client = new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 120_000 });
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

// A tiny validator for the subset of JSON Schema used below (no dependency besides openai).
function validate(value, schema, path = '$') {
  const errs = [];
  const type = (v) => (v === null ? 'null' : Array.isArray(v) ? 'array'
    : typeof v === 'number' ? (Number.isInteger(v) ? 'integer' : 'number') : typeof v);
  const types = [].concat(schema.type ?? []);
  const t = type(value);
  if (types.length && !types.includes(t) && !(t === 'integer' && types.includes('number'))) {
    return [`${path}: ${JSON.stringify(value)} is not ${types.join('|')}`];
  }
  if (schema.enum && !schema.enum.includes(value)) errs.push(`${path}: ${JSON.stringify(value)} not in enum`);
  if (t === 'string' && schema.maxLength !== undefined && [...value].length > schema.maxLength) errs.push(`${path}: too long`);
  if ((t === 'integer' || t === 'number') && schema.minimum !== undefined && value < schema.minimum) errs.push(`${path}: < minimum`);
  if ((t === 'integer' || t === 'number') && schema.maximum !== undefined && value > schema.maximum) errs.push(`${path}: > maximum`);
  if (t === 'array') {
    if (schema.minItems !== undefined && value.length < schema.minItems) errs.push(`${path}: fewer than minItems`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) errs.push(`${path}: more than maxItems`);
    value.forEach((v, i) => errs.push(...validate(v, schema.items ?? {}, `${path}[${i}]`)));
  }
  if (t === 'object') {
    for (const k of schema.required ?? []) if (!(k in value)) errs.push(`${path}: missing ${k}`);
    for (const [k, v] of Object.entries(value)) {
      if (schema.properties?.[k]) errs.push(...validate(v, schema.properties[k], `${path}.${k}`));
      else if (schema.additionalProperties === false) errs.push(`${path}: unexpected ${k}`);
    }
  }
  return errs;
}

function parseAndValidate(text, schema) {
  let value;
  try {
    value = JSON.parse(text ?? '');
  } catch (e) {
    return { value: null, error: `not JSON: ${e.message}` };
  }
  const errs = validate(value, schema);
  return { value, error: errs.length ? errs.join('; ') : null };
}

// Preflight: fail fast and clearly when the gateway is not there.
try {
  await client.models.list();
} catch (e) {
  if (e instanceof OpenAI.APIConnectionError) {
    console.error(`openai_check: cannot reach the gateway at ${base}: ${e.message} (${e.cause?.message ?? e.cause})`);
    process.exit(2);
  }
  throw e;
}

const BOOK_SCHEMA = {
  type: 'object',
  properties: {
    title: { type: 'string', maxLength: 40 },
    genre: { type: 'string', enum: ['novel', 'poetry', 'essay'] },
    year: { type: 'integer', minimum: 1500, maximum: 2030 },
    authors: { type: 'array', items: { type: 'string', maxLength: 30 }, minItems: 1, maxItems: 3 },
    series: { type: ['string', 'null'], maxLength: 30 },
  },
  required: ['title', 'genre', 'year', 'authors', 'series'],
  additionalProperties: false,
};

await section('json_schema', async () => {
  const r = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 300,
    messages: [{ role: 'user', content: 'Describe a classic French novel.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'book', schema: BOOK_SCHEMA, strict: true } },
  });
  const ch = r.choices[0];
  const { value, error } = parseAndValidate(ch.message.content, BOOK_SCHEMA);
  check(error === null, `json_schema: ${error} (finish ${ch.finish_reason}): ${JSON.stringify(ch.message.content)}`);
  check(ch.finish_reason === 'stop', `json_schema: finish_reason ${ch.finish_reason}, want stop`);
  return { content: ch.message.content, finish: ch.finish_reason, parsed: value, valid: error === null, error };
});

const WEATHER_PARAMS = {
  type: 'object',
  properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};

await section('tools_required', async () => {
  const r = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 300,
    messages: [{ role: 'user', content: 'What is the weather in Paris in celsius?' }],
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'Current weather in a city.',
                                            parameters: WEATHER_PARAMS, strict: true } }],
    tool_choice: 'required',
  });
  const ch = r.choices[0];
  const calls = (ch.message.tool_calls ?? []).map((tc) => {
    const { value, error } = tc.function.name === 'get_weather'
      ? parseAndValidate(tc.function.arguments, WEATHER_PARAMS)
      : { value: null, error: `unknown function ${tc.function.name}` };
    check(error === null, `tools_required: call ${tc.function.name}: ${error}: ${JSON.stringify(tc.function.arguments)}`);
    check(Boolean(tc.id), `tools_required: call ${tc.function.name} has no id`);
    return { id: tc.id, type: tc.type, name: tc.function.name, arguments: tc.function.arguments, args: value,
             valid: error === null, error };
  });
  check(calls.length >= 1, `tools_required: no tool_calls (content ${JSON.stringify(ch.message.content)})`);
  check(ch.finish_reason === 'tool_calls', `tools_required: finish_reason ${ch.finish_reason}, want tool_calls`);
  return { finish: ch.finish_reason, calls, n_calls: calls.length, content: ch.message.content };
});

out.failures = failures;
await section('embeddings', async () => {
  const r = await client.embeddings.create({ model, input: ['The train to Rome leaves at nine.', 'Bananas are rich in potassium.'] });
  const dims = r.data.map((d) => d.embedding.length);
  check(r.data.length === 2 && dims[0] > 0 && dims[0] === dims[1], `embeddings: ${JSON.stringify(dims)}`);
  return { n: r.data.length, dims, prompt_tokens: r.usage.prompt_tokens };
});

console.log(JSON.stringify(out));
if (failures.length) {
  console.error(`openai_check.mjs: FAILED:\n  ${failures.join('\n  ')}`);
  process.exit(1);
}
