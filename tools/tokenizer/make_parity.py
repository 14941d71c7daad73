#!/usr/bin/env python3
"""Parity fixtures for plumb's tokenizer: trains small byte-level BPE tokenizers with DeepSeek-V3/V4's
pre-tokenizer, decoder and special tokens using the Python `tokenizers` package (0.23), and writes the
reference ids and decodes of a test corpus.

    python3 tools/tokenizer/make_parity.py --out OUT            # needs `tokenizers`; no network
    python3 tools/tokenizer/make_parity.py --install OUT tests/data/tokenizer/parity
    python3 tools/tokenizer/make_parity.py --corpus-only DIR    # train.txt + corpus.txt, no `tokenizers`

--out writes 7 files (each well under 16 MB): tok-a.json tok-b.json tok-c.json corpus.txt expected-a.txt
expected-b.txt expected-c.txt. --install lays them out as parity/py-<x>/{tokenizer.json,corpus.txt,expected.txt},
the layout tests/unit/test_tokenizer.cpp (TokenizerParity) reads.

Line formats (see src/text/escape.h): corpus.txt has one escaped text per line (\\\\ \\n \\t \\r and \\xHH for
other ASCII control bytes; all else literal UTF-8). expected-*.txt has, per corpus line,
    <ids, add_special_tokens=False> TAB <ids, add_special_tokens=True> TAB <escaped decode(ids, False)>
with ids space-separated. Every corpus line is valid UTF-8 (Python str cannot carry invalid bytes, so the
reference has nothing to say about them; plumb's invalid-UTF-8 behaviour is covered by C++ unit tests).
"""
import argparse
import json
import os
import random
import shutil
import sys

# --- DeepSeek-V3/V4 tokenizer.json configuration (see tools/tokenizer/README.md for the source) ---------------
SPLIT_DIGITS = "\\p{N}{1,3}"
SPLIT_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
SPLIT_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
              "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
              "| ?[\\p{P}\\p{S}]+[\r\n]*"
              "|\\s*[\r\n]+"
              "|\\s+(?!\\S)"
              "|\\s+")
BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
PAD = "<\uff5c\u2581pad\u2581\uff5c>"
# Added after the vocab, in DeepSeek's order (special=True unless listed in NON_SPECIAL).
CHAT_TOKENS = [
    "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581end\uff5c>",
    "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>", "<|EOT|>",
    "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>",
    "<\uff5ctool\u2581outputs\u2581begin\uff5c>", "<\uff5ctool\u2581outputs\u2581end\uff5c>",
    "<\uff5ctool\u2581output\u2581begin\uff5c>", "<\uff5ctool\u2581output\u2581end\uff5c>",
    "<\uff5ctool\u2581sep\uff5c>", "<\uff5cplace\u2581holder\u2581no\u25810\uff5c>",
    "<think>", "</think>", "<\uff5cDSML\uff5c>",
]
NON_SPECIAL = {"<think>", "</think>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>", "<|EOT|>"}


