"""Deterministic generator of simple children's stories.

The demo model and the generated test tokenizers need English text in the
style of TinyStories without downloading anything, so stories are assembled
here from templates and word lists driven by a seeded `random.Random`.
The same `(n, seed)` always gives the same list on every platform (the
generator only uses `Random.random`/`choice`/`randint`/`sample`, whose
sequences CPython keeps stable across versions for a given seed).

Each story is a short plot (a lost toy, a new friend, trying again, sharing,
helping an animal, a rainy picnic, baking, fear of the dark, a trip to the
sea) with a named hero, consistent pronouns and a closing line. The text
carries no end marker: callers append `EOT` (or its token id) after each
story, which is what teaches a model to stop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["EOT", "join_with_eot", "stories"]

EOT = "<|endoftext|>"

GIRL_NAMES = (
    "Lily", "Mia", "Sara", "Anna", "Lucy", "Emma", "Zoe", "Ella", "Amy", "Sue",
    "Kate", "Rose", "Daisy", "Molly", "Lisa", "Jane", "Ruby", "Nina", "Ivy", "Kim",
)
BOY_NAMES = (
    "Tom", "Ben", "Max", "Sam", "Tim", "Jack", "Leo", "Bob", "Joe", "Finn",
    "Jake", "Dan", "Ned", "Luke", "Paul", "Roy", "Ted", "Alex", "Nick", "Ray",
)
# (kind, can be a hero) - animals can lead a story as well as children.
ANIMALS = (
    "cat", "dog", "bird", "bunny", "frog", "duck", "bear", "fox", "mouse",
    "puppy", "kitten", "owl", "turtle", "squirrel", "pig", "lamb", "cow", "horse",
)
ANIMAL_ADJ = (
    "little", "small", "fluffy", "friendly", "tiny", "happy", "shy", "brown",
    "white", "big", "funny", "gentle",
)
HERO_ADJ = ("kind", "happy", "curious", "brave", "funny", "gentle", "smart", "cheerful")
OBJECTS = (
    ("red", "ball"), ("blue", "kite"), ("soft", "teddy bear"), ("shiny", "coin"),
    ("toy", "car"), ("yellow", "hat"), ("little", "boat"), ("pink", "doll"),
    ("green", "truck"), ("old", "book"), ("new", "drum"), ("big", "balloon"),
    ("purple", "scarf"), ("wooden", "train"), ("small", "bell"), ("gold", "star"),
)
ACTIVITIES = (
    "play outside", "draw pictures", "sing songs", "dance in the sun", "read books",
    "look at the stars", "pick flowers", "build towers with blocks", "splash in puddles",
    "run in the grass", "play with {pos} friends", "help {pos} mom in the garden",
    "watch the birds", "jump and skip", "play hide and seek",
)
PLACES = (
    "the park", "the garden", "the forest", "the beach", "the farm", "the lake",
    "the hill", "the yard", "the woods", "the meadow", "the playground", "the river",
)
HOMES = (
    "in a small house", "in a little town", "near a big forest", "by the sea",
    "on a sunny farm", "near a quiet lake", "in a cozy village",
)
ANIMAL_HOMES = HOMES + ("in a tall tree", "in a warm barn", "in a hole under a tree")
WALK_PLACES = (
    "the park", "the garden", "the forest", "the woods", "the meadow", "the field",
)
SEARCH_SPOTS = (
    "under the bed", "behind the door", "in the toy box", "under the table",
    "in the kitchen", "behind the couch", "in the closet", "under the chair",
)
FOUND_SPOTS = (
    "under a big leaf", "behind a tree", "in the tall grass", "next to a rock",
    "under a bush", "in a pile of sand", "near the flowers", "inside an old box",
)
GOALS = (
    ("climb the big tree", "climbed the big tree"),
    ("ride {pos} new bike", "rode {pos} new bike"),
    ("fly {pos} kite", "flew {pos} kite high in the sky"),
    ("swim in the lake", "swam across the lake"),
    ("jump over the log", "jumped over the log"),
    ("tie {pos} shoes", "tied {pos} shoes"),
    ("catch the ball", "caught the ball"),
    ("build a tall sand castle", "built a tall sand castle"),
)
STUCK = (
    ("stuck in a tree", "climbed up slowly and held out {pos} hands"),
    ("stuck in the mud", "pulled it out gently"),
    ("stuck under a log", "pushed the log away with all {pos} might"),
    ("caught in a net", "untied the net with care"),
    ("lost and far from home", "showed it the way back home"),
)
GAMES = ("tag", "catch", "hide and seek", "with a ball", "in the leaves", "by the water")
FOODS = (
    "sandwiches", "apples", "cookies", "grapes", "cheese", "bread and jam",
    "strawberries", "carrots", "cake",
)
TREATS = ("a cake", "some cookies", "a pie", "some muffins", "a loaf of bread")
ADULTS = ("mom", "dad", "grandma", "grandpa")
SEA_THINGS = ("a pretty shell", "a little crab", "a smooth stone", "a starfish")


@dataclass
class _Who:
    """A character and the words that refer to it."""

    # Capitalised properties (Name, Subj, Pos) are the sentence-initial forms.
    name: str  # "Lily"
    subj: str  # she / he / it
    obj: str  # her / him / it
    pos: str  # her / his / its
    noun: str  # "girl", "dog": what the opening calls it

    @property
    def Name(self) -> str:
        return self.name[0].upper() + self.name[1:]

    @property
    def Subj(self) -> str:
        return self.subj.capitalize()

    @property
    def Pos(self) -> str:
        return self.pos.capitalize()


def _person(rng: random.Random, exclude: str = "") -> _Who:
    girl = rng.random() < 0.5
    names = [n for n in (GIRL_NAMES if girl else BOY_NAMES) if n != exclude]
    name = rng.choice(names)
    if girl:
        return _Who(name, "she", "her", "her", "girl")
    return _Who(name, "he", "him", "his", "boy")


def _hero(rng: random.Random) -> _Who:
    who = _person(rng)
    if rng.random() < 0.3:
        who.noun = rng.choice(ANIMALS)
    return who


def _animal(rng: random.Random, exclude: str = "") -> tuple[str, str]:
    kind = rng.choice([a for a in ANIMALS if a != exclude])
    return rng.choice(ANIMAL_ADJ), kind


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


class _Story:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.parts: list[str] = []

    def say(self, *sentences: str) -> None:
        self.parts.extend(sentences)

    def pick(self, *options: str) -> str:
        return self.rng.choice(options)

    def text(self) -> str:
        return " ".join(self.parts)


def _opening(s: _Story, h: _Who) -> None:
    rng = s.rng
    kind = h.noun
    if kind in ("girl", "boy"):
        adj = rng.choice(("little", "little", "young", "small"))
    else:
        adj = rng.choice(ANIMAL_ADJ)
    homes = HOMES if kind in ("girl", "boy") else ANIMAL_HOMES
    r = rng.random()
    if r < 0.6:
        s.say(f"Once upon a time, there was {_a(adj)} {kind} named {h.name}.")
    elif r < 0.85:
        home = rng.choice(homes)
        s.say(f"Once upon a time, {home}, there lived {_a(adj)} {kind} named {h.name}.")
    else:
        s.say(f"Once upon a time, {h.name} was {_a(adj)} {kind} who lived {rng.choice(homes)}.")
    r = rng.random()
    if r < 0.5:
        act = rng.choice(ACTIVITIES).format(pos=h.pos)
        s.say(f"{h.Subj} loved to {act}.")
    elif r < 0.8:
        s.say(f"{h.Subj} was very {rng.choice(HERO_ADJ)} and loved to "
              f"{rng.choice(ACTIVITIES).format(pos=h.pos)}.")
    else:
        s.say(f"Every day, {h.subj} liked to {rng.choice(ACTIVITIES).format(pos=h.pos)}.")


def _plot_lost(s: _Story, h: _Who) -> None:
    rng = s.rng
    adj, obj = rng.choice(OBJECTS)
    friend = _person(rng, exclude=h.name)
    spots = rng.sample(SEARCH_SPOTS, 2)
    s.say(f"{h.Subj} had {_a(adj)} {obj} that {h.subj} loved very much.")
    s.say(s.pick(f"One day, {h.name} could not find {h.pos} {obj}.",
                 f"One morning, the {obj} was gone!"))
    s.say(f"{h.Subj} looked {spots[0]}. {h.Subj} looked {spots[1]}.")
    s.say(s.pick("It was not there.", f"The {obj} was nowhere to be found."))
    s.say(s.pick(f"{h.Name} felt very sad.", f"{h.Name} started to cry."))
    s.say(f"Then {h.pos} friend {friend.name} came by.")
    s.say(f"\"Why are you sad?\" asked {friend.name}.")
    s.say(f"\"I lost my {obj},\" said {h.name}.")
    s.say(f"\"Do not worry. I will help you,\" said {friend.name}.")
    place = rng.choice(PLACES)
    s.say(f"They went to {place} and looked everywhere.")
    s.say(f"At last, {friend.name} found the {obj} {rng.choice(FOUND_SPOTS)}.")
    s.say(f"{h.Name} was so happy! {h.Subj} gave {friend.name} a big hug.")
    s.say(f"\"Thank you!\" said {h.name}.")
    s.say(s.pick(f"From that day on, {h.name} kept {h.pos} {obj} in a safe place.",
                 f"Then they played with the {obj} until the sun went down.",
                 f"{h.Name} learned that good friends always help each other."))


def _plot_friend(s: _Story, h: _Who) -> None:
    rng = s.rng
    adj, kind = _animal(rng, exclude=h.noun)
    place = rng.choice(PLACES)
    s.say(f"One day, {h.name} went to {place}.")
    s.say(f"There, {h.subj} saw {_a(adj)} {kind} sitting all alone.")
    s.say(s.pick(f"The {kind} looked sad.", f"The {kind} was crying."))
    s.say(f"\"Why are you sad?\" asked {h.name}.")
    s.say(s.pick(f"\"I have no friends,\" said the {kind}.",
                 f"\"Nobody wants to play with me,\" said the {kind}."))
    s.say(s.pick(f"\"I will be your friend!\" said {h.name}.",
                 f"\"You can play with me!\" said {h.name} with a smile."))
    s.say(f"The {kind} was very happy.")
    s.say(f"{h.Name} and the {kind} played {rng.choice(GAMES)}.")
    s.say(s.pick("They laughed and had lots of fun.", "They ran and jumped all day long."))
    s.say(s.pick(f"When it was time to go home, {h.name} said, \"See you tomorrow!\"",
                 f"When the sun went down, {h.name} waved goodbye to {h.pos} new friend."))
    s.say(s.pick(f"From that day on, {h.name} and the {kind} were best friends.",
                 f"Now {h.name} and the {kind} play together every day."))


def _plot_try(s: _Story, h: _Who) -> None:
    rng = s.rng
    want, did = rng.choice(GOALS)
    want = want.format(pos=h.pos)
    did = did.format(pos=h.pos)
    adult = rng.choice(ADULTS)
    s.say(f"One day, {h.name} wanted to {want}.")
    s.say(f"{h.Subj} tried, but {h.subj} fell down.")
    s.say(s.pick(f"{h.Name} felt sad and wanted to stop.", f"{h.Name} was upset."))
    s.say(f"{h.Pos} {adult} saw {h.obj} and said, \"Do not give up. Try again!\"")
    s.say(f"So {h.name} tried again. {h.Subj} fell down again, but {h.subj} did not stop.")
    s.say(s.pick("This time, it worked!", "On the third try, it worked!"))
    s.say(f"{h.Name} {did}.")
    s.say(s.pick(f"{h.Subj} felt very proud.", f"{h.Subj} jumped up and down with joy."))
    s.say(f"{h.Pos} {adult} clapped and gave {h.obj} a big hug.")
    s.say(s.pick(f"{h.Name} learned that it is good to keep trying.",
                 f"From that day on, {h.name} never gave up."))


def _plot_share(s: _Story, h: _Who) -> None:
    rng = s.rng
    adj, obj = rng.choice(OBJECTS)
    friend = _person(rng, exclude=h.name)
    s.say(f"One day, {h.name} got {_a(adj)} {obj}.")
    s.say(f"{h.Subj} took it to {rng.choice(PLACES)} to play.")
    s.say(f"{h.Pos} friend {friend.name} saw the {obj}.")
    s.say(f"\"Can I play with it too?\" asked {friend.name}.")
    s.say(f"\"No, it is mine!\" said {h.name}.")
    s.say(f"{friend.name} was sad and walked away.")
    s.say(f"{h.Name} played alone, but it was not fun.")
    s.say(f"{h.Subj} felt bad.")
    s.say(f"{h.Subj} ran to {friend.name} and said, \"I am sorry. Let us play together.\"")
    s.say(f"{friend.name} smiled. They played with the {obj} and had lots of fun.")
    s.say(s.pick(f"{h.Name} learned that sharing makes everyone happy.",
                 "From that day on, they always shared their toys."))


def _plot_help(s: _Story, h: _Who) -> None:
    rng = s.rng
    adj, kind = _animal(rng, exclude=h.noun)
    stuck, fix = rng.choice(STUCK)
    place = rng.choice(WALK_PLACES)
    s.say(f"One day, {h.name} was walking in {place}.")
    s.say(f"{h.Subj} heard a small sound. It was {_a(adj)} {kind}.")
    s.say(f"The {kind} was {stuck}.")
    s.say(s.pick(f"The {kind} was scared.", f"The {kind} looked very scared."))
    s.say(f"\"Do not be scared. I will help you,\" said {h.name}.")
    s.say(f"{h.Subj} {fix.format(pos=h.pos)}.")
    s.say(f"Soon the {kind} was safe.")
    s.say(f"\"Thank you, {h.name}!\" said the {kind}.")
    s.say(s.pick(f"{h.Name} felt warm and happy inside.",
                 f"{h.Name} smiled. Helping felt good."))
    s.say(s.pick(f"From that day on, the {kind} came to visit {h.name} every day.",
                 f"The {kind} and {h.name} became good friends."))


def _plot_picnic(s: _Story, h: _Who) -> None:
    rng = s.rng
    adult = rng.choice(ADULTS)
    place = rng.choice(("the park", "the hill", "the meadow", "the lake", "the garden"))
    foods = rng.sample(FOODS, 2)
    s.say(f"One sunny day, {h.name} and {h.pos} {adult} went to {place} for a picnic.")
    s.say(f"They ate {foods[0]} and {foods[1]}.")
    s.say("Suddenly, the sky turned dark. Big drops of rain started to fall.")
    s.say(s.pick("They ran under a big tree to stay dry.",
                 "They hid under a big umbrella."))
    s.say(f"{h.Name} was a little scared of the thunder.")
    s.say(f"{h.Pos} {adult} held {h.pos} hand and said, \"Do not worry. The rain will stop soon.\"")
    s.say("After a while, the rain stopped and the sun came out.")
    s.say("In the sky, there was a big, bright rainbow!")
    s.say(f"\"Look!\" said {h.name}. \"It is so pretty!\"")
    s.say(s.pick(f"{h.Name} and {h.pos} {adult} walked home happy.",
                 "It was the best picnic ever."))


def _plot_bake(s: _Story, h: _Who) -> None:
    rng = s.rng
    adult = rng.choice(ADULTS)
    treat = rng.choice(TREATS)
    friend = _person(rng, exclude=h.name)
    s.say(f"One day, {h.pos} {adult} was making {treat} in the kitchen.")
    s.say(f"\"Can I help?\" asked {h.name}.")
    s.say(f"\"Yes, you can,\" said {h.pos} {adult}.")
    s.say(f"{h.Name} mixed the flour, the eggs and the milk.")
    s.say(s.pick("Some flour got on the floor, and they both laughed.",
                 f"{h.Subj} stirred and stirred until it was smooth."))
    s.say("Soon the kitchen smelled sweet and warm.")
    s.say(f"When it was ready, {h.name} took some to {h.pos} friend {friend.name}.")
    s.say(f"\"This is yummy!\" said {friend.name}.")
    s.say(s.pick(f"{h.Name} felt proud that {h.subj} helped.",
                 f"{h.Name} learned that sharing food with friends is the best."))


def _plot_dark(s: _Story, h: _Who) -> None:
    rng = s.rng
    adult = rng.choice(ADULTS)
    adj, obj = rng.choice(OBJECTS)
    s.say(f"But {h.name} was scared of the dark.")
    s.say(f"One night, {h.subj} saw a big shadow on the wall.")
    s.say(f"\"Help!\" cried {h.name}.")
    s.say(f"{h.Pos} {adult} came in and turned on the light.")
    s.say(f"The shadow was only {h.pos} {adj} {obj}!")
    s.say(f"{h.Name} laughed. \"It is just my {obj},\" {h.subj} said.")
    s.say(f"{h.Pos} {adult} gave {h.obj} a little night light.")
    s.say(s.pick(f"From that night on, {h.name} was not scared of the dark anymore.",
                 f"{h.Name} hugged the {obj} and fell asleep with a smile."))


def _plot_sea(s: _Story, h: _Who) -> None:
    rng = s.rng
    adult = rng.choice(ADULTS)
    thing = rng.choice(SEA_THINGS)
    s.say(f"One day, {h.name} went to the beach with {h.pos} {adult}.")
    s.say("The sun was warm and the water was blue.")
    s.say(f"{h.Name} built a castle in the sand.")
    s.say(f"Then {h.subj} found {thing} near the water.")
    s.say(f"\"Look what I found!\" {h.subj} said.")
    s.say(s.pick("A big wave came and took the castle away.",
                 "A big wave came and washed the castle into the sea."))
    s.say(s.pick(f"{h.Name} was sad for a moment, but then {h.subj} smiled.",
                 f"{h.Name} did not cry. {h.Subj} just laughed."))
    s.say("\"I can build a new one!\" " + f"{h.subj} said.")
    s.say(s.pick(f"{h.Name} and {h.pos} {adult} built a bigger castle together.",
                 f"{h.Subj} kept the {thing.split(' ', 1)[1]} to remember the happy day."))


_PLOTS = (
    _plot_lost, _plot_friend, _plot_try, _plot_share, _plot_help,
    _plot_picnic, _plot_bake, _plot_dark, _plot_sea,
)


def _one(rng: random.Random) -> str:
    s = _Story(rng)
    h = _hero(rng)
    _opening(s, h)
    rng.choice(_PLOTS)(s, h)
    if rng.random() < 0.25:
        s.say(s.pick("The end.", "And they all lived happily ever after."))
    return s.text()


def stories(n: int, seed: int) -> list[str]:
    """Return `n` stories; the same `(n, seed)` always gives the same list.

    A prefix property holds: `stories(n, s)[:m] == stories(m, s)` for m <= n,
    so a held-out split can be taken from the tail without regenerating.
    """
    if not isinstance(n, int) or not isinstance(seed, int):
        raise TypeError(f"stories: n and seed must be ints, got n={n!r}, seed={seed!r}")
    if n < 0:
        raise ValueError(f"stories: n must be non-negative, got {n}")
    rng = random.Random(seed)
    return [_one(rng) for _ in range(n)]


def join_with_eot(texts: list[str]) -> str:
    """One string with `EOT` after every story (the layout the model trains on)."""
    return "".join(t + EOT for t in texts)
