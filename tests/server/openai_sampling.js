// The sampling fields through the official `openai` npm client (issue 47):
// node openai_sampling.js NODE_MODULES_DIR BASE_URL MODEL PROMPT GREEDY_IDS_JSON [seeds-only]
// GREEDY_IDS_JSON: the greedy continuation's token ids (from `msinfer generate`).
// Prints one JSON object with what each request gave; the test judges it.
const path = require('path');
const OpenAI = require(path.resolve(process.argv[2], 'openai')).default;
const [baseURL, model, prompt, idsArg, mode] = process.argv.slice(3);
const greedyIds = JSON.parse(idsArg);
const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'none', maxRetries: 0 });

async function completion(extra) {
  const c = await client.completions.create({ model, prompt, ignore_eos: true, ...extra });
  return { id: c.id, text: c.choices[0].text, finish_reason: c.choices[0].finish_reason,
           completion_tokens: c.usage.completion_tokens, system_fingerprint: c.system_fingerprint };
}

async function refused(extra) {
  try {
    await client.completions.create({ model, prompt, max_tokens: 4, ...extra });
    return 'accepted';
  } catch (e) {
    return { status: e.status, param: e.param };
  }
}

(async () => {
  const out = {};
  // Unseeded at temperature 1: fresh samples; seeded: the same twice.
  const sample = { max_tokens: 24, temperature: 1 };
  out.unseeded = [];
  for (let i = 0; i < 3; ++i) out.unseeded.push((await completion(sample)).text);
  out.seeded = [(await completion({ ...sample, seed: 1234 })).text,
                (await completion({ ...sample, seed: 1234 })).text];
  const messages = [{ role: 'user', content: prompt }];
  out.chat_unseeded = [];
  for (let i = 0; i < 3; ++i) {
    const c = await client.chat.completions.create({ model, messages, ...sample, ignore_eos: true });
    out.chat_unseeded.push(c.choices[0].message.content);
  }
  out.min_p_refused = await refused({ min_p: 0.1 });
  // The extensions that reach the sampler (also run by a disaggregated
  // deployment, whose answers the test compares with the co-located ones).
  out.min_p = await completion({ max_tokens: 6, temperature: 1, min_p: 0.2, seed: 3 });
  out.repetition_penalty = await completion({ temperature: 0, max_tokens: 16,
                                              repetition_penalty: 1.5 });
  out.sampled = await completion({ max_tokens: 6, temperature: 1, seed: 3 });
  out.min_tokens = await completion({ temperature: 0, max_tokens: 6,
                                      stop_token_ids: [greedyIds[0]], min_tokens: 4 });
  if (mode === 'seeds-only') {
    process.stdout.write(JSON.stringify(out));
    return;
  }
  const greedy = { temperature: 0 };
  // stop_token_ids: generation ends at the first id not seen before, index k.
  let k = 1;
  while (k < greedyIds.length - 1 && greedyIds.slice(0, k).includes(greedyIds[k])) ++k;
  out.stop_index = k;
  out.stop = await completion({ ...greedy, max_tokens: 8, stop_token_ids: [greedyIds[k]] });
  out.stop_included = await completion({ ...greedy, max_tokens: 8, stop_token_ids: [greedyIds[k]],
                                         include_stop_str_in_output: true });
  out.greedy_k = await completion({ ...greedy, max_tokens: k });
  out.greedy_k1 = await completion({ ...greedy, max_tokens: k + 1 });
  out.stop_out_of_vocab = await refused({ stop_token_ids: [1 << 30] });
  // min_tokens: the first greedy token as a stop id ends at once without it.
  out.stop_first = await completion({ ...greedy, max_tokens: 6, stop_token_ids: [greedyIds[0]] });
  // A stop string with include_stop_str_in_output: the text ends with it.
  const text8 = (await completion({ ...greedy, max_tokens: 8 })).text;
  out.text8 = text8;
  out.stop_str = text8.length > 4 ? text8.slice(2, 4) : null;
  if (out.stop_str) {
    out.stop_str_included = await completion({ ...greedy, max_tokens: 8, stop: [out.stop_str],
                                               include_stop_str_in_output: true });
  }
  // max_completion_tokens on /v1/completions, no max_tokens.
  out.max_completion_tokens = await completion({ ...greedy, max_completion_tokens: 5 });
  out.guided_json = await refused({ guided_json: { type: 'object' } });
  // GET /v1/models/{id}.
  out.model = await client.models.retrieve(model);
  try {
    await client.models.retrieve('no-such-model');
    out.missing_model = 'found';
  } catch (e) {
    out.missing_model = { status: e.status };
  }
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 2 });
  out.chat_id = chat.id;
  out.chat_fingerprint = chat.system_fingerprint;
  process.stdout.write(JSON.stringify(out));
})().catch((e) => {
  // Exit 0 so the test sees the reason.
  process.stdout.write(JSON.stringify({ fatal: String(e && e.stack || e) }));
});
