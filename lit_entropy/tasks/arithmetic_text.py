"""How an arithmetic problem is said: the question's text for each style, apart from what the problem is.

A problem is its numbers and operators (:class:`~lit_entropy.tasks.arithmetic.ArithmeticProblem`); this
module only words it. Several phrasings of one problem exist on purpose: a model trained on one fixed
sentence learns that sentence, and the trained model is also asked questions phrased in ways the
generator never uses. So every style has several openers, verbs and questions, drawn per problem:

* ``expression``: "What is 47 + 23 - 18?"; with ``varied`` phrasing also "Compute …", "… = ?", ….
* ``word``: the original one-sentence story of two numbers (``+``, ``-`` or ``*``).
* ``story``: a story of any number of steps, present or past tense: "Maya has 47 stamps. Then she buys
  23 more. She gives 18 to a friend. How many stamps does Maya have now?" (``+`` and ``-`` only).
* ``steps``: spoken instructions: "Start with 47. Add 23. Subtract 18. What number do you get?"

Every text contains each operand in decimal, in order, so the answer depends on nothing but the numbers. The
retention split's products and quotients (:func:`retention_text`) may also spell them in words.
"""

from __future__ import annotations

import random

EXPRESSION_QUESTIONS = ("What is {e}?", "Compute {e}.", "Calculate {e}.", "Evaluate {e}.", "Find the value of {e}.",
                        "{e} = ?", "What does {e} equal?", "Work out {e}.")
"""Varied phrasing of the bare expression; the fixed phrasing is the first."""

WORD_TEMPLATES = {
    "+": ["{name} has {a} {thing}s and gets {b} more. How many {thing}s does {name} have now?",
          "There are {a} {thing}s in a box and {b} more are put in. How many {thing}s are in the box?"],
    "-": ["{name} has {a} {thing}s and gives away {b}. How many {thing}s does {name} have left?",
          "There are {a} {thing}s in a box and {b} are taken out. How many {thing}s are left in the box?"],
    "*": ["{name} has {a} bags with {b} {thing}s in each bag. How many {thing}s does {name} have?",
          "There are {a} rows of {thing}s with {b} {thing}s in each row. How many {thing}s are there?"],
}
"""``style=word``: one sentence, two numbers (the task's first phrasing, kept for the easy preset)."""

NAMES = ("Tom", "Anna", "Sam", "Lily", "Ben", "Maya", "Leo", "Zoe")
"""Names of ``style=word`` (unchanged, so its problems stay what they were)."""
THINGS = ("apple", "marble", "book", "coin", "stamp", "pencil", "shell", "card")

STORY_PEOPLE = (("Tom", "he"), ("Anna", "she"), ("Sam", "he"), ("Lily", "she"), ("Ben", "he"), ("Maya", "she"),
                ("Leo", "he"), ("Zoe", "she"), ("Omar", "he"), ("Priya", "she"), ("Kenji", "he"), ("Elena", "she"),
                ("Noah", "he"), ("Fatima", "she"), ("Lucas", "he"), ("Grace", "she"))
STORY_THINGS = ("apples", "marbles", "books", "coins", "stamps", "pencils", "shells", "cards", "stickers",
                "cookies", "toy cars", "beads", "seashells", "postcards", "balloons", "crayons")

# (present, past) pairs; {n} the name, {p} the pronoun, {t} the things, {x} the number.
STORY_OPENERS = (("{n} has {x} {t}.", "{n} had {x} {t}."),
                 ("{n} owns {x} {t}.", "{n} owned {x} {t}."),
                 ("{n} starts the day with {x} {t}.", "{n} started the day with {x} {t}."),
                 ("{n} keeps {x} {t} in a box.", "{n} kept {x} {t} in a box."))
STORY_GAINS = (("Then {p} buys {x} more.", "Then {p} bought {x} more."),
               ("{P} finds {x} more {t}.", "{P} found {x} more {t}."),
               ("A friend gives {n} {x} more.", "A friend gave {n} {x} more."),
               ("Later {p} gets {x} more {t}.", "Later {p} got {x} more {t}."),
               ("{P} wins {x} {t} in a game.", "{P} won {x} {t} in a game."))
STORY_LOSSES = (("Then {p} gives {x} to a friend.", "Then {p} gave {x} to a friend."),
                ("{P} loses {x} {t}.", "{P} lost {x} {t}."),
                ("{P} sells {x} of them.", "{P} sold {x} of them."),
                ("Later {p} uses {x} {t}.", "Later {p} used {x} {t}."),
                ("{P} gives away {x}.", "{P} gave away {x}."))
STORY_QUESTIONS = (("How many {t} does {n} have now?", "How many {t} did {n} have then?"),
                   ("How many {t} does {n} have at the end?", "How many {t} did {n} have at the end?"),
                   ("How many {t} are left with {n}?", "How many {t} were left with {n}?"))

