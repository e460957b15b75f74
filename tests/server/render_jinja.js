// Renders a chat template with the reference renderer @huggingface/jinja.
// Usage: node render_jinja.js NODE_MODULES_DIR INPUT.json
// INPUT: {"template": "...", "contexts": [{...}, ...]}; prints a JSON array
// with, per context, {"text": rendered} or {"error": message}.
const path = require('path');
const fs = require('fs');
const { Template } = require(path.resolve(process.argv[2], '@huggingface', 'jinja'));
const input = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const template = new Template(input.template);
const out = input.contexts.map((c) => {
  try {
    return { text: template.render(c) };
  } catch (e) {
    return { error: String(e.message || e) };
  }
});
process.stdout.write(JSON.stringify(out));
