#!/usr/bin/env python3
"""Trains small tokenizers and writes the ids the Python packages give, for tokenizer_test.

  hf_tokenize.py OUT_DIR

Writes OUT_DIR/<name>/ (a model directory: tokenizer.json or tokenizer.model, plus
tokenizer_config.json) and OUT_DIR/<name>/expected.json:
  {"encode": [{"text", "ids", "decoded", "has_added_tokens" (HF only)}], "decode": [{"ids", "text"}],
   "vocab_size": int, "special": {"bos", "eos", "pad"}}
for these tokenizers, all trained here on a small multilingual corpus:
  (HF: the SAMPLES below, then 400 random strings over FUZZ_POOL.)
  llama3          byte-level BPE, Split(Llama-3 pattern) + ByteLevel(use_regex=False),
                  ignore_merges (as Llama-3's tokenizer.json)
  llama3_legacy   the same file with merges written as "a b" strings
  qwen2           NFC + Split(Qwen2 pattern) + ByteLevel(use_regex=False)
  gpt2            ByteLevel(use_regex=True), add_prefix_space=False
  gpt2_prefix     ByteLevel(use_regex=True), add_prefix_space=True
  sentencepiece   a unigram SentencePiece model (byte_fallback), and
  sentencepiece_bpe  a BPE one
Ids are those of `tokenizers` encode(text, add_special_tokens=False) and
decode(ids, skip_special_tokens=False), and of sentencepiece encode/decode.
"""
import io
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pt
from tokenizers import trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<pad>", "<|é|>"]

SAMPLES = [
    "",
    "x",
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Héllo wörld! Ça va? Déjà vu, naïve café, Ærøskøbing, São Paulo, Łódź.",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "नमस्ते दुनिया, आप कैसे हैं? हिन्दी में लिखा गया वाक्य।",
    "你好，世界！今天天气很好。日本語のテキストも、カタカナも。한국어 문장입니다.",
    "مرحبا بالعالم! كيف حالك؟ هذه جملة عربية.",
    "שלום עולם. Ελληνικά γράμματα. ქართული ენა. ไทย ภาษา",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 😀😀😀 🇫🇷🇩🇪 1️⃣ ✌🏿",
    "Numbers: 1234567 3.14159 12,345.67 0000000000 ٣٤٥٦ १२३४ ５６７ ½ Ⅻ ²³",
    "  leading spaces\tand\ttabs   between    words   ",
    "line1\r\nline2\n\n\nline3 \n \n\t\nend\n",
    "trailing newline\n",
    "   ",
    "\n",
    "I'm you're he'll she'd they've we'RE IT'S don't 'tis o'clock rock'n'roll 'S 'Ll",
    "don'ſt 'ſ",
    "<|begin_of_text|>Hello<|eot_id|> <|eot_id|>\n<|end_of_text|><|é|>x<pad><pad>",
    "text<|eot_id|>more text <|begin_of_text|> spaced",
    "<|begin_of_text|",
    "Café au lait and Cafe\u0301 au lait, e\u0301 vs \u00e9, A\u030a vs \u00c5, \ufb01 ligature, \u1e9b\u0323",
    "def f(x):\n    return x**2  # comment\n\nclass A:\n\tpass\n",
    "mixed123abc___---...!!!   ;;; ))) [[[ ]]] {} <> @#$%^&*",
    "a\u00a0b\u3000c\u2003d\u200be\u2028f\u0085g\u000bh\u000ci",
    "ctrl\x00\x01\x1f\x7f chars",
    "\U0001f600 \U00020000 \U0010ffff \ue000",
    "nbsp\u00a0\u00a0before and after\u00a0",
    "UPPER lower MiXeD ÀÉÎÕÜ àéîõü",
]

CORPUS_EXTRA = [
    "The history of all hitherto existing society is the history of class struggles.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Мороз и солнце; день чудесный! Ещё ты дремлешь, друг прелестный.",
    "सत्यमेव जयते। भारत एक विशाल देश है। यहाँ अनेक भाषाएँ बोली जाती हैं।",
    "学而时习之，不亦说乎？有朋自远方来，不亦乐乎？人不知而不愠，不亦君子乎？",
    "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。",
    "اللغة العربية هي أكثر اللغات تحدثا ونطقا ضمن مجموعة اللغات السامية.",
    "Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque?",
    "Über allen Gipfeln ist Ruh, in allen Wipfeln spürest du kaum einen Hauch.",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 42",
]


