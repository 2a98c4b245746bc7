#!/usr/bin/env python3
"""Golden chrF / chrF++ scores from sacrebleu for engine/eval/chrf_test.cc.

Generates N (default 400) reference/hypothesis pairs from a seeded RNG, in many scripts
(Latin with diacritics, Cyrillic, Greek, Arabic, Devanagari, Han, Thai, Hangul, emoji),
with punctuation glued to words and assorted Unicode whitespace, and hypotheses derived
from the references by word drops, swaps, substitutions and character edits (plus a few
empty or unrelated ones). Writes one JSON object:
  {"pairs": [{"hyp": ..., "refs": [ref, ref2]}, ...],
   "scores": {"<variant>": {"corpus": x, "corpus2": x, "sentence": [x, ...]}}}
where variants are chrF, chrF++, chrF_ws (whitespace=True), chrF++_eps (eps_smoothing),
"corpus" uses the first reference, "corpus2" both reference streams, and "sentence" the
sentence scores against the first reference.

usage: eval_chrf.py --out FILE [--n N] [--seed S]
"""
import argparse
import json
import random

from sacrebleu.metrics import CHRF

ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzàéîõüçñß",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяієїґ",
    "αβγδεζηθικλμνξοπρστυφχψωάέή",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशसह्ािीुूेैोौं",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "กขคงจฉชซญดตถทธนบปผพฟภมยรลวศสหอะาิีึืุูเแโใไ่้๊๋",
    "가나다라마바사아자차카타파하각난닫랄맘밥삿앙잦찿",
    "😀🎉🚀❤️👍🏽",
]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["«", "»", "—", "…", "¿", "。", "，"]
SPACES = [" "] * 20 + ["  ", "\t", "\u00a0", "\u3000", "\u2009", "\n", "\u202f", "\u1680"]


def word(rng, alphabet):
    w = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7)))
    r = rng.random()
    if r < 0.15:
        w += rng.choice(PUNCT)
    elif r < 0.25:
        w = rng.choice(PUNCT) + w
    elif r < 0.3:
        w = rng.choice(PUNCT)
    return w


def join(rng, words):
    out = ""
    for i, w in enumerate(words):
        if i:
            out += rng.choice(SPACES)
        out += w
    if rng.random() < 0.1:
        out = rng.choice(SPACES) + out + rng.choice(SPACES)
    return out


def mutate(rng, words, alphabet):
    words = list(words)
    for _ in range(rng.randint(0, 4)):
        op = rng.randrange(5)
        if not words:
            break
        i = rng.randrange(len(words))
        if op == 0 and len(words) > 1:
            del words[i]
        elif op == 1:
            j = rng.randrange(len(words))
            words[i], words[j] = words[j], words[i]
        elif op == 2:
            words[i] = word(rng, alphabet)
        elif op == 3 and words[i]:
            k = rng.randrange(len(words[i]))
            words[i] = words[i][:k] + rng.choice(alphabet) + words[i][k + 1:]
        else:
            words.insert(i, word(rng, alphabet))
    return words


def make_pairs(n, seed):
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        alphabet = rng.choice(ALPHABETS)
        if rng.random() < 0.2:  # mixed-script sentence
            alphabet = alphabet + rng.choice(ALPHABETS)
        ref_words = [word(rng, alphabet) for _ in range(rng.randint(1, 18))]
        r = rng.random()
        if r < 0.03:
            hyp = ""
        elif r < 0.06:
            hyp = join(rng, [word(rng, rng.choice(ALPHABETS)) for _ in range(rng.randint(1, 6))])
        else:
            hyp = join(rng, mutate(rng, ref_words, alphabet))
        ref = join(rng, ref_words)
        if rng.random() < 0.02:
            ref = ""
        ref2 = join(rng, mutate(rng, ref_words, alphabet))
        pairs.append({"hyp": hyp, "refs": [ref, ref2]})
    return pairs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pairs = make_pairs(args.n, args.seed)
    hyps = [p["hyp"] for p in pairs]
    refs1 = [p["refs"][0] for p in pairs]
    refs2 = [p["refs"][1] for p in pairs]
    variants = {
        "chrF": CHRF(),
        "chrF++": CHRF(word_order=2),
        "chrF_ws": CHRF(whitespace=True),
        "chrF++_eps": CHRF(word_order=2, eps_smoothing=True),
    }
    scores = {}
    for name, metric in variants.items():
        scores[name] = {
            "corpus": metric.corpus_score(hyps, [refs1]).score,
            "corpus2": metric.corpus_score(hyps, [refs1, refs2]).score,
            "sentence": [metric.sentence_score(h, [r]).score for h, r in zip(hyps, refs1)],
        }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"pairs": pairs, "scores": scores}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
