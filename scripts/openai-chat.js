// One chat completion through the official openai client (scripts/run):
// node scripts/openai-chat.js NODE_MODULES_DIR BASE_URL MODEL PROMPT [MAX_TOKENS (24)]
const path = require('path');
const OpenAI = require(path.resolve(process.argv[2], 'openai')).default;
const [baseURL, model, prompt, maxTokens] = process.argv.slice(3);
const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'none', maxRetries: 0 });
(async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: prompt }], max_tokens: Number(maxTokens || 24), temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  process.stdout.write(`user: ${prompt}\nassistant: `);
  let usage;
  for await (const chunk of stream) {
    for (const c of chunk.choices) process.stdout.write(c.delta.content || '');
    if (chunk.usage) usage = chunk.usage;
  }
  process.stdout.write(`\n(${usage.prompt_tokens} prompt tokens, ${usage.completion_tokens} generated)\n`);
})().catch((e) => { console.error(String(e)); process.exit(1); });
