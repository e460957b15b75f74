// Encodes and decodes a corpus with @lenml/tokenizers (a JS port of the HF
// tokenizers used by transformers.js): the independent implementation our
// tokenizer is compared with. Usage:
//   node js_tokenize.js LENML_TOKENIZERS_MAIN_JS TOKENIZER_DIR < corpus.json > out.json
// corpus.json: a JSON list of strings; out.json: [{"ids": [...], "text": "..."}].
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require(path.resolve(process.argv[2]));
const dir = process.argv[3];
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
let tokenizerConfig = {};
const cfgPath = path.join(dir, "tokenizer_config.json");
if (fs.existsSync(cfgPath)) tokenizerConfig = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const corpus = JSON.parse(fs.readFileSync(0, "utf8"));
const out = corpus.map((text) => {
  const ids = tok.encode(text);
  return { ids, text: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "" };
});
process.stdout.write(JSON.stringify(out));
