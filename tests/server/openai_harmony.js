// Chats with a gpt-oss (harmony) server through the official `openai` npm client:
// node openai_harmony.js NODE_MODULES_DIR BASE_URL MODEL MESSAGES_JSON MAX_TOKENS SEED...
// Prints one JSON object: per seed, the answer non-streaming (with logprobs:
// every generated token's text, special tokens included) and streamed without
// and with logprobs, each as the client saw it (content, reasoning_content,
// finish_reason, usage); and what the server said to reasoning_effort values.
const path = require('path');
const OpenAI = require(path.resolve(process.argv[2], 'openai')).default;
const [baseURL, model, messagesJson, maxTokensArg, ...seeds] = process.argv.slice(3);
const messages = JSON.parse(messagesJson);
const max_tokens = Number(maxTokensArg);
const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'none', maxRetries: 0 });

async function streamed(params) {
  const out = { content: '', reasoning_content: '', finish_reason: null, usage: null, chunks: 0 };
  for await (const c of await client.chat.completions.create({ ...params, stream: true,
                                                               stream_options: { include_usage: true } })) {
    if (c.usage) out.usage = c.usage;
    for (const ch of c.choices) {
      ++out.chunks;
      out.content += (ch.delta && ch.delta.content) || '';
      out.reasoning_content += (ch.delta && ch.delta.reasoning_content) || '';
      if (ch.finish_reason) out.finish_reason = ch.finish_reason;
    }
  }
  return out;
}

async function effort(value) {
  try {
    await client.chat.completions.create({ model, messages, max_tokens: 1, reasoning_effort: value });
    return { status: 200 };
  } catch (e) {
    return { status: e.status, param: e.param || (e.error && e.error.param) || null };
  }
}

(async () => {
  const out = { answers: [], effort: {} };
  for (const s of seeds) {
    const params = { model, messages, max_tokens, temperature: 1, seed: Number(s) };
    const r = await client.chat.completions.create({ ...params, logprobs: true });
    const ch = r.choices[0];
    out.answers.push({
      seed: Number(s),
      plain: {
        content: ch.message.content,
        reasoning_content: ch.message.reasoning_content,
        finish_reason: ch.finish_reason,
        usage: r.usage,
        tokens: ch.logprobs.content.map((e) => e.token),
      },
      stream: await streamed(params),
      stream_logprobs: await streamed({ ...params, logprobs: true }),
    });
  }
  for (const v of ['low', 'medium', 'high', 'extreme']) out.effort[v] = await effort(v);
  process.stdout.write(JSON.stringify(out));
})().catch((e) => {
  process.stdout.write(JSON.stringify({ error: String(e && e.stack || e) }));
  process.exit(1);
});
