"""Generate the instruction data of the language-model example: templated questions with rule-based answers.

A small world of made-up creatures, each with a colour, a home and a food. Every question asks one of
those, in one of several phrasings, and the answer is one word. The held-out (evaluation) questions
pair creatures and phrasings that training never shows together, so a model answers them only by
learning what each creature is and what each phrasing asks, not by recalling whole questions.
Records are instruction pairs (`prompt`, `response`); `--chat` writes the same as chats (`messages`).
`--context N` opens each prompt with 0 to N facts about random creatures (words the vocabulary has
already), for records of realistic, varied lengths: about 7 tokens a fact (the language-model
benchmark, bench/lm_throughput.py). The output is deterministic for a given seed.

    python examples/sft/generate.py examples/sft/data            # the committed files
    python examples/sft/generate.py /tmp/chats --chat
    python examples/sft/generate.py /tmp/long --context 40 --repeat 8
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CREATURES = (
    "zorb", "quill", "mimbo", "tarsk", "plonk", "vexa", "drubble", "snorf", "kelp", "yarrow",
    "bibble", "frand", "glim", "hobb", "jinx", "lurk", "nyx", "ombra", "pexel", "rumba",
)  # fmt: skip
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white")
HOMES = ("cave", "river", "forest", "desert", "mountain", "swamp", "meadow", "island")
FOODS = ("berries", "fish", "leaves", "seeds", "honey", "mushrooms", "roots", "insects")
# What a question asks -> its phrasings ({c} is the creature).
QUESTIONS = {
    "colour": (
        "what colour is the {c} ?",
        "tell me the colour of the {c} .",
        "the {c} has which colour ?",
        "name the colour of a {c} .",
    ),
    "home": (
        "where does the {c} live ?",
        "tell me the home of the {c} .",
        "the {c} lives where ?",
        "name the place a {c} lives .",
    ),
    "food": (
        "what does the {c} eat ?",
        "tell me the food of the {c} .",
        "the {c} eats what ?",
        "name the food a {c} eats .",
    ),
}
SYSTEM = "answer with one word ."
# How a fact of the context names what a question asks.
NOUNS = {"colour": "colour", "home": "home", "food": "food"}


def world(seed: int) -> dict[str, dict[str, str]]:
    """Each creature's colour, home and food."""
    rng = random.Random(seed)  # noqa: S311 - reproducible data, not cryptography
    return {c: {"colour": rng.choice(COLOURS), "home": rng.choice(HOMES), "food": rng.choice(FOODS)} for c in CREATURES}


def questions(seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(prompt, answer) pairs for training and for evaluation: for each creature and kind of question, one
    phrasing is held out (a different one per creature)."""
    facts = world(seed)
    rng = random.Random(seed + 1)  # noqa: S311 - reproducible data, not cryptography
    train, held_out = [], []
    for creature, known in facts.items():
        for kind, phrasings in QUESTIONS.items():
            kept = rng.randrange(len(phrasings))
            for i, phrasing in enumerate(phrasings):
                pair = (phrasing.format(c=creature), known[kind])
                (held_out if i == kept else train).append(pair)
    rng.shuffle(train)
    rng.shuffle(held_out)
    return train, held_out


def context(facts: dict[str, dict[str, str]], rng: random.Random, most: int) -> str:
    """0 to `most` facts about random creatures, each like "the home of the zorb is cave ." (with a space after)."""
    said = []
    for _ in range(rng.randint(0, most)):
        creature, kind = rng.choice(CREATURES), rng.choice(list(NOUNS))
        said.append(f"the {NOUNS[kind]} of the {creature} is {facts[creature][kind]} . ")
    return "".join(said)


def record(prompt: str, answer: str, *, chat: bool, opening: str = "") -> dict[str, object]:
    if chat:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": opening + prompt},
            {"role": "assistant", "content": answer},
        ]
        return {"messages": messages}
    return {"prompt": f"{opening}question : {prompt} answer :", "response": answer}


def vocabulary() -> list[str]:
    """Every word the records use."""
    words = {"question", "answer", ":", *SYSTEM.split()}
    for phrasings in QUESTIONS.values():
        for phrasing in phrasings:
            words.update(w for w in phrasing.split() if w != "{c}")
    words.update(CREATURES, COLOURS, HOMES, FOODS)
    return sorted(words)


def write(folder: Path, *, seed: int = 7, chat: bool = False, repeat: int = 4, most_facts: int = 0) -> None:
    """train.jsonl (every training question `repeat` times) and eval.jsonl (the held-out questions), each
    prompt opened by up to `most_facts` facts."""
    train, held_out = questions(seed)
    facts, rng = world(seed), random.Random(seed + 2)  # noqa: S311 - reproducible data, not cryptography
    folder.mkdir(parents=True, exist_ok=True)
    for name, pairs in (("train", train * repeat), ("eval", held_out)):
        lines = (
            json.dumps(record(prompt, answer, chat=chat, opening=context(facts, rng, most_facts))) + "\n"
            for prompt, answer in pairs
        )
        (folder / f"{name}.jsonl").write_text("".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--chat", action="store_true", help="chat records (messages) instead of pairs")
    parser.add_argument("--repeat", type=int, default=4, help="times each training question appears")
    parser.add_argument("--context", type=int, default=0, metavar="N", help="open each prompt with 0 to N facts")
    args = parser.parse_args()
    write(args.folder, seed=args.seed, chat=args.chat, repeat=args.repeat, most_facts=args.context)


if __name__ == "__main__":
    main()
