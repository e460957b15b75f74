// Runs the official `openai` npm client against a server:
// node openai_client.js NODE_MODULES_DIR BASE_URL MODEL PROMPT MAX_TOKENS
// Prints one JSON object: for completions and chat completions, non-streaming
// and streaming (with include_usage), the text, usage and finish reason.
const path = require('path');
const OpenAI = require(path.resolve(process.argv[2], 'openai')).default;
const [baseURL, model, prompt, maxTokensArg] = process.argv.slice(3);
const max_tokens = Number(maxTokensArg);
const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: process.env.MSINFER_API_KEY || 'none', maxRetries: 0 });

async function streamed(it, pick) {
  let text = '';
  let usage = null;
  let finish = null;
  let chunks = 0;
  for await (const c of it) {
    ++chunks;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += pick(ch) || '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, usage, finish_reason: finish, chunks };
}

(async () => {
  const out = {};
  const common = { model, max_tokens, temperature: 0, ignore_eos: true };
  const c = await client.completions.create({ ...common, prompt });
  out.completion = { text: c.choices[0].text, usage: c.usage, finish_reason: c.choices[0].finish_reason };
  out.stream_completion = await streamed(
    await client.completions.create({ ...common, prompt, stream: true, stream_options: { include_usage: true } }),
    (ch) => ch.text);
  const messages = [{ role: 'user', content: prompt }];
  const chat = await client.chat.completions.create({ ...common, messages });
  out.chat = { text: chat.choices[0].message.content, usage: chat.usage, finish_reason: chat.choices[0].finish_reason,
               role: chat.choices[0].message.role };
  out.stream_chat = await streamed(
    await client.chat.completions.create({ ...common, messages, stream: true, stream_options: { include_usage: true } }),
    (ch) => ch.delta && ch.delta.content);
  const stop = await client.completions.create({ ...common, prompt, max_tokens: 1, logprobs: 2 });
  out.logprobs = stop.choices[0].logprobs;
  // Logprobs of every token, special tokens written into the text too: the
  // tokens join into the text (completions), the bytes into the content (chat).
  const lp = await client.completions.create({ ...common, prompt, logprobs: 3, skip_special_tokens: false });
  out.logprob_completion = { text: lp.choices[0].text, logprobs: lp.choices[0].logprobs };
  const lpc = await client.chat.completions.create(
    { ...common, messages, logprobs: true, top_logprobs: 3, skip_special_tokens: false });
  out.logprob_chat = { text: lpc.choices[0].message.content, logprobs: lpc.choices[0].logprobs };
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);
  try {
    await client.completions.create({ ...common, prompt, temperature: -1 });
    out.bad_request = 'accepted';
  } catch (e) {
    out.bad_request = { status: e.status, message: e.message };
  }
  process.stdout.write(JSON.stringify(out));
})().catch((e) => {
  // Exit 0 so the test sees the reason.
  process.stdout.write(JSON.stringify({ fatal: String(e && e.stack || e) }));
});