STEP_OPENERS = ("Start with {x}.", "Take the number {x}.", "Begin with {x}.", "Think of the number {x}.")
STEP_VERBS = {"+": ("Add {x}.", "Then add {x}.", "Increase it by {x}.", "Add {x} to it."),
              "-": ("Subtract {x}.", "Then subtract {x}.", "Take away {x}.", "Decrease it by {x}.")}
STEP_QUESTIONS = ("What number do you get?", "What is the result?", "What do you end up with?",
                  "What number is left?")

STYLES = ("expression", "word", "story", "steps")
PHRASINGS = ("fixed", "varied")


def expression(operands: tuple[int, ...], ops: tuple[str, ...]) -> str:
    """``47 + 23 - 18``."""
    return " ".join(f"{a} {op}" for a, op in zip(operands[:-1], ops, strict=True)) + f" {operands[-1]}"


def phrase(rng: random.Random, style: str, operands: tuple[int, ...], ops: tuple[str, ...], phrasing: str) -> str:
    """The question text of one problem in ``style`` (draws its wording from ``rng``)."""
    if style == "expression":
        template = rng.choice(EXPRESSION_QUESTIONS) if phrasing == "varied" else EXPRESSION_QUESTIONS[0]
        return template.format(e=expression(operands, ops))
    if style == "word":
        template = rng.choice(WORD_TEMPLATES[ops[0]])
        return template.format(name=rng.choice(NAMES), thing=rng.choice(THINGS), a=operands[0], b=operands[1])
    if style == "story":
        return _story(rng, operands, ops)
    if style == "steps":
        words = [rng.choice(STEP_OPENERS).format(x=operands[0])]
        words += [rng.choice(STEP_VERBS[op]).format(x=b) for op, b in zip(ops, operands[1:], strict=True)]
        return " ".join([*words, rng.choice(STEP_QUESTIONS)])
    raise ValueError(f"unknown style {style!r}; known: {STYLES}")


def _story(rng: random.Random, operands: tuple[int, ...], ops: tuple[str, ...]) -> str:
    name, pronoun = rng.choice(STORY_PEOPLE)
    things = rng.choice(STORY_THINGS)
    tense = rng.randrange(2)
    fields = {"n": name, "p": pronoun, "P": pronoun.capitalize(), "t": things}
    sentences = [rng.choice(STORY_OPENERS)[tense].format(x=operands[0], **fields)]
    for op, b in zip(ops, operands[1:], strict=True):
        pool = STORY_GAINS if op == "+" else STORY_LOSSES
        sentences.append(rng.choice(pool)[tense].format(x=b, **fields))
    sentences.append(rng.choice(STORY_QUESTIONS)[tense].format(**fields))
    return " ".join(sentences)


# --------------------------------------------------------------------------- the retention split

RETENTION_KINDS = ("product", "quotient")
"""Kinds of problem the training task never draws (it trains sums and differences)."""
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
TENS_WORDS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
PRODUCT_FORMS = ("What is {a} × {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} * {b}.",
                 "{name} has {a} bags with {b} {thing}s in each bag. How many {thing}s does {name} have?",
                 "There are {a} rows of {thing}s with {b} in each row. How many {thing}s are there?")
QUOTIENT_FORMS = ("What is {a} ÷ {b}?", "What is {a} divided by {b}?", "Divide {a} by {b}.", "Compute {a} / {b}.",
                  "{name} shares {a} {thing}s equally among {b} friends. How many {thing}s does each friend get?",
                  "{a} {thing}s are packed into {b} equal boxes. How many {thing}s are in each box?")


def number_in_words(x: int) -> str:
    """``x`` (0..999) in English words: ``seventy-two``, ``one hundred and forty-four``."""
    if not 0 <= x <= 999:
        raise ValueError(f"number_in_words covers 0..999, got {x}")
    if x >= 100:
        rest = x % 100
        return f"{NUMBER_WORDS[x // 100]} hundred" + (f" and {number_in_words(rest)}" if rest else "")
    if x < 20:
        return NUMBER_WORDS[x]
    return TENS_WORDS[x // 10] + (f"-{NUMBER_WORDS[x % 10]}" if x % 10 else "")


def retention_text(rng: random.Random, kind: str, a: int, b: int) -> str:
    """The question of a retention problem (``a × b``, or ``a ÷ b`` exactly), in one of several forms, its
    numbers in digits or, a third of the time, in words ("What is seven times eight?")."""
    forms = {"product": PRODUCT_FORMS, "quotient": QUOTIENT_FORMS}[kind]
    x, y = (number_in_words(a), number_in_words(b)) if rng.randrange(3) == 0 else (a, b)
    return rng.choice(forms).format(a=x, b=y, name=rng.choice(NAMES), thing=rng.choice(THINGS))
