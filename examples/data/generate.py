"""Generate the synthetic product-review data set used by the quickstart, the tests and the benchmarks.

Reviews are composed from sentiment-bearing clauses (with negation: "is not great" is negative,
"is not flimsy at all" is positive), mild clauses, and neutral filler sentences that set a realistic,
long-tailed length. Like real reviews, many mix opinions: a positive review may name a flaw ("the
manual is poor, but I love the sound"), a neutral one may weigh a strength against a weakness, so
the classes share their vocabulary and only the balance of opinions tells them apart. A share of
the labels (`--noise`) is replaced by another class, as annotators disagree. Labels: 0 negative,
1 neutral, 2 positive; or, with `--classes 5`, star ratings 0 (one star) to 4 (five stars). The
output is deterministic for a given seed.

    python examples/data/generate.py examples/data               # the committed quickstart files
    python examples/data/generate.py /tmp/bench --mean-words 115 --train 4000 --eval 800
    python examples/data/generate.py /tmp/stars --classes 5 --train 1000 --eval 200
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

PRODUCTS = (
    "headphones",
    "blender",
    "backpack",
    "desk lamp",
    "coffee grinder",
    "phone case",
    "keyboard",
    "water bottle",
    "rice cooker",
    "office chair",
    "electric kettle",
    "yoga mat",
    "tent",
    "toaster",
    "monitor stand",
    "bike light",
    "vacuum cleaner",
    "hair dryer",
    "webcam",
    "air fryer",
    "drill",
    "running shoes",
    "rain jacket",
    "smart speaker",
    "baby monitor",
    "frying pan",
    "power bank",
)
ASPECTS = (
    "the battery life",
    "the sound",
    "the build quality",
    "the price",
    "the design",
    "the fit",
    "the setup",
    "the material",
    "the app",
    "the noise level",
    "the packaging",
    "the manual",
    "the motor",
    "the handle",
    "the display",
    "the zipper",
    "the cable",
    "the finish",
    "the grip",
)
STRONG_POSITIVE = (
    "excellent",
    "fantastic",
    "great",
    "superb",
    "wonderful",
    "impressive",
    "outstanding",
    "sturdy",
    "reliable",
    "brilliant",
    "perfect",
    "comfortable",
)
STRONG_NEGATIVE = (
    "terrible",
    "awful",
    "disappointing",
    "flimsy",
    "useless",
    "poor",
    "unreliable",
    "horrible",
    "broken",
    "defective",
    "uncomfortable",
    "cheaply made",
)
MILD_WORDS = (
    "okay",
    "average",
    "fine",
    "acceptable",
    "adequate",
    "ordinary",
    "standard",
    "passable",
    "unremarkable",
    "reasonable",
)
POSITIVE_CLAUSES = (
    "{aspect} is {pos}",
    "{aspect} is really {pos}",
    "{aspect} is not {neg} at all",
    "I love {aspect}",
    "I would definitely recommend this {product}",
    "this {product} exceeded my expectations",
    "I have no complaints about {aspect}",
    "it was worth every penny",
    "I am very happy with this {product}",
    "I would buy this {product} again",
    "{aspect} never lets me down",
)
NEGATIVE_CLAUSES = (
    "{aspect} is {neg}",
    "{aspect} is really {neg}",
    "{aspect} is not {pos} at all",
    "I hate {aspect}",
    "I would not recommend this {product}",
    "this {product} stopped working after {n} days",
    "I regret buying this {product}",
    "it was a complete waste of money",
    "I returned this {product} after {n} days",
    "I would never buy this {product} again",
    "{aspect} lets me down every time",
)
NEUTRAL_CLAUSES = (
    "{aspect} is {mild}",
    "{aspect} is {mild}, nothing more",
    "it does what it says",
    "this {product} is neither good nor bad",
    "it is an {mild} {product}",
    "{aspect} is about what I expected for the price",
    "I have mixed feelings about this {product}",
    "there is nothing special about {aspect}",
)
FILLER = (
    "I bought it for my {relative}.",
    "It arrived on a {weekday}.",
    "I have been using it for {n} weeks.",
    "The box contained the {product}, a manual and a cable.",
    "My {relative} uses it every {daypart}.",
    "I ordered the {color} one.",
    "I compared it with a few other {product}s before buying.",
    "We mostly use it in the {room}.",
    "I also bought a spare for the {room}.",
    "This is my {ordinal} {product} from this shop.",
    "I read the reviews before ordering.",
    "It came in a {color} box.",
    "I use it at work and at home.",
    "The delivery took {n} days.",
    "I charge it once a week.",
    "My old {product} was a different brand.",
    "I took it on a trip to the {place}.",
    "It is the {color} version.",
    "I keep it in the {room}.",
    "The instructions are in {n} languages.",
)
VOCAB = {
    "relative": ("sister", "brother", "father", "mother", "son", "daughter", "partner", "grandmother"),
    "weekday": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"),
    "daypart": ("morning", "evening", "afternoon", "weekend"),
    "color": ("black", "white", "blue", "grey", "green", "red", "silver"),
    "room": ("kitchen", "living room", "office", "garage", "bedroom", "car"),
    "ordinal": ("second", "third", "fourth", "first"),
    "place": ("coast", "mountains", "lake", "city", "countryside"),
}
CONNECTORS = ("Overall, ", "Honestly, ", "To be fair, ", "In short, ", "Also, ", "", "", "", "")
CONTRASTS = ("{a}, but {b}", "{a}; however, {b}", "Although {a}, {b}", "{a}, yet {b}", "{a}. Then again, {b}")
# Opinions of a review by sentiment score (-2 .. 2): (dominant clauses, contrary clauses), as ranges.
NEGATIVE, MILD, POSITIVE = NEGATIVE_CLAUSES, NEUTRAL_CLAUSES, POSITIVE_CLAUSES
# Sentiment scores of each class: three classes spread over the five scores, or one score per star.
SCORES = {3: ((-2, -2, -1), (0,), (1, 2, 2)), 5: ((-2,), (-1,), (0,), (1,), (2,))}


def _fill(template: str, rng: random.Random, product: str) -> str:
    values = {key: rng.choice(words) for key, words in VOCAB.items()}
    values.update(
        product=product,
        aspect=rng.choice(ASPECTS),
        pos=rng.choice(STRONG_POSITIVE),
        neg=rng.choice(STRONG_NEGATIVE),
        mild=rng.choice(MILD_WORDS),
        n=rng.randint(2, 14),
    )
    return template.format(**values)


def _sentence(clause: str, rng: random.Random) -> str:
    text = rng.choice(CONNECTORS) + clause
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "!"))


def _contrast(weaker: str, stronger: str, rng: random.Random) -> str:
    """One sentence that concedes `weaker` and ends on `stronger`."""
    return _sentence(rng.choice(CONTRASTS).format(a=weaker, b=stronger), rng)


def opinions(score: int, rng: random.Random, product: str, extra: int) -> list[str]:
    """The opinion sentences of a review with sentiment `score` (-2 .. 2), `extra` more for long reviews."""
    clause = lambda kind: _fill(rng.choice(kind), rng, product)  # noqa: E731 - a short local helper
    if score == 0:
        if rng.random() < 0.35:  # a strength weighed against a weakness, in either order
            good, bad = clause(POSITIVE), clause(NEGATIVE)
            first = [_contrast(good, bad, rng) if rng.random() < 0.5 else _contrast(bad, good, rng)]
        else:
            first = [_sentence(clause(MILD), rng)]
        return first + [_sentence(clause(MILD), rng) for _ in range(extra)]
    main, other = (POSITIVE, NEGATIVE) if score > 0 else (NEGATIVE, POSITIVE)
    found = [_sentence(clause(main), rng) for _ in range(rng.randint(1, 2) + extra)]
    if abs(score) == 1:  # a flaw (or a merit) conceded, then the verdict
        found.insert(rng.randint(0, len(found) - 1), _contrast(clause(other), clause(main), rng))
    elif rng.random() < 0.3:
        found.append(_sentence(clause(MILD), rng))
    return found


def review(rng: random.Random, score: int, mean_words: float) -> str:
    """One review of the given sentiment, about `mean_words` words long on average (long-tailed)."""
    product = rng.choice(PRODUCTS)
    # Log-normal length: most reviews are short, a few are very long; longer ones hold more opinions.
    target_words = min(420.0, rng.lognormvariate(math.log(mean_words) - 0.32, 0.8))
    sentences = opinions(score, rng, product, int(target_words // 60))
    while sum(len(s.split()) for s in sentences) < target_words:
        sentences.insert(rng.randint(0, len(sentences)), _fill(rng.choice(FILLER), rng, product))
    return " ".join(sentences)


def records(count: int, seed: int, mean_words: float, classes: int = 3, noise: float = 0.0) -> list[dict[str, object]]:
    """`count` labelled reviews with balanced classes, in random order; a share `noise` of labels is wrong."""
    rng = random.Random(seed)  # noqa: S311 - reproducible data, not cryptography
    labels = [i % classes for i in range(count)]
    rng.shuffle(labels)
    rows: list[dict[str, object]] = []
    for label in labels:
        text = review(rng, rng.choice(SCORES[classes][label]), mean_words)
        if rng.random() < noise:
            label = rng.choice([c for c in range(classes) if c != label])
        rows.append({"text": text, "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder for train.jsonl and eval.jsonl")
    parser.add_argument("--train", type=int, default=2000, help="training records")
    parser.add_argument("--eval", type=int, default=400, help="evaluation records")
    parser.add_argument("--mean-words", type=float, default=28.0, help="mean review length in words")
    parser.add_argument("--classes", type=int, choices=sorted(SCORES), default=3, help="3 sentiments or 5 stars")
    parser.add_argument("--noise", type=float, default=0.06, help="share of labels replaced by another class")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    for name, count, seed in (("train", args.train, args.seed), ("eval", args.eval, args.seed + 1)):
        write_jsonl(args.out / f"{name}.jsonl", records(count, seed, args.mean_words, args.classes, args.noise))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
