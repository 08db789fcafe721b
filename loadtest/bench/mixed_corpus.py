"""The mixed-length corpus of the token-batching benchmark: mostly short queries, some
paragraphs, a few inputs over the built-in model's 256-token limit.

`python3 -m loadtest.bench.mixed_corpus > loadtest/corpus/mixed-lengths.txt` regenerates the
shipped file (seeded: the same file every time). One text per line; `embatch-loadtest run
--corpus` samples lines uniformly, so the shares below are the shares of requests."""

from __future__ import annotations

import random
import sys

LINES = 2000
SEED = 2024
# (share of lines, words per line): short queries, paragraphs, over the model's limit.
SHORT, PARAGRAPH, OVER = (0.85, (3, 14)), (0.135, (40, 160)), (0.015, (260, 400))

WORDS = """the of and to in is was for on that with as by at from it an be this which or are
have not had but were they all their has been one there more when who would will can if about
so what out up into them some could time than other then these its two may only first new like
people over such how most after year years world city state water house night day life work
system model search vector query answer question river mountain music history science market
price report language network message stream library kitchen garden morning evening winter summer
coffee bread engine signal cluster document index paragraph sentence chapter story light shadow
street guitar weather forest ocean village school student teacher doctor hospital train station
airport ticket travel hotel restaurant dinner recipe chicken vegetables recommend compare explain
difference between best cheap fast near open today tomorrow weekend review price battery phone
laptop camera screen software update install error password account payment refund delivery order
customer service policy return warranty company revenue growth quarter interest rates inflation
central bank election government policy climate energy solar wind electric vehicle charging""".split()


def sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[0].upper() + text[1:]


def paragraph(rng: random.Random, words: int) -> str:
    out, left = [], words
    while left > 0:
        n = min(left, rng.randint(8, 20))
        out.append(sentence(rng, n) + ".")
        left -= n
    return " ".join(out)


def lines(seed: int = SEED, count: int = LINES) -> list[str]:
    rng = random.Random(seed)
    result = []
    for _ in range(count):
        r = rng.random()
        if r < SHORT[0]:
            text = sentence(rng, rng.randint(*SHORT[1])) + "?"
        elif r < SHORT[0] + PARAGRAPH[0]:
            text = paragraph(rng, rng.randint(*PARAGRAPH[1]))
        else:
            text = paragraph(rng, rng.randint(*OVER[1]))
        result.append(text)
    return result


if __name__ == "__main__":
    sys.stdout.write("\n".join(lines()) + "\n")
