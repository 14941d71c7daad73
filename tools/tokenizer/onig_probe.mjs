// Prints every code point that hf tokenizers' regex engine (Oniguruma, via the npm `tokenizers` package, the
// same Rust core as the Python one) matches with the one-character pattern argv[2], one decimal per line.
// Used by gen_unicode_delta.sh. Setup: npm install --prefix /tmp/hftok tokenizers@0.23.2
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const tk = require(process.env.HF_TOKENIZERS_NODE || '/tmp/hftok/node_modules/tokenizers');

const pattern = process.argv[2];
const json = {
  version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
  pre_tokenizer: { type: 'Split', pattern: { Regex: pattern }, behavior: 'Removed', invert: false },
  post_processor: null, decoder: null, model: { type: 'BPE', vocab: { a: 0 }, merges: [] },
};
const pt = tk.Tokenizer.fromString(JSON.stringify(json)).getPreTokenizer();
const hits = [];
// Removed drops what matches: a code point missing from the kept spans (char offsets) matched the pattern.
for (let base = 0; base < 0x110000; base += 0x4000) {
  const cps = [];
  for (let c = base; c < base + 0x4000; c++) if (c < 0xd800 || c >= 0xe000) cps.push(c);
  const keep = new Uint8Array(cps.length);
  for (const [, [a, b]] of pt.preTokenizeString(String.fromCodePoint(...cps))) keep.fill(1, a, b);
  for (let k = 0; k < cps.length; k++) if (!keep[k]) hits.push(cps[k]);
}
process.stdout.write(hits.join('\n') + '\n');
