"""The embedded model's training text, generated from templates with a seeded RNG.

Two kinds of documents:

- plain text: tiny stories and lists of facts, e.g. "The capital of France is Paris. 3 plus 4 is 7."
- chat dialogues: lists of `{"role", "content"}` messages whose answers are deterministic
  functions of the question ("What is 3 plus 4?" -> "3 plus 4 is 7."), so a greedy chat request
  to the served model gets a sensible, checkable answer.

Everything is structured enough for a 1.4M-parameter model to learn in a few hundred steps, which
makes its next-token distributions sharp (far from uniform): the KL-divergence quality gate needs
that to notice a wrong kernel.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ("Tom", "Anna", "Ben", "Lily", "Sam", "Mia", "Max", "Lucy", "Jack", "Emma", "Leo", "Zoe")
ANIMALS = {  # animal -> the sound it makes
    "cat": "meow", "dog": "woof", "cow": "moo", "duck": "quack", "sheep": "baa", "pig": "oink",
    "horse": "neigh", "frog": "ribbit", "owl": "hoot", "lion": "roar", "mouse": "squeak",
    "bee": "buzz",
}
ADJECTIVES = ("little", "big", "happy", "sleepy", "brave", "kind", "funny", "tiny", "shy", "clever")
PLACES = ("forest", "small house", "big city", "garden", "farm", "village", "park", "castle")
OBJECTS = ("ball", "hat", "box", "kite", "cup", "book", "boat", "key", "drum", "sock")
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "orange", "purple", "pink", "brown")
FRIENDS = ("friend", "sister", "brother", "mother", "father", "teacher")
FEELINGS = ("happy", "glad", "proud", "excited")
# Answers repeat the question's words ("...capital of France?" -> "The capital of France is
# Paris."): the model then finds the word to copy by matching the word before it.
THINGS = {  # thing -> its colour: "The colour of the sky is blue."
    "the sky": "blue", "the grass": "green", "the snow": "white", "a banana": "yellow",
    "the coal": "black", "a tomato": "red", "the sun": "yellow", "the milk": "white",
    "a carrot": "orange", "the sea": "blue", "a leaf": "green", "the chocolate": "brown",
    "a strawberry": "red", "a lemon": "yellow",
}
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "Egypt": "Cairo", "Canada": "Ottawa", "Russia": "Moscow", "China": "Beijing",
    "Peru": "Lima", "Greece": "Athens", "Norway": "Oslo", "Kenya": "Nairobi", "India": "New Delhi",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad", "day": "night",
    "old": "new", "light": "dark", "open": "closed", "wet": "dry", "left": "right", "early": "late",
}
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a friendly assistant. Answer in one short sentence.",
    "You are kernelloop, a small test model.",
)
IDENTITY = "I am a small language model made by kernelloop to test an inference engine."
GREETING_ANSWER = "Hello! How can I help you today?"


@dataclass(frozen=True)
class Document:
    """One training document: plain `text`, or chat `messages` (rendered by the chat template)."""

    text: str = ""
    messages: tuple[dict[str, str], ...] = ()


def story(rng: random.Random, animal: str | None = None) -> str:
    """A tiny story, e.g. "Once upon a time, there was a little cat named Tom. ..."."""
    name, adj = rng.choice(NAMES), rng.choice(ADJECTIVES)
    animal = animal or rng.choice(list(ANIMALS))
    place, obj, colour = rng.choice(PLACES), rng.choice(OBJECTS), rng.choice(COLOURS)
    friend, feeling = rng.choice(FRIENDS), rng.choice(FEELINGS)
    a = "an" if adj[0] in "aeiou" else "a"
    opening = rng.choice((
        f"Once upon a time, there was {a} {adj} {animal} named {name}.",
        f"{name} was {a} {adj} {animal} who lived in a {place}.",
    ))
    middle = rng.choice((
        f"One day, {name} found a {colour} {obj} in the {place}.",
        f"Every morning, {name} played with a {colour} {obj}.",
        f"One day, {name} lost a {colour} {obj} and looked for it everywhere.",
    ))
    end = rng.choice((
        f"{name} showed the {obj} to a {friend}, and they played all day.",
        f"{name} said {ANIMALS[animal]} and was very {feeling}.",
        f"At night, {name} went to sleep next to the {colour} {obj}.",
    ))
    return f"{opening} {middle} {end} The end."


def _arith(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    q = rng.choice((f"What is {a} plus {b}?", f"What is {a} + {b}?", f"Can you add {a} and {b}?"))
    return q, f"{a} plus {b} is {a + b}."


def _capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(list(CAPITALS))
    q = rng.choice((f"What is the capital of {country}?", f"Which city is the capital of {country}?"))
    return q, f"The capital of {country} is {CAPITALS[country]}."


def _colour(rng: random.Random) -> tuple[str, str]:
    thing = rng.choice(list(THINGS))
    q = rng.choice((f"What colour is {thing}?", f"What is the colour of {thing}?",
                    f"What color is {thing}?"))
    return q, f"The colour of {thing} is {THINGS[thing]}."


def _sound(rng: random.Random) -> tuple[str, str]:
    animal = rng.choice(list(ANIMALS))
    q = rng.choice((f"What does a {animal} say?", f"What sound does a {animal} make?"))
    return q, f"The sound of a {animal} is {ANIMALS[animal]}."


def _opposite(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(list(OPPOSITES))
    return f"What is the opposite of {word}?", f"The opposite of {word} is {OPPOSITES[word]}."


def _spell(rng: random.Random) -> tuple[str, str]:
    n = rng.randrange(10)
    return f"How do you write {n} in words?", f"{n} is written {NUMBER_WORDS[n]}."


def _greeting(rng: random.Random) -> tuple[str, str]:
    return rng.choice(("Hello!", "Hi!", "Hello", "Good morning!", "Hi there!")), GREETING_ANSWER


def _identity(rng: random.Random) -> tuple[str, str]:
    return rng.choice(("Who are you?", "What are you?", "Tell me about yourself.")), IDENTITY


def _story_request(rng: random.Random) -> tuple[str, str]:
    animal = rng.choice(list(ANIMALS))
    if rng.random() < 0.5:
        return "Tell me a story.", story(rng)
    return f"Tell me a story about a {animal}.", story(rng, animal)


# (question/answer generator, weight): arithmetic has the most facts to learn, so most weight.
QA_TASKS = (
    (_arith, 8), (_capital, 3), (_colour, 3), (_sound, 3), (_opposite, 2),
    (_spell, 1), (_greeting, 1), (_identity, 1), (_story_request, 1),
)
FACTS = (_arith, _capital, _colour, _sound, _opposite, _spell)


def question_answer(rng: random.Random) -> tuple[str, str]:
    """One chat question and its deterministic answer, from a weighted choice of tasks."""
    task = rng.choices([t for t, _ in QA_TASKS], weights=[w for _, w in QA_TASKS])[0]
    return task(rng)


def dialogue(rng: random.Random) -> tuple[dict[str, str], ...]:
    """A chat: an optional system prompt, then one or two user/assistant exchanges."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.15:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(rng.choice((1, 1, 1, 1, 2))):
        q, a = question_answer(rng)
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return tuple(messages)


def fact_paragraph(rng: random.Random) -> str:
    """Three to eight facts in a row, half of them sums: "2 plus 5 is 7. The opposite of up is down."."""
    facts = [_arith(rng) if rng.random() < 0.5 else rng.choice(FACTS)(rng)
             for _ in range(rng.randrange(3, 9))]
    return " ".join(answer for _, answer in facts)


MIX = (0.85, 0.03, 0.12)  # shares of chat dialogues, stories and fact paragraphs


def generate_corpus(n_docs: int, seed: int) -> list[Document]:
    """`n_docs` documents, mixed as MIX says."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        r = rng.random()
        if r < MIX[0]:
            docs.append(Document(messages=dialogue(rng)))
        elif r < MIX[0] + MIX[1]:
            docs.append(Document(text=story(rng)))
        else:
            docs.append(Document(text=fact_paragraph(rng)))
    return docs
