// Runs the official `openai` npm client against a server:
// node openai_client.js NODE_MODULES_DIR BASE_URL MODEL PROMPT MAX_TOKENS [n MAX_N]
// Prints one JSON object: for completions and chat completions, non-streaming
// and streaming (with include_usage), the text, usage and finish reason.
// With `n MAX_N` (the server's --max-n): n choices and best_of instead
// (samplesN below), each answer as the client saw it; the test judges them.
const path = require('path');
const OpenAI = require(path.resolve(process.argv[2], 'openai')).default;
const [baseURL, model, prompt, maxTokensArg, mode, maxNArg] = process.argv.slice(3);
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

// A stream's chunks as the client saw them, in order: [index, text, finish_reason]
// per choice of each chunk (chat: the delta's content, and its role as text
// "<role>"), plus the usage of the last chunk.
async function chunksOf(it, chat) {
  const seen = [];
  let usage = null;
  for await (const c of it) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      let text = chat ? (ch.delta && ch.delta.content) || '' : ch.text || '';
      if (chat && ch.delta && ch.delta.role) text = '<' + ch.delta.role + '>' + text;
      seen.push([ch.index, text, ch.finish_reason || null]);
    }
  }
  return { chunks: seen, usage };
}

function choicesOf(c, chat) {
  return c.choices.map((ch) => ({
    index: ch.index,
    text: chat ? ch.message.content : ch.text,
    finish_reason: ch.finish_reason,
    logprobs: ch.logprobs ? (chat ? ch.logprobs.content.map((e) => e.logprob) : ch.logprobs.token_logprobs)
                          : null,
  }));
}

async function status(p) {
  try {
    await p;
    return 'accepted';
  } catch (e) {
    return { status: e.status, param: e.param, message: e.message };
  }
}

// n > 1 and best_of (issue 47).
async function samplesN(maxN) {
  const out = {};
  const sample = { model, prompt, max_tokens, temperature: 1, ignore_eos: true };
  // Seeded: the same choices twice; each choice its own sample.
  const seeded = { ...sample, n: 3, seed: 1234 };
  const a = await client.completions.create(seeded);
  out.seeded = [choicesOf(a), choicesOf(await client.completions.create(seeded))];
  out.seeded_usage = a.usage;
  // The same request streamed: chunks interleaved by index, each index its finish.
  out.stream = await chunksOf(await client.completions.create(
    { ...seeded, stream: true, stream_options: { include_usage: true } }), false);
  // Unseeded: fresh samples, each choice its own.
  out.unseeded = choicesOf(await client.completions.create({ ...sample, n: 3 }));
  // Greedy: every choice is the one greedy answer.
  const greedy = { model, prompt, max_tokens, temperature: 0, ignore_eos: true };
  out.greedy_one = choicesOf(await client.completions.create(greedy));
  out.greedy_n = choicesOf(await client.completions.create({ ...greedy, n: 2 }));
  // Chat: non-streaming and streaming.
  const messages = [{ role: 'user', content: prompt }];
  const chat = { model, messages, max_tokens, temperature: 1, ignore_eos: true, n: 2, seed: 99 };
  const ch = await client.chat.completions.create(chat);
  out.chat = { choices: choicesOf(ch, true), usage: ch.usage };
  out.chat_stream = await chunksOf(await client.chat.completions.create(
    { ...chat, stream: true, stream_options: { include_usage: true } }), true);
  // best_of 3, n 1: the sequence with the highest cumulative logprob of the
  // three the same seed gives with n 3 (logprobs to judge it).
  const lp = { ...sample, seed: 77, logprobs: 1 };
  out.best_of_candidates = choicesOf(await client.completions.create({ ...lp, n: 3 }));
  out.best_of = choicesOf(await client.completions.create({ ...lp, n: 1, best_of: 3 }));
  const b = await client.completions.create({ ...sample, seed: 77, n: 1, best_of: 3 });
  out.best_of_no_logprobs = choicesOf(b);
  out.best_of_usage = b.usage;
  // Refused: n beyond the server's bound, best_of < n, a stream with best_of != n.
  out.too_many = await status(client.completions.create({ ...sample, n: maxN + 1 }));
  out.too_many_chat = await status(client.chat.completions.create({ ...chat, n: maxN + 1 }));
  out.at_bound = await status(client.completions.create({ ...sample, max_tokens: 2, n: maxN }));
  out.best_of_below_n = await status(client.completions.create({ ...sample, n: 3, best_of: 2 }));
  out.best_of_stream = await status(client.completions.create(
    { ...sample, n: 1, best_of: 2, stream: true }));
  return out;
}

(async () => {
  if (mode === 'n') {
    process.stdout.write(JSON.stringify(await samplesN(Number(maxNArg))));
    return;
  }
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
