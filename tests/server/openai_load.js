// Drives a server with the official `openai` npm client: every prompt at once
// as a greedy streaming completion (ignore_eos, max_tokens each), and, once
// each has answered, a second round of the same prompts (not streamed).
// node openai_load.js NODE_MODULES_DIR BASE_URL MODEL MAX_TOKENS PROMPT...
// Prints one JSON object: {"streams": [...], "after": [...]}, each entry the
// text, finish_reason, chunks and completion_tokens of one request, or its
// error. Writes "started <i>" on stderr when request i's first text arrives,
// so a test can act while every stream is in flight.
const path = require('path');
const OpenAI = require(path.resolve(process.argv[2], 'openai')).default;
const [baseURL, model, maxTokensArg, ...prompts] = process.argv.slice(3);
const max_tokens = Number(maxTokensArg);
const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'none', maxRetries: 0 });
const common = { model, max_tokens, temperature: 0, ignore_eos: true };

async function stream(i, prompt) {
  const out = { text: '', finish_reason: null, chunks: 0, completion_tokens: null };
  try {
    const it = await client.completions.create({
      ...common, prompt, stream: true, stream_options: { include_usage: true } });
    for await (const c of it) {
      if (c.usage) out.completion_tokens = c.usage.completion_tokens;
      for (const ch of c.choices) {
        if (ch.text && out.chunks++ === 0) process.stderr.write(`started ${i}\n`);
        out.text += ch.text || '';
        if (ch.finish_reason) out.finish_reason = ch.finish_reason;
      }
    }
  } catch (e) {
    out.error = String(e && e.message || e);
  }
  return out;
}

async function plain(prompt) {
  try {
    const c = await client.completions.create({ ...common, prompt });
    return { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason,
             completion_tokens: c.usage.completion_tokens };
  } catch (e) {
    return { error: String(e && e.message || e) };
  }
}

(async () => {
  const streams = await Promise.all(prompts.map((p, i) => stream(i, p)));
  const after = await Promise.all(prompts.map((p) => plain(p)));
  process.stdout.write(JSON.stringify({ streams, after }));
})().catch((e) => {
  process.stdout.write(JSON.stringify({ fatal: String(e && e.stack || e) }));
});
