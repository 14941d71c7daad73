// Reference outputs from hf tokenizers' Rust core through its npm binding (`tokenizers` 0.23.2, the same core
// as the Python package), for machines where only npm is reachable (the project's dev machines and CI).
//   node node_oracle.mjs train TRAIN.txt VOCAB_SIZE VARIANT OUT.json   a DeepSeek-configured tokenizer.json
//       VARIANT tuple: [a, b] merges, TemplateProcessing(BOS $A); legacy: "a b" merges, ByteLevel post-processor
//       (as DeepSeek ships); flags: tuple + lstrip/rstrip, normalized and single_word added tokens,
//       ignore_merges, and a Sequence post-processor
//   node node_oracle.mjs expect TOKENIZER.json CORPUS.txt OUT.txt       expected.txt as make_parity.py writes it
// Setup: npm install --prefix /tmp/hftok tokenizers@0.23.2  (or set HF_TOKENIZERS_NODE to the package path)
// The node binding's train() only has the default BPE trainer, so `train` trains with it and keeps the first
// merges: greedy BPE makes that the model a smaller vocab_size would have produced.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const tk = require(process.env.HF_TOKENIZERS_NODE || '/tmp/hftok/node_modules/tokenizers');

const SPLIT_DIGITS = '\\p{N}{1,3}';
const SPLIT_CJK = '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+';
const SPLIT_MAIN = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+" +
  '|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+';
const BOS = '<\uff5cbegin\u2581of\u2581sentence\uff5c>';
const EOS = '<\uff5cend\u2581of\u2581sentence\uff5c>';
const PAD = '<\uff5c\u2581pad\u2581\uff5c>';
const CHAT = ['<\uff5cUser\uff5c>', '<\uff5cAssistant\uff5c>', '<|EOT|>', '<\uff5ctool\u2581call\u2581begin\uff5c>',
  '<\uff5ctool\u2581call\u2581end\uff5c>', '<\uff5cplace\u2581holder\u2581no\u25810\uff5c>', '<think>', '</think>',
  '<\uff5cDSML\uff5c>'];
const NON_SPECIAL = new Set(['<think>', '</think>', '<\uff5cUser\uff5c>', '<\uff5cAssistant\uff5c>', '<|EOT|>']);

const split = (re) => ({ type: 'Split', pattern: { Regex: re }, behavior: 'Isolated', invert: false });
const PRE = { type: 'Sequence', pretokenizers: [split(SPLIT_DIGITS), split(SPLIT_CJK), split(SPLIT_MAIN),
  { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] };
const DECODER = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };

function alphabet() {  // GPT-2 byte -> char, in byte order
  const out = []; let n = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    out.push(String.fromCodePoint(printable ? b : n++));
  }
  return out;
}

function train(trainPath, vocabSize, variant, outPath) {
  const base = { version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: PRE, post_processor: null, decoder: DECODER,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: {}, merges: [] } };
  const t = tk.Tokenizer.fromString(JSON.stringify(base));
  t.train([trainPath]);
  const tmp = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'oracle-')), 't.json');
  t.save(tmp);
  const trained = JSON.parse(fs.readFileSync(tmp, 'utf8'));
  const vocab = {}; let next = 0;
  for (const s of [BOS, EOS, PAD, ...alphabet()]) vocab[s] = next++;
  const merges = [];
  for (const m of trained.model.merges) {
    if (next >= vocabSize) break;
    const [a, b] = typeof m === 'string' ? m.split(' ') : m;
    if (vocab[a + b] !== undefined) continue;
    merges.push(variant === 'legacy' ? a + ' ' + b : [a, b]);
    vocab[a + b] = next++;
  }
  const added = [BOS, EOS, PAD].map((c, i) => ({ id: i, content: c, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: true }));
  CHAT.forEach((c, i) => added.push({ id: next + i, content: c, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: !NON_SPECIAL.has(c) }));
  if (variant === 'flags') {
    const extra = [['<|lr|>', { lstrip: true, rstrip: true }], ['<norm>', { normalized: true }],
      ['wordtok', { single_word: true }]];
    extra.forEach(([c, f], i) => added.push({ id: next + CHAT.length + i, content: c, single_word: false,
      lstrip: false, rstrip: false, normalized: false, special: false, ...f }));
  }
  const single = [{ SpecialToken: { id: BOS, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }];
  const template = { type: 'TemplateProcessing', single, pair: [...single, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { [BOS]: { id: BOS, ids: [0], tokens: [BOS] } } };
  const byteLevelPost = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true };
  const withEos = { type: 'TemplateProcessing',
    single: [...single, { SpecialToken: { id: EOS, type_id: 0 } }], pair: [...single, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { [BOS]: { id: BOS, ids: [0], tokens: [BOS] }, [EOS]: { id: EOS, ids: [1, 2], tokens: [EOS, PAD] } } };
  const json = { ...base, added_tokens: added,
    normalizer: { type: 'Sequence', normalizers: [] },
    post_processor: variant === 'legacy' ? byteLevelPost
      : variant === 'flags' ? { type: 'Sequence', processors: [byteLevelPost, withEos] } : template,
    model: { ...base.model, vocab, merges, ignore_merges: variant === 'flags' } };
  fs.writeFileSync(outPath, JSON.stringify(json));
}

function unescape(line) {  // -> Buffer (the escaped form of src/text/escape.h)
  const cs = Array.from(line); const out = [];
  for (let i = 0; i < cs.length; i++) {
    if (cs[i] !== '\\') { out.push(Buffer.from(cs[i], 'utf8')); continue; }
    const e = cs[++i];
    if (e === 'x') { out.push(Buffer.from([parseInt(cs[i + 1] + cs[i + 2], 16)])); i += 2; continue; }
    const m = { '\\': '\\', n: '\n', t: '\t', r: '\r' }[e];
    if (m === undefined) throw new Error('bad escape \\' + e);
    out.push(Buffer.from(m));
  }
  return Buffer.concat(out);
}

function escape(s) {
  let out = '';
  for (const ch of s) {
    const o = ch.codePointAt(0);
    if (ch === '\\') out += '\\\\'; else if (ch === '\n') out += '\\n'; else if (ch === '\t') out += '\\t';
    else if (ch === '\r') out += '\\r';
    else if (o < 0x20 || o === 0x7f) out += '\\x' + o.toString(16).toUpperCase().padStart(2, '0');
    else out += ch;
  }
  return out;
}

async function expect(tokPath, corpusPath, outPath) {
  const t = tk.Tokenizer.fromFile(tokPath);
  const lines = fs.readFileSync(corpusPath, 'utf8').split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  const out = [];
  for (const l of lines) {
    const buf = unescape(l);
    const s = buf.toString('utf8');
    if (!Buffer.from(s, 'utf8').equals(buf)) throw new Error('corpus line is not valid UTF-8: ' + l);
    const ids = (await t.encode(s, null, { addSpecialTokens: false })).getIds();
    const idsSp = (await t.encode(s, null, { addSpecialTokens: true })).getIds();
    const dec = await t.decode(ids, false);
    out.push(ids.join(' ') + '\t' + idsSp.join(' ') + '\t' + escape(dec));
  }
  fs.writeFileSync(outPath, out.join('\n') + '\n');
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'train') train(args[0], Number(args[1]), args[2], args[3]);
else if (cmd === 'expect') await expect(args[0], args[1], args[2]);
else { console.error('usage: node_oracle.mjs train|expect ...'); process.exit(2); }