def pre_tokenizer_json():
    split = lambda pat: {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [
        split(SPLIT_DIGITS), split(SPLIT_CJK), split(SPLIT_MAIN),
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


# --- escaping (must match src/text/escape.cpp) ----------------------------------------------------------------
def escape(s):
    out = []
    for ch in s:
        o = ord(ch)
        if ch == "\\": out.append("\\\\")
        elif ch == "\n": out.append("\\n")
        elif ch == "\t": out.append("\\t")
        elif ch == "\r": out.append("\\r")
        elif o < 0x20 or o == 0x7F: out.append("\\x%02X" % o)
        else: out.append(ch)
    return "".join(out)


def unescape(line):
    out = bytearray()
    i = 0
    while i < len(line):
        c = line[i]
        if c != "\\":
            out += c.encode("utf-8"); i += 1; continue
        e = line[i + 1]
        if e == "x":
            out.append(int(line[i + 2:i + 4], 16)); i += 4; continue
        out += {"\\": b"\\", "n": b"\n", "t": b"\t", "r": b"\r"}[e]; i += 2
    return bytes(out)


# --- corpus ---------------------------------------------------------------------------------------------------
WORDS = {
    "en": "the quick brown fox jumps over lazy dog tokenizer engine model inference weights tensor layer "
          "attention expert router cache token sequence prompt answer question because however people "
          "don't can't I'm we're they've she'll he'd it's John's", 
    "code": "def return import from class self None True False int main void const auto std::vector "
            "for while if else {} () [] => -> == != <= >= += && || printf(\"%d\\n\", x); #include <stdio.h> "
            "x = y + 1; arr[i] = f(a, b); // comment /* block */ 0x1F 3.14159 1e-9 snake_case camelCase",
    "de": "Grüße Straße Mädchen schön über Häuser Fußgängerübergänge Bäcker Öffnungszeiten",
    "fr": "déjà vu café naïve élève où été Noël français à côté garçon œuvre",
    "ru": "Привет мир как дела спасибо пожалуйста Москва программирование нейронная сеть",
    "el": "Καλημέρα κόσμε ευχαριστώ παρακαλώ Αθήνα αλφάβητο ωμέγα",
    "ar": "مرحبا بالعالم شكرا من فضلك القاهرة الذكاء الاصطناعي",
    "he": "שלום עולם תודה בבקשה ירושלים בינה מלאכותית",
    "hi": "नमस्ते दुनिया धन्यवाद कृपया दिल्ली कृत्रिम बुद्धिमत्ता हिन्दी",
    "th": "สวัสดีชาวโลก ขอบคุณ กรุงเทพมหานคร ภาษาไทย ปัญญาประดิษฐ์",
    "zh": "你好世界 谢谢 请问 北京 人工智能 深度学习 模型 推理 中华人民共和国 自然语言处理",
    "ja": "こんにちは世界 ありがとう 東京 カタカナ ひらがな 漢字 日本語の文章です コンピューター",
    "ko": "안녕하세요 세계 감사합니다 서울 인공지능 한국어 문장",
    "emoji": "😀 😂 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇺🇸 🇯🇵 ✨ 🔥 🚀 👋🏿",
    "num": "0 1 12 123 1234 12345 3.14 2024-01-31 1,000,000 ٣٤٥ １２３ ² ½ Ⅻ 10:30 $99.99 50%",
}
HANDCRAFTED = [
    "", " ", "  ", "\t", "\n", "\r\n", "a", "Hello, world!", "Hello world", " Hello", "Hello ", "hello  world",
    "I'm don't WE'LL it's O'Neil", "   leading spaces", "trailing spaces   ", "tabs\tand\tspaces \t mixed",
    "line1\nline2\r\nline3\rline4", "\n\n\n", "  \n  \n", "a\n\n  b", "x \n y", "end with newline\n",
    "1234567890", "3.14159265358979", "a1b22c333d4444", "v1.2.3-rc4", "١٢٣٤٥", "１２３４", "²³¹", "ⅫⅣ",
    "def f(x):\n    return x ** 2  # square\n", "if (a && b) { c = d[0]; }", "<html><body>hi</body></html>",
    "path/to/file.txt C:\\Users\\me", "https://example.com/a?b=c&d=e#f", "email: a.b@c.de",
    "Grüße aus Köln – “quoted” ‘single’ «guillemets» …", "e\u0301lan vs élan (NFD vs NFC)", "naïve façade",
    "Привет, мир! Как дела?", "Καλημέρα!", "مرحبا، كيف حالك؟", "שָׁלוֹם", "नमस्ते, दुनिया!", "ภาษาไทยง่ายนิดเดียว",
    "你好，世界！", "中文English混合mixed文本", "東京タワーに行きました。", "ｶﾀｶﾅ半角", "한국어 텍스트입니다.",
    "😀😀😀", "👩‍💻 coding", "👍🏽👍🏿", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵", "❤️‍🔥", "#️⃣ keycap", "a\u200db", "zero\u200bwidth",
    "\u00a0nbsp\u00a0", "\u3000ideographic\u3000space", "\u2028line sep\u2029para sep", "\u0085nel", "\u180emvs",
    "ctrl\x00nul\x01\x1f\x7fdel", "\x0bvt\x0cff", "ſt Kelvin İstanbul ß", "ﬁ ligature", "\ufffd replacement",
    "\U0001d400\U0001d401 math bold", "\U00020000 CJK ext B", "\U0002EBF0 CJK ext I", "\ue000 private use",
    "a" * 300, "ab" * 200, " " * 100, "\t" * 50 + "x", "\n" * 40, "9" * 301, "的" * 200, "!" * 99, "😀" * 60,
    "' s 's 'S 'll 'LL 've", "!!!???...,,,;;;", "a!b@c#d$e%f^g&h*i(j)k", "@@user #hashtag $TICKER",
    "--flag=value -x", "~/.bashrc", "`code`", "**bold** _it_ ~~strike~~", "|table|row|", "1+1=2", "x^2+y^2",
]


def special_lines():
    u, a = "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"
    return [
        BOS + u + "Hello!" + a + "<think>\nLet me think.\n</think>\n\nHi there." + EOS,
        BOS + BOS + EOS + EOS, u + a + u + a, "<think></think>", " <think> x </think> ",
        "text" + u + "text", "<\uff5cUser", "<\uff5cUser\uff5c", "\uff5cUser\uff5c>", "<<\uff5cUser\uff5c>>",
        "<think", "think>", "<thinking>", "<think><think>", "</think></think>x", "<|EOT|>", "<|EOT|",
        u + " " + a + "\n" + PAD, "a<\uff5ctool\u2581call\u2581begin\uff5c>f(x)<\uff5ctool\u2581call\u2581end\uff5c>b",
        "<\uff5cplace\u2581holder\u2581no\u25810\uff5c><\uff5cplace\u2581holder\u2581no\u25811\uff5c>",
        "<\uff5cDSML\uff5c>invoke name=\"f\"", "x" + BOS + "1" + EOS + "2",
        # variant c's lstrip/rstrip, normalized and single_word tokens
        "a <|lr|> b", "  <|lr|>  ", "x<|lr|>y", "<|lr|><|lr|>", "\t<|lr|>\n\n", "<think> <|lr|> </think>",
        "<norm>", "a<norm>b", " <norm> ", "<norm><|lr|><norm>", "wordtok", "a wordtok b", "awordtok",
        "wordtok_x", "wordtok.", "(wordtok)", "wordtok1", "éwordtok", "wordtok wordtok",
    ]


def random_lines(rnd, n):
    pool = list("abcdeXYZ zs'tmdrevlST0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + \
        [" ", " ", "\t", "\n", "\r", "\x0b", "\x85", "\xa0", "\u1680", "\u180e", "\u2000", "\u200b", "\u2028",
         "\u3000", "\x00", "\x7f"] + list("\u0301\u0300\u0308\u064e\u093f\u0e31") + \
        list("一龥龦ぁゟ゠ヿㇰ中文字のカタ漢가힣ㄱ") + list("مرحبا שלום नमस्ते ภาษา Привет Ωμέγα ſKİß") + \
        ["\U0001F600", "\U0001F3FB", "\u200d", "\ufe0f", "\U0001F468", "\u2764"] + list("٣１²Ⅻ½€©™°×∞←♥") + \
        [BOS, "<\uff5cUser\uff5c>", "<think>", "</think>"]
    out = []
    for _ in range(n):
        k = rnd.randint(0, 40)
        sub = rnd.sample(pool, 8) if rnd.random() < 0.4 else pool
        out.append("".join(rnd.choice(sub) for _ in range(k)))
    return out


def sentence(rnd, lang):
    words = WORDS[lang].split()
    sep = "" if lang in ("zh", "ja") and rnd.random() < 0.5 else " "
    s = sep.join(rnd.choice(words) for _ in range(rnd.randint(3, 14)))
    end = rnd.choice([".", "!", "?", "", ",", ":", "。", "\n", "  ", "\t"])
    return s + end


def make_texts(seed=1234):
    """-> (training lines, test lines); deterministic."""
    rnd = random.Random(seed)
    langs = list(WORDS)
    train = []
    for _ in range(6000):
        train.append(" ".join(sentence(rnd, rnd.choice(langs)) for _ in range(rnd.randint(1, 4))))
    train += HANDCRAFTED * 3
    tests = list(HANDCRAFTED) + special_lines()
    tests += [" ".join(sentence(rnd, rnd.choice(langs)) for _ in range(rnd.randint(1, 3))) for _ in range(600)]
    tests += random_lines(rnd, 1500)
    # Line-based files: a test line is one text; newlines inside it are escaped, so nothing is lost.
    return train, tests


def write_corpus(path, tests):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for t in tests:
            f.write(escape(t) + "\n")


# --- training + reference outputs (Python tokenizers) -----------------------------------------------------------
def bpe_setup(vocab_size):
    """An untrained byte-level BPE tokenizer with DeepSeek's normalizer, pre-tokenizer and decoder, and the trainer
    that makes BOS, EOS, PAD ids 0, 1, 2 (also tools/bundled/train_tiny.py's tokenizer)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_DIGITS), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_CJK), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_MAIN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in (BOS, EOS, PAD)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok, trainer


def build(variant, train_lines):
    from tokenizers import AddedToken, processors
    tok, trainer = bpe_setup({"a": 1000, "b": 2000, "c": 3000}[variant])
    tok.train_from_iterator(train_lines, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=t not in NON_SPECIAL, normalized=False) for t in CHAT_TOKENS])
    if variant == "c":
        # Flags DeepSeek does not use but hf supports: exercised so plumb's handling is checked too.
        tok.add_tokens([AddedToken("<|lr|>", special=False, lstrip=True, rstrip=True, normalized=False),
                        AddedToken("<norm>", special=False, normalized=True),
                        AddedToken("wordtok", special=False, single_word=True, normalized=False)])
    bos_id = tok.token_to_id(BOS)
    if variant == "a":
        tok.post_processor = processors.TemplateProcessing(single=BOS + " $A", pair=BOS + " $A " + BOS + " $B",
                                                           special_tokens=[(BOS, bos_id)])
    elif variant == "b":
        # What DeepSeek's own tokenizer.json appears to ship: ByteLevel (BOS then comes from transformers).
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=BOS + " $A " + EOS, special_tokens=[(BOS, bos_id), (EOS,
                                                                                    tok.token_to_id(EOS))])])
    return tok


def patch_json(path, variant):
    """b: merges in the old "a b" string form (plumb reads both forms); c: ignore_merges on."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    if variant == "b":
        j["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1] for m in j["model"]["merges"]]
    if variant == "c":
        j["model"]["ignore_merges"] = True
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)


def write_expected(tok, tests, path):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for t in tests:
            ids = tok.encode(t, add_special_tokens=False).ids
            ids_sp = tok.encode(t, add_special_tokens=True).ids
            dec = tok.decode(ids, skip_special_tokens=False)
            f.write("%s\t%s\t%s\n" % (" ".join(map(str, ids)), " ".join(map(str, ids_sp)), escape(dec)))


def run_out(out):
    import tokenizers
    print("tokenizers", tokenizers.__version__, file=sys.stderr)
    os.makedirs(out, exist_ok=True)
    train, tests = make_texts()
    write_corpus(os.path.join(out, "corpus.txt"), tests)
    # Round-trip the corpus through the escaped form so the reference sees exactly what plumb will read.
    with open(os.path.join(out, "corpus.txt"), encoding="utf-8", newline="\n") as f:
        tests = [unescape(l.rstrip("\n")).decode("utf-8") for l in f]
    for v in "abc":
        tok = build(v, train)
        jpath = os.path.join(out, "tok-%s.json" % v)
        tok.save(jpath, pretty=True)
        patch_json(jpath, v)
        tok = type(tok).from_file(jpath)  # what is on disk is what gets checked
        write_expected(tok, tests, os.path.join(out, "expected-%s.txt" % v))
    for name in sorted(os.listdir(out)):
        size = os.path.getsize(os.path.join(out, name))
        print("%-16s %9d bytes" % (name, size), file=sys.stderr)
        assert size < 16 * 1024 * 1024


def run_install(src, dst):
    for v in "abc":
        d = os.path.join(dst, "py-%s" % v)
        os.makedirs(d, exist_ok=True)
        shutil.copyfile(os.path.join(src, "tok-%s.json" % v), os.path.join(d, "tokenizer.json"))
        shutil.copyfile(os.path.join(src, "corpus.txt"), os.path.join(d, "corpus.txt"))
        shutil.copyfile(os.path.join(src, "expected-%s.txt" % v), os.path.join(d, "expected.txt"))
        print("installed", d)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="train and write the fixtures here (needs tokenizers)")
    g.add_argument("--install", nargs=2, metavar=("OUT", "PARITY_DIR"), help="lay OUT out as parity/py-*/")
    g.add_argument("--corpus-only", metavar="DIR", help="write train.txt and corpus.txt only")
    a = ap.parse_args()
    if a.out:
        run_out(a.out)
    elif a.install:
        run_install(*a.install)
    else:
        os.makedirs(a.corpus_only, exist_ok=True)
        train, tests = make_texts()
        with open(os.path.join(a.corpus_only, "train.txt"), "w", encoding="utf-8", newline="\n") as f:
            for t in train:
                f.write(t.replace("\r", " ").replace("\n", " ").replace("\u2028", " ").replace("\u2029", " ")
                        .replace("\x85", " ") + "\n")
        write_corpus(os.path.join(a.corpus_only, "corpus.txt"), tests)


if __name__ == "__main__":
    main()