def corpus():
    lines = SAMPLES + CORPUS_EXTRA
    return [l for l in lines if l] * 5


def train_hf(pre_tokenizer, normalizer=None, ignore_merges=False, vocab_size=900):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pt.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    # An added (not special) token matched after normalization, and a special one with lstrip.
    tok.add_tokens([AddedToken("Café au lait", normalized=True)])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    return tok


# Characters of every class the split patterns tell apart, for random strings.
FUZZ_POOL = list("aZé'sStTrRevVmMlLdD ſ") + list("  \t\r\n\u00a0\u3000\u0085\u000b") + \
    list("0123٣½") + list(".,!?-_'\"()") + ["Ж", "न", "\u094d", "\u0947", "中", "👍", "\u200d",
                                         "\u0301", "\x00", "ß"]


def fuzz_texts(n=400):
    rng = random.Random(1)
    return ["".join(rng.choice(FUZZ_POOL) for _ in range(rng.randrange(1, 24))) for _ in range(n)]


def hf_expected(tok):
    encode = []
    texts = SAMPLES + [" <mask> and\t<mask>", "\n".join(SAMPLES)] + fuzz_texts()
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        added = any(t in text for t in SPECIAL + ["<mask>", "Café au lait"])
        encode.append({"text": text, "ids": ids, "has_added_tokens": added,
                       "decoded": tok.decode(ids, skip_special_tokens=False)})
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(vocab.values()) + 1
    rng = random.Random(0)
    decode_ids = [[rng.randrange(vocab_size) for _ in range(n)] for n in (1, 2, 5, 30, 30, 30)]
    # Partial UTF-8: the first byte tokens of multi-byte characters.
    decode_ids.append([vocab[c] for c in ("Ã", "Ð", "à") if c in vocab])
    decode_ids.append([tok.token_to_id(s) for s in SPECIAL])
    decode = [{"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)} for ids in decode_ids]
    special = {"bos": tok.token_to_id("<|begin_of_text|>"), "eos": tok.token_to_id("<|eot_id|>"),
               "pad": tok.token_to_id("<pad>")}
    return {"encode": encode, "decode": decode, "vocab_size": vocab_size, "special": special}


def write_hf(out, name, tok, legacy_merges=False):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    data = json.loads(tok.to_str())
    if legacy_merges:
        data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
        tok = Tokenizer.from_str(json.dumps(data))
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<|begin_of_text|>",
                   "eos_token": {"content": "<|eot_id|>", "special": True},
                   "pad_token": "<pad>"}, f)
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(hf_expected(tok), f, ensure_ascii=False)


def write_sentencepiece(out, name, model_type):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, model_type=model_type,
        vocab_size=700, hard_vocab_limit=False, character_coverage=0.9995, byte_fallback=True,
        pad_id=3, user_defined_symbols=["<|eot_id|>"], minloglevel=2)
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    encode = []
    for text in SAMPLES + ["\n".join(SAMPLES)]:
        ids = sp.encode(text)
        encode.append({"text": text, "ids": ids, "decoded": sp.decode(ids)})
    rng = random.Random(0)
    decode_ids = [[rng.randrange(sp.get_piece_size()) for _ in range(n)] for n in (1, 5, 30, 30)]
    decode = [{"ids": ids, "text": sp.decode(ids)} for ids in decode_ids]
    expected = {"encode": encode, "decode": decode, "vocab_size": sp.get_piece_size(),
                "special": {"bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id()}}
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


def main():
    out = sys.argv[1]
    split = lambda pattern: pt.Split(Regex(pattern), behavior="isolated", invert=False)
    byte_level = pt.ByteLevel(add_prefix_space=False, use_regex=False)

    llama3 = train_hf(pt.Sequence([split(LLAMA3), byte_level]), ignore_merges=True)
    write_hf(out, "llama3", llama3)
    write_hf(out, "llama3_legacy", llama3, legacy_merges=True)
    write_hf(out, "qwen2", train_hf(pt.Sequence([split(QWEN2), byte_level]),
                                     normalizer=normalizers.NFC()))
    write_hf(out, "gpt2", train_hf(pt.ByteLevel(add_prefix_space=False, use_regex=True)))
    write_hf(out, "gpt2_prefix", train_hf(pt.ByteLevel(add_prefix_space=True, use_regex=True)))
    write_sentencepiece(out, "sentencepiece", "unigram")
    write_sentencepiece(out, "sentencepiece_bpe", "bpe")


if __name__ == "__main__":
    main()
