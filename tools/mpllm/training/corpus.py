"""Deterministic generator of varied children's stories, shaped for co-writing.

The demo models (models/demo, models/llama2c-demo) and the generated test
tokenizers need English text in the style of TinyStories without downloading
anything, so stories are composed here by a small grammar driven by a seeded
`random.Random`. The same `(n, seed)` always gives the same list on every
platform (the generator only uses `Random.random`/`choice`/`randint`/`sample`,
whose sequences CPython keeps stable across versions for a given seed).

A story is a cast (a hero and, as the plot needs them, a friend, a grown-up, a
newcomer: children, animals and toys, many of them with names made up from
syllables, so that a model learns to carry a name it has never seen), an
opening (of many shapes, not always "Once upon a time"), one to three
episodes (each a paragraph: a kind of event, told from sentence parts picked
at random, with feelings and dialogue in quotes), and an ending.

Co-writing (llm_chat.CoWriter) gives the model a story that a person writes a
line at a time, and the model must go on from any line, not close the story.
So the corpus teaches that shape too:

- only the ending is followed by the end of the story: the text carries no end
  marker, callers append `EOT` (or its token id) after each story, and each
  story closes with a closing sentence, never in the middle of an episode;
- episodes end in ways that look final ("They went home.", "Then it was time
  for bed.") and the story goes on with the next episode, so a plain sentence
  is no signal to stop;
- about a third of the stories are "written together": between the story's own
  sentences come lines as people type them (a new event or a newcomer that the
  next sentences take up, a line starting "and then" or in lower case, a line
  of dialogue). A line that finishes someone else's sentence needs nothing of
  its own: the joined text is a plain sentence, and every prefix of a story is
  trained on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["EOT", "join_with_eot", "stories"]

EOT = "<|endoftext|>"

# ---- word lists ------------------------------------------------------------

GIRL_NAMES = (
    "Lily", "Mia", "Sara", "Anna", "Lucy", "Emma", "Zoe", "Ella", "Amy", "Sue", "Kate", "Rose",
    "Daisy", "Molly", "Lisa", "Jane", "Ruby", "Nina", "Ivy", "Kim", "Maya", "Lena", "Olivia",
    "Hannah", "Grace", "Chloe", "Sophie", "Alice", "Clara", "Eva", "Julia", "Nora", "Polly",
    "Tess", "Wendy", "Fiona", "Hazel", "Iris", "Jenny", "Lola", "Mara", "Nell", "Penny",
    "Rita", "Sky", "Tara", "Una", "Vera", "Willa", "Yara", "Ada", "Bea", "Cora", "Dora",
    "Greta", "Jade", "Luna", "Mina", "Pia", "Rosa", "Stella", "Tina", "Zara", "Priya", "Aisha",
    "Mei", "Sofia", "Leila", "Noor", "Amara",
)
BOY_NAMES = (
    "Tom", "Ben", "Max", "Sam", "Tim", "Jack", "Leo", "Bob", "Joe", "Finn", "Jake", "Dan",
    "Ned", "Luke", "Paul", "Roy", "Ted", "Alex", "Nick", "Ray", "Oliver", "Noah", "Liam",
    "Henry", "Oscar", "Hugo", "Felix", "Theo", "Arlo", "Eli", "Gus", "Ivan", "Jonah", "Kai",
    "Levi", "Milo", "Nate", "Omar", "Pete", "Rory", "Seth", "Toby", "Vic", "Will", "Zack",
    "Adam", "Billy", "Carl", "Dave", "Ezra", "Fred", "George", "Harry", "Jim", "Kevin",
    "Lucas", "Mark", "Owen", "Ravi", "Sid", "Yusuf", "Ken", "Raj", "Diego", "Mateo",
)
PET_NAMES = (
    "Pip", "Buttons", "Pepper", "Coco", "Biscuit", "Sunny", "Patch", "Bubbles", "Whiskers",
    "Fluffy", "Snowy", "Rusty", "Ginger", "Honey", "Peanut", "Muffin", "Socks", "Tiger",
    "Daisy", "Shadow", "Bingo", "Noodle", "Pebble", "Cookie", "Maple", "Clover", "Bean",
    "Spot", "Star", "Bolt", "Sparky", "Tilly", "Dot", "Ziggy", "Puff", "Momo",
)
SYLLABLES_A = ("Bo", "Zi", "Ta", "Mo", "Ki", "Lu", "Pe", "Ru", "Fi", "No", "Da", "Wi", "Ja",
               "So", "Ve", "Gu", "Ha", "Bi", "Xo", "Qui", "Ya", "Me", "Tu", "Ro")
SYLLABLES_B = ("bo", "lo", "na", "ri", "ko", "mi", "po", "zu", "la", "te", "fi", "do", "nu",
               "ba", "ki", "ra", "li", "mo", "sa", "ti")
SYLLABLES_END = ("", "", "", "n", "m", "x", "p", "s", "r", "k", "l", "t")

ANIMALS = (
    "cat", "dog", "bird", "bunny", "frog", "duck", "bear", "fox", "mouse", "puppy", "kitten",
    "owl", "turtle", "squirrel", "pig", "lamb", "cow", "horse", "hedgehog", "goat", "lion",
    "elephant", "monkey", "penguin", "giraffe", "deer", "hen", "goose", "mole", "badger",
    "otter", "seal", "whale", "fish", "bee", "ant", "snail", "ladybug", "butterfly", "bat",
    "raccoon", "zebra", "tiger", "dragon", "unicorn", "dinosaur", "crab", "parrot", "wolf",
)
TOY_HEROES = (
    "robot", "teddy bear", "toy train", "rag doll", "little car", "tin soldier", "kite",
    "snowman", "paper boat", "wooden horse", "balloon", "toy plane", "crayon", "puppet",
)
KID_ADJ = ("little", "young", "small", "kind", "happy", "curious", "brave", "clever",
           "cheerful", "shy", "funny", "gentle", "busy", "sleepy", "tall", "quiet", "lively")
ANIMAL_ADJ = ("little", "small", "fluffy", "friendly", "tiny", "happy", "shy", "brown", "white",
              "big", "funny", "gentle", "old", "young", "spotted", "striped", "grey", "clever",
              "sleepy", "hungry", "noisy", "soft", "fast", "slow", "golden", "black")
TOY_ADJ = ("shiny", "old", "little", "red", "blue", "brave", "rusty", "new", "tiny",
           "bright", "wobbly", "happy", "green", "yellow", "silver")
TRAITS = ("kind", "curious", "brave", "funny", "gentle", "clever", "cheerful", "shy", "busy",
          "helpful", "silly", "careful", "loud", "quiet", "friendly", "patient")
LIKES = (
    "play outside", "draw pictures", "sing songs", "dance in the sun", "read books",
    "look at the stars", "pick flowers", "build towers with blocks", "splash in puddles",
    "run in the grass", "play with {pos} friends", "help {pos} mom in the garden",
    "watch the birds", "jump and skip", "play hide and seek", "climb trees", "make mud pies",
    "ride {pos} bike", "paint with bright colors", "collect shiny stones", "tell jokes",
    "bake with {pos} dad", "count the clouds", "swim in the pond", "play the drum",
    "fly {pos} kite", "dig in the sand", "chase butterflies", "listen to the rain",
    "go on adventures", "make new friends", "eat sweet berries", "sleep in the sun",
)
HOMES = (
    "in a small house", "in a little town", "near a big forest", "by the sea", "on a sunny farm",
    "near a quiet lake", "in a cozy village", "at the edge of the woods", "in a big city",
    "on a tall hill", "in a blue house with a red door", "next to a river", "in a busy street",
    "on a little island", "in a house with a big garden", "near the mountains",
)
ANIMAL_HOMES = HOMES + ("in a tall tree", "in a warm barn", "in a hole under a tree",
                        "in a nest by the pond", "in a cave on the hill", "in the deep blue sea",
                        "in a toy box", "on a shelf in a toy shop")
PLACES = (
    "the park", "the garden", "the forest", "the beach", "the farm", "the lake", "the hill",
    "the yard", "the woods", "the meadow", "the playground", "the river", "the zoo",
    "the market", "the library", "the school", "the pond", "the mountain", "the bakery",
    "the toy shop", "the big field", "the old bridge", "the cave", "the island", "the town",
    "the orchard", "the castle", "the shop", "the swing", "the barn", "the sea",
)
PLACE_SIGHTS = (
    "tall trees", "bright flowers", "big rocks", "a little stream", "many birds", "green grass",
    "a red gate", "an old tree", "soft sand", "a wooden bench", "a tall slide", "lots of leaves",
    "busy people", "a shiny pond", "little houses", "a long path",
)
OBJECTS = (
    ("red", "ball"), ("blue", "kite"), ("soft", "teddy bear"), ("shiny", "coin"),
    ("toy", "car"), ("yellow", "hat"), ("little", "boat"), ("pink", "doll"),
    ("green", "truck"), ("old", "book"), ("new", "drum"), ("big", "balloon"),
    ("purple", "scarf"), ("wooden", "train"), ("small", "bell"), ("gold", "star"),
    ("silver", "key"), ("round", "mirror"), ("blue", "cup"), ("striped", "sock"),
    ("orange", "bucket"), ("tiny", "box"), ("magic", "wand"), ("paper", "crown"),
    ("white", "feather"), ("old", "map"), ("bright", "lamp"), ("funny", "mask"),
    ("long", "rope"), ("warm", "blanket"), ("little", "flute"), ("shiny", "ring"),
)
FINDS = (
    "a shiny key", "an old map", "a little box", "a golden egg", "a blue feather", "a letter",
    "a tiny door", "a lost glove", "a smooth stone", "a pretty shell", "a funny hat",
    "a magic stone", "a big seed", "a small bell", "a torn kite", "a glass bottle",
)
SPOTS = (
    "under the bed", "behind the door", "in the toy box", "under the table", "in the kitchen",
    "behind the couch", "in the closet", "under the chair", "under a big leaf", "behind a tree",
    "in the tall grass", "next to a rock", "under a bush", "in a pile of sand",
    "near the flowers", "inside an old box", "on the top shelf", "in the garden",
    "by the window", "in a puddle", "under the stairs", "in a hole",
)
GOALS = (
    ("climb the big tree", "climbed the big tree"), ("ride {pos} new bike", "rode {pos} new bike"),
    ("fly {pos} kite", "flew {pos} kite high in the sky"), ("swim in the lake", "swam across the lake"),
    ("jump over the log", "jumped over the log"), ("tie {pos} shoes", "tied {pos} shoes"),
    ("catch the ball", "caught the ball"), ("build a tall sand castle", "built a tall sand castle"),
    ("whistle a song", "whistled a song"), ("read a whole book", "read a whole book"),
    ("skate on the ice", "skated on the ice"), ("bake a cake", "baked a cake"),
    ("write {pos} name", "wrote {pos} name"), ("swing very high", "swung very high"),
    ("reach the top shelf", "reached the top shelf"), ("dive into the pool", "dove into the pool"),
)
TROUBLES = (
    ("stuck in a tree", "climbed up slowly and held out {pos} hands"),
    ("stuck in the mud", "pulled it out gently"),
    ("stuck under a log", "pushed the log away with all {pos} might"),
    ("caught in a net", "untied the net with care"),
    ("lost and far from home", "showed it the way back home"),
    ("hungry and cold", "gave it some bread and a warm blanket"),
    ("stuck on a high rock", "built steps with stones"),
    ("tangled in some string", "cut the string with great care"),
    ("trapped in a box", "opened the lid slowly"),
)
FOODS = ("sandwiches", "apples", "cookies", "grapes", "cheese", "bread and jam", "strawberries",
         "carrots", "cake", "soup", "pancakes", "berries", "pears", "rice", "noodles", "pie")
TREATS = ("a cake", "some cookies", "a pie", "some muffins", "a loaf of bread", "pancakes",
          "a pizza", "some soup")
ADULTS = ("mom", "dad", "grandma", "grandpa", "aunt", "uncle", "teacher")
SIBLINGS = (("sister", "she", "her", "her"), ("brother", "he", "him", "his"))
WEATHER = (
    ("the sky turned dark", "big drops of rain started to fall"),
    ("the wind began to blow", "the leaves danced in the air"),
    ("snow started to fall", "soon everything was white"),
    ("the clouds rolled in", "there was a loud clap of thunder"),
    ("the fog came in", "nobody could see very far"),
)
DAYS = ("One day", "One morning", "One sunny day", "One rainy day", "One evening",
        "One afternoon", "The next day", "Later that day", "One cold morning", "One warm night",
        "On Saturday", "On a windy day", "After lunch", "Early one morning")
TRANSPORT = ("by bus", "on a train", "in a little boat", "on {pos} bike", "on foot",
             "in a red car", "on a big ship", "in a hot air balloon")
SOUNDS = ("a loud bang", "a soft knock", "a funny noise", "a little cry", "a strange buzz",
          "a big splash", "a tiny squeak", "someone singing")
CREATURES = ("a dragon", "a giant", "a fairy", "a talking frog", "a little elf", "a monster",
             "a friendly ghost", "a wizard", "a pirate", "a robot", "an alien", "a mermaid",
             "a unicorn", "a king", "a queen", "a clown")
GAMES = ("tag", "catch", "hide and seek", "with a ball", "in the leaves", "by the water",
         "with the blocks", "pretend", "on the swings", "with a kite", "in the snow")

FEELINGS = {
    "happy": ("happy", "glad", "very happy", "so happy"),
    "sad": ("sad", "very sad", "a little sad", "unhappy"),
    "scared": ("scared", "afraid", "a bit scared", "nervous"),
    "excited": ("excited", "very excited", "so excited"),
    "proud": ("proud", "very proud"),
    "surprised": ("surprised", "very surprised", "amazed"),
    "curious": ("curious", "very curious"),
    "angry": ("angry", "cross", "grumpy"),
    "tired": ("tired", "sleepy", "very tired"),
    "lonely": ("lonely", "all alone"),
}
FEEL_ACTS = {
    "happy": ("{Name} smiled a big smile.", "{Name} clapped {pos} hands.",
              "{Subj} jumped up and down.", "{Name} laughed and laughed."),
    "sad": ("{Name} started to cry.", "{Subj} sat down and looked at the ground.",
            "A tear rolled down {pos} cheek."),
    "scared": ("{Pos} knees began to shake.", "{Name} hid behind a tree.",
               "{Subj} held {pos} breath."),
    "excited": ("{Subj} could not wait.", "{Name} ran as fast as {subj} could.",
                "{Pos} eyes were big and bright."),
    "proud": ("{Subj} stood up tall.", "{Name} smiled from ear to ear."),
    "surprised": ("{Pos} mouth fell open.", "{Name} blinked twice."),
    "curious": ("{Subj} wanted to know more.", "{Name} looked closer."),
    "angry": ("{Subj} stamped {pos} feet.", "{Name} crossed {pos} arms."),
    "tired": ("{Subj} yawned.", "{Pos} eyes were heavy."),
    "lonely": ("{Subj} had no one to play with.", "{Name} sat by the window."),
}
#: what a feeling made a character do: "{Name} was so happy that {subj} ..."
FEEL_THAT = {
    "happy": ("danced around the room", "could not stop smiling", "sang a little song"),
    "sad": ("did not want to eat", "went to bed early", "did not want to play"),
    "scared": ("could not move", "ran back home", "hid under the blanket"),
    "excited": ("could not sleep", "told everyone about it", "ran all the way there"),
    "proud": ("showed it to everyone", "told {pos} whole family"),
    "surprised": ("dropped {pos} cup", "sat down on the grass", "forgot what to say"),
    "curious": ("had to look closer", "asked a lot of questions"),
    "angry": ("stamped {pos} feet", "went to {pos} room"),
    "tired": ("fell asleep on the couch", "yawned and yawned"),
    "lonely": ("looked out of the window all day", "talked to {pos} toys"),
}
SAY = ("said", "said", "said", "said", "shouted", "whispered", "called", "cried", "replied",
       "laughed", "answered")
ASK = ("asked", "asked", "wondered", "asked softly")


# ---- characters ------------------------------------------------------------

@dataclass
class Who:
    """A character and the words that refer to it."""

    name: str  # "Lily", "the fox", "Pip"
    subj: str  # she / he
    obj: str  # her / him
    pos: str  # her / his
    noun: str  # "girl", "fox", "robot": what the opening calls it
    kind: str = "kid"  # kid / animal / toy

    @property
    def Name(self) -> str:
        return self.name[0].upper() + self.name[1:]

    @property
    def call(self) -> str:
        """What another character calls it: its name, or "little fox"."""
        return "little " + self.noun if self.name.startswith("the ") else self.name

    @property
    def Subj(self) -> str:
        return self.subj.capitalize()

    @property
    def Pos(self) -> str:
        return self.pos.capitalize()

    def f(self, template: str) -> str:
        """The template with this character's words ({Name}, {subj}, {pos}...)."""
        return template.format(name=self.name, Name=self.Name, subj=self.subj, Subj=self.Subj,
                               obj=self.obj, pos=self.pos, Pos=self.Pos, noun=self.noun)


def _pronouns(girl: bool) -> tuple[str, str, str]:
    return ("she", "her", "her") if girl else ("he", "him", "his")


def _made_up_name(rng: random.Random) -> str:
    name = rng.choice(SYLLABLES_A)
    if rng.random() < 0.6:
        name += rng.choice(SYLLABLES_B)
    return name + rng.choice(SYLLABLES_END)


def _kid(rng: random.Random, taken: set[str]) -> Who:
    girl = rng.random() < 0.5
    for _ in range(20):
        if rng.random() < 0.2:
            name = _made_up_name(rng)
        else:
            name = rng.choice(GIRL_NAMES if girl else BOY_NAMES)
        if name not in taken:
            break
    taken.add(name)
    return Who(name, *_pronouns(girl), "girl" if girl else "boy")


def _animal(rng: random.Random, taken: set[str], named: bool = True) -> Who:
    girl = rng.random() < 0.5
    kind = rng.choice(ANIMALS)
    if not named:
        return Who("the " + kind, *_pronouns(girl), kind, "animal")
    for _ in range(20):
        name = _made_up_name(rng) if rng.random() < 0.35 else rng.choice(PET_NAMES)
        if name not in taken:
            break
    taken.add(name)
    return Who(name, *_pronouns(girl), kind, "animal")


def _toy(rng: random.Random, taken: set[str]) -> Who:
    girl = rng.random() < 0.5
    for _ in range(20):
        name = _made_up_name(rng) if rng.random() < 0.5 else rng.choice(PET_NAMES)
        if name not in taken:
            break
    taken.add(name)
    return Who(name, *_pronouns(girl), rng.choice(TOY_HEROES), "toy")


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---- the story being written -------------------------------------------------

@dataclass
class Story:
    rng: random.Random
    hero: Who
    taken: set[str]
    paragraphs: list[list[str]] = field(default_factory=lambda: [[]])
    mood: str = "happy"

    def say(self, *sentences: str) -> None:
        self.paragraphs[-1].extend(s for s in sentences if s)

    def para(self) -> None:
        if self.paragraphs[-1]:
            self.paragraphs.append([])

    def pick(self, *options: str) -> str:
        return self.rng.choice(options)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def text(self) -> str:
        return "\n\n".join(" ".join(p) for p in self.paragraphs if p)

    # -- parts used by every episode ------------------------------------------------

    def feel(self, who: Who, mood: str) -> None:
        """A sentence or two on how `who` feels."""
        word = self.rng.choice(FEELINGS[mood])
        r = self.rng.random()
        if r < 0.2 and not word.startswith(("very", "so", "a ", "all")):
            that = self.rng.choice(FEEL_THAT[mood])
            self.say(who.f(f"{{Name}} was so {word} that {{subj}} {that}."))
            return
        if r < 0.45:
            self.say(who.f(f"{{Name}} felt {word}."))
        elif r < 0.7:
            self.say(who.f(f"{{Name}} was {word}."))
        else:
            self.say(who.f(self.rng.choice(FEEL_ACTS[mood])))
        if self.chance(0.25):
            self.say(who.f(self.rng.choice(FEEL_ACTS[mood])))

    def line(self, who: Who, words: str, verb: str = "") -> None:
        """`who` says `words` (a sentence ending in . ! or ?) in quotes, with the
        speech tag after, before, around or (as an action) in front of it."""
        rng = self.rng
        question = words.endswith("?")
        verb = verb or rng.choice(ASK if question else SAY)
        r = rng.random()
        name = who.Name if rng.random() < 0.75 else who.Subj
        inner = words[:-1] + "," if words.endswith(".") else words
        if r < 0.45:
            if name == who.Subj:
                self.say(f"\"{inner}\" {who.subj} {verb}.")
            else:
                self.say(f"\"{inner}\" {verb} {who.name}." if rng.random() < 0.6
                         else f"\"{inner}\" {who.name} {verb}.")
        elif r < 0.7:
            self.say(f"{name} {verb}, \"{words}\"")
        elif r < 0.85 and ". " in words:
            first, rest = words.split(". ", 1)
            self.say(f"\"{first},\" {verb} {who.name}. \"{rest}\"")
        else:
            beat = rng.choice(("{Name} smiled.", "{Name} looked up.", "{Name} nodded.",
                               "{Name} turned around.", "{Name} took a deep breath.",
                               "{Name} ran over."))
            self.say(who.f(beat), f"\"{words}\"")

    def somebody(self, kinds: str = "kaa") -> Who:
        """A new character: a child, an animal or a toy, not the hero's name."""
        k = self.rng.choice(kinds)
        if k == "k":
            return _kid(self.rng, self.taken)
        if k == "a":
            return _animal(self.rng, self.taken, named=self.rng.random() < 0.5)
        return _toy(self.rng, self.taken)

    def intro(self, who: Who) -> str:
        """How a newcomer is first named: "a fox named Pip", "a girl named Mia"."""
        adj = self.rng.choice(ANIMAL_ADJ if who.kind == "animal" else
                              KID_ADJ if who.kind == "kid" else TOY_ADJ)
        if who.name.startswith("the "):
            return _a(f"{adj} {who.noun}")
        return f"{_a(adj + ' ' + who.noun)} named {who.name}"


# ---- openings ----------------------------------------------------------------

def _opening(s: Story) -> None:
    h, rng = s.hero, s.rng
    adj = rng.choice(KID_ADJ if h.kind == "kid" else ANIMAL_ADJ if h.kind == "animal"
                     else TOY_ADJ)
    homes = HOMES if h.kind == "kid" else ANIMAL_HOMES
    home = rng.choice(homes)
    r = rng.random()
    if r < 0.3:
        s.say(f"Once upon a time, there was {_a(adj + ' ' + h.noun)} named {h.name}.")
    elif r < 0.42:
        s.say(f"Once upon a time, {home}, there lived {_a(adj + ' ' + h.noun)} named {h.name}.")
    elif r < 0.52:
        s.say(f"{h.Name} was {_a(adj + ' ' + h.noun)} who lived {home}.")
    elif r < 0.6:
        s.say(f"There once was {_a(adj + ' ' + h.noun)} called {h.name}.")
    elif r < 0.67:
        s.say(f"Long ago, {home}, there was {_a(h.noun)} named {h.name}.")
    elif r < 0.75:
        adj2, obj = rng.choice(OBJECTS)
        s.say(f"{h.Name} had {_a(adj2 + ' ' + obj)}.")
        s.say(h.f("{Subj} took it everywhere {subj} went."))
        return
    elif r < 0.83:
        s.say(s.pick("It was a sunny morning.", "It was a rainy day.", "It was a cold night.",
                     "The sun was shining.", "It was the first day of spring.",
                     "Snow was falling outside."))
        s.say(h.f(s.pick("{Name} woke up early.", "{Name} looked out of the window.",
                         "{Name} ran outside to play.", "{Name} could not sit still.")))
        return
    elif r < 0.9:
        s.say(f"{_cap(home)}, there was {_a(h.noun)} named {h.name}.")
    else:
        s.say(h.f(s.pick("{Name} loved Saturdays.", "{Name} had a big idea.",
                         "{Name} was bored.", "{Name} had a secret.")))
        return
    r = rng.random()
    like = rng.choice(LIKES).format(pos=h.pos)
    if r < 0.4:
        s.say(h.f(f"{{Subj}} loved to {like}."))
    elif r < 0.65:
        s.say(h.f(f"{{Subj}} was very {rng.choice(TRAITS)} and loved to {like}."))
    elif r < 0.8:
        s.say(h.f(f"Every day, {{subj}} liked to {like}."))
    elif r < 0.9:
        friend = s.somebody("ka")
        s.say(h.f(f"{{Pos}} best friend was {s.intro(friend)}."))
        s.taken.add(friend.name)
    # else: straight into the story


# ---- episodes: one paragraph each ----------------------------------------------

def _when(s: Story, first: bool) -> str:
    if first:
        return s.rng.choice(DAYS[:6] + DAYS[8:])
    return s.rng.choice(("The next day", "Later that day", "After that", "That evening",
                         "The next morning", "A few days later", "Then", "Soon"))


def _ep_find(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    thing = rng.choice(FINDS)
    noun = thing.split(" ", 1)[1]
    place = rng.choice(PLACES)
    s.say(h.f(f"{_when(s, first)}, {{name}} went to {place}."))
    if s.chance(0.5):
        s.say(f"There were {rng.choice(PLACE_SIGHTS)} and {rng.choice(PLACE_SIGHTS)}.")
    s.say(h.f(f"{{Subj}} found {thing} {rng.choice(SPOTS)}."))
    s.feel(h, rng.choice(("curious", "surprised", "excited")))
    s.line(h, s.pick(f"What is this {noun}?", "Where did this come from?",
                     f"Look at this {noun}!", "I wonder who lost this."))
    r = rng.random()
    if r < 0.35:
        owner = s.somebody()
        s.say(f"Just then, {s.intro(owner)} came by.")
        s.line(owner, s.pick(f"That is my {noun}!", f"You found my {noun}!",
                             f"I was looking for my {noun} all day."))
        s.say(h.f(f"{{Name}} gave the {noun} back."), owner.f("{Name} was so happy."))
        s.line(owner, s.pick("Thank you!", "Thank you so much!", "You are very kind."))
        s.say(s.pick("They became friends.", "They played together until dinner.",
                     f"{h.Name} felt good inside."))
    elif r < 0.7:
        s.say(h.f(f"{{Subj}} took the {noun} home and showed it to {{pos}} {rng.choice(ADULTS)}."))
        s.say(s.pick(f"The {noun} began to glow.", f"Something was inside the {noun}.",
                     f"The {noun} was very old.", f"On the {noun} was a little picture of a tree."))
        s.feel(h, "surprised")
        s.say(h.f(s.pick("{Name} kept it in a safe place.", "{Subj} put it under {pos} pillow.",
                         "{Subj} wanted to know more about it.")))
    else:
        s.say(h.f(f"The {noun} led {{obj}} to {rng.choice(PLACES)}."))
        s.say(s.pick(f"There was {rng.choice(FINDS)} and a note.", "There was a big surprise.",
                     f"There were all of {h.pos} friends!"))
        s.feel(h, "happy")


def _ep_meet(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    other = s.somebody()
    s.say(h.f(f"{_when(s, first)}, {{name}} was playing in {rng.choice(PLACES)}."))
    s.say(f"{h.Subj} saw {s.intro(other)}.")
    mood = rng.choice(("sad", "lonely", "scared", "happy"))
    word = rng.choice(FEELINGS[mood])
    s.say(other.f(f"{{Name}} looked {word}." if mood != "lonely" else "{Name} was all alone."))
    if mood == "happy":
        s.line(other, s.pick("Do you want to play with me?", "Hello! What is your name?",
                             "Can I be your friend?"))
        s.line(h, s.pick(f"My name is {h.name}. Yes, let us play!", "Yes, I would like that!",
                         "Sure! Let us play together."))
    else:
        s.line(h, s.pick("Why are you sad?", "What is wrong?", "Are you okay?",
                         "Can I help you?"))
        s.line(other, s.pick("I have no friends.", "Nobody wants to play with me.",
                             "I am lost and I cannot find my home.",
                             "I am new here and I do not know anyone."))
        s.line(h, s.pick("I will be your friend!", "You can play with me!",
                         "Do not worry. I will help you."))
        s.feel(other, "happy")
    s.say(f"{h.Name} and {other.name} played {rng.choice(GAMES)}.")
    s.say(s.pick("They laughed and had lots of fun.", "They ran and jumped all day long.",
                 "They had so much fun together.", "The time went by fast.",
                 "They played until it was dark.", "They played until the sun went down."))
    if s.chance(0.5):
        s.say(h.f(s.pick(f"When the sun went down, {{name}} waved goodbye to {other.name}.",
                         f"At the end of the day, {{name}} said, \"See you tomorrow, {other.call}!\"")))


def _ep_lost(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    adj, obj = rng.choice(OBJECTS)
    spots = rng.sample(SPOTS, 3)
    s.say(h.f(f"{{Name}} had {_a(adj + ' ' + obj)} that {{subj}} loved very much."))
    s.say(h.f(s.pick(f"{_when(s, first)}, {{name}} could not find {{pos}} {obj}.",
                     f"{_when(s, first)}, the {obj} was gone!")))
    s.say(h.f(f"{{Subj}} looked {spots[0]}."), h.f(f"{{Subj}} looked {spots[1]}."))
    s.say(s.pick("It was not there.", f"The {obj} was nowhere to be found."))
    s.feel(h, "sad")
    helper = s.somebody("kkat") if s.chance(0.6) else None
    if helper is None:
        adult = rng.choice(ADULTS)
        s.say(h.f(f"{{Pos}} {adult} came in."))
        s.say(f"\"What is wrong?\" asked {h.pos} {adult}.")
        s.line(h, f"I lost my {obj}.")
        s.say(f"\"Let us look together,\" said {h.pos} {adult}.")
        s.say(f"They found the {obj} {spots[2]}.")
    else:
        s.say(f"Then {s.intro(helper)} came by.")
        s.line(helper, s.pick("Why are you sad?", "What happened?"))
        s.line(h, f"I lost my {obj}.")
        s.line(helper, s.pick("Do not worry. I will help you.", "I can help you look!"))
        s.say(s.pick("They looked everywhere.", f"They went to {rng.choice(PLACES)} to look."))
        s.say(f"At last, {helper.name} found the {obj} {spots[2]}.")
    s.feel(h, "happy")
    s.line(h, s.pick("Thank you!", f"My {obj}! Thank you!", "I am so glad we found it!"))


def _ep_weather(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    adult = rng.choice(ADULTS)
    place = rng.choice(("the park", "the hill", "the meadow", "the lake", "the garden",
                        "the beach", "the woods"))
    start, then = rng.choice(WEATHER)
    if s.chance(0.5):
        foods = rng.sample(FOODS, 2)
        s.say(h.f(f"{_when(s, first)}, {{name}} and {{pos}} {adult} went to {place} for a picnic."))
        s.say(f"They ate {foods[0]} and {foods[1]}.")
    else:
        s.say(h.f(f"{_when(s, first)}, {{name}} was playing in {place}."))
    s.say(f"Suddenly, {start}. {_cap(then)}.")
    s.feel(h, rng.choice(("scared", "surprised", "excited")))
    if "snow" in start:
        s.say(h.f("{Subj} made a snowman with a carrot nose."))
        s.line(h, s.pick("Look at my snowman!", "I love the snow!"))
    else:
        s.say(s.pick("They ran under a big tree to stay dry.", "They hid under a big umbrella.",
                     "They ran back inside and looked out of the window."))
        s.say(h.f(f"{{Pos}} {adult} held {{pos}} hand."))
        s.say(f"\"Do not worry,\" said {h.pos} {adult}. \"It will stop soon.\"")
        s.say(s.pick("After a while, the sky was clear again.",
                     "Soon the sun came out, and there was a big rainbow!",
                     "After a while, it was quiet again."))
        s.line(h, s.pick("It is so pretty!", "Can we go out again?", "That was a big storm!"))
    s.say(s.pick("They walked home together.", "Then they went home.",
                 "It was a day to remember."))


def _ep_try(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    want, did = rng.choice(GOALS)
    want, did = want.format(pos=h.pos), did.format(pos=h.pos)
    helper = rng.choice(ADULTS)
    s.say(h.f(f"{_when(s, first)}, {{name}} wanted to {want}."))
    s.say(h.f(s.pick("{Subj} tried, but {subj} fell down.", "{Subj} tried and tried, but it was hard.",
                     "It did not work the first time.")))
    s.feel(h, rng.choice(("sad", "angry", "tired")))
    s.line(h, s.pick("I can not do it.", "It is too hard!", "I will never learn this."))
    s.say(f"{h.Pos} {helper} said, \"{s.pick('Do not give up.', 'Try again.', 'You can do it.')} "
          f"{s.pick('Go slowly.', 'I will help you.', 'Everyone falls at first.')}\"")
    s.say(h.f("So {name} tried again."))
    if s.chance(0.5):
        s.say(h.f("{Subj} fell down again, but {subj} did not stop."))
    s.say(s.pick("This time, it worked!", "On the third try, it worked!", "And then it worked!"))
    s.say(h.f(f"{{Name}} {did}."))
    s.feel(h, "proud")
    s.say(h.f(f"{{Pos}} {helper} clapped and gave {{obj}} a big hug."))


def _ep_help(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    other = s.somebody("aat")
    trouble, fix = rng.choice(TROUBLES)
    s.say(h.f(f"{_when(s, first)}, {{name}} was walking in {rng.choice(PLACES)}."))
    s.say(h.f(f"{{Subj}} heard {rng.choice(SOUNDS)}."))
    s.say(f"It was {s.intro(other)}.")
    who = other.name
    s.say(f"{_cap(who)} was {trouble}.")
    s.feel(other, "scared")
    s.line(other, s.pick("Help me, please!", "Can you help me?", "I cannot get out!"))
    s.line(h, s.pick("Do not be scared. I will help you.", "Hold on! I am coming!",
                     "I will help you."))
    s.say(h.f(f"{{Subj}} {fix.format(pos=h.pos)}."))
    s.say(f"Soon {who} was safe.")
    s.line(other, s.pick(f"Thank you, {h.name}!", "Thank you! You are very kind.",
                         "You saved me!"))
    s.feel(h, "happy")
    s.say(s.pick(f"{_cap(who)} and {h.name} became good friends.",
                 f"{_cap(who)} came to visit {h.name} the next day.", ""))


def _ep_share(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    adj, obj = rng.choice(OBJECTS)
    friend = s.somebody("kka")
    s.say(h.f(f"{_when(s, first)}, {{name}} got {_a(adj + ' ' + obj)}."))
    s.say(h.f(f"{{Subj}} took it to {rng.choice(PLACES)} to play."))
    s.say(f"{s.intro(friend)[0].upper() + s.intro(friend)[1:]} saw the {obj}."
          if not friend.name.startswith("the ") else f"{_cap(friend.name)} saw the {obj}.")
    s.line(friend, s.pick("Can I play with it too?", "Can I have a turn?", "Will you share?"))
    s.line(h, s.pick("No, it is mine!", "No! Go away.", "Not now."))
    s.say(friend.f("{Name} was sad and walked away."))
    s.say(h.f("{Name} played alone, but it was not fun."))
    s.feel(h, s.pick("sad", "lonely"))
    s.say(h.f(f"{{Subj}} ran to {friend.name} and said, \"I am sorry. Let us play together.\""))
    s.say(friend.f(f"{{Name}} smiled. They played with the {obj} and had lots of fun."))


def _ep_make(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    adult = rng.choice(ADULTS)
    treat = rng.choice(TREATS)
    s.say(h.f(f"{_when(s, first)}, {{pos}} {adult} was making {treat} in the kitchen."))
    s.line(h, s.pick("Can I help?", "What are you making?", "Can I try?"))
    s.say(f"\"Yes, you can,\" said {h.pos} {adult}.")
    s.say(h.f(s.pick("{Name} mixed the flour, the eggs and the milk.",
                     "{Name} put in a cup of sugar.", "{Name} stirred the pot with a big spoon.")))
    s.say(s.pick("Some flour got on the floor, and they both laughed.",
                 "Oops! An egg fell on the floor.", h.f("{Subj} stirred and stirred until it was smooth.")))
    s.say(s.pick("Soon the kitchen smelled sweet and warm.", "Soon it was ready.",
                 "They waited and waited."))
    friend = s.somebody("kk")
    s.say(h.f(f"{{Name}} took some to {{pos}} friend {friend.name}."))
    s.line(friend, s.pick("This is yummy!", "Can I have more?", "You made this? It is so good!"))
    s.feel(h, "proud")


def _ep_fear(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    adult = rng.choice(ADULTS)
    adj, obj = rng.choice(OBJECTS)
    r = rng.random()
    if r < 0.5:
        s.say(h.f(f"{_when(s, False) if not first else 'One night'}, {{name}} saw a big shadow on the wall."))
        s.line(h, s.pick("Help!", "Who is there?", "Mom! Dad!"), "cried")
        s.say(h.f(f"{{Pos}} {adult} came in and turned on the light."))
        s.say(h.f(f"The shadow was only {{pos}} {adj} {obj}!"))
        s.say(h.f(f"{{Name}} laughed. \"It is just my {obj},\" {{subj}} said."))
    else:
        s.say(h.f(f"{_when(s, first)}, {{name}} heard {rng.choice(SOUNDS)} outside."))
        s.feel(h, "scared")
        s.say(h.f("{Subj} opened the door a little."))
        other = s.somebody("a")
        s.say(f"It was just {s.intro(other)}!")
        s.line(other, s.pick("Hello! Can I come in? It is cold.", "Sorry! I did not mean to scare you.",
                             "I am looking for my family."))
        s.say(h.f(f"{{Name}} let {other.name if not other.name.startswith('the ') else 'it'} in "
                  f"and gave {other.obj} some warm milk."))
    s.feel(h, "happy")


def _ep_trip(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    place = rng.choice(PLACES)
    how = rng.choice(TRANSPORT).format(pos=h.pos)
    adult = rng.choice(ADULTS)
    s.say(h.f(f"{_when(s, first)}, {{name}} and {{pos}} {adult} went to {place} {how}."))
    s.feel(h, "excited")
    s.say(f"On the way, they saw {rng.choice(PLACE_SIGHTS)} and {rng.choice(PLACE_SIGHTS)}.")
    s.line(h, s.pick("Are we there yet?", f"I want to see {place}!", "Look at that!"))
    s.say(f"At last, they got to {place}.")
    s.say(s.pick(f"There was {rng.choice(CREATURES)} at the gate.",
                 f"They saw {rng.choice(PLACE_SIGHTS)}.", "It was bigger than they thought.",
                 f"There was a man selling {rng.choice(FOODS)}."))
    s.say(h.f(s.pick("{Name} wanted to stay there forever.", "{Subj} took a picture.",
                     "{Name} ran to look at everything.")))


def _ep_magic(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    creature = rng.choice(CREATURES)
    bare = creature.split(" ", 1)[1]
    s.say(h.f(f"{_when(s, first)}, something strange happened."))
    s.say(h.f(s.pick(f"{_cap(creature)} came to {{pos}} door.",
                     f"{{Name}} met {creature} in {rng.choice(PLACES)}.",
                     f"{_cap(creature)} fell from the sky and landed next to {{name}}.")))
    s.feel(h, rng.choice(("surprised", "scared", "curious")))
    s.say(f"\"Hello,\" said the {bare}. \"{s.pick('I need your help.', 'I have lost my way.', 'Will you be my friend?', 'I can give you one wish.')}\"")
    wish = rng.random() < 0.3
    if wish:
        s.say(h.f(s.pick("{Name} thought and thought.", "{Name} closed {pos} eyes.")))
        s.line(h, s.pick("I wish everyone could be happy.", "I wish I could fly.",
                         "I wish for a big tree house."))
        s.say(s.pick("There was a flash of light.", "The stars began to sparkle.",
                     "The wind began to sing."))
        s.feel(h, "happy")
    else:
        s.line(h, s.pick("What can I do?", "Where do you live?", "Of course!"))
        s.say(f"The {bare} took {h.name} on a big adventure over {rng.choice(PLACES)}.")
        s.say(s.pick("They flew over the houses.", "They went over the hills and far away.",
                     "They danced under the moon."))
        s.say(f"When it was over, the {bare} brought {h.name} back home.")


def _ep_race(s: Story, first: bool) -> None:
    h, rng = s.hero, s.rng
    other = s.somebody("kka")
    place = rng.choice(("the park", "the field", "the hill", "the river", "the school yard"))
    s.say(h.f(f"{_when(s, first)}, there was a big race at {place}."))
    s.say(f"{h.Name} and {other.name} ran as fast as they could.")
    s.say(s.pick(f"{_cap(other.name)} fell and hurt {other.pos} knee.",
                 f"{_cap(other.name)} tripped on a stone."))
    s.say(h.f("{Name} stopped to help."))
    s.line(h, s.pick("Are you okay?", "Let me help you up.", "Take my hand."))
    s.say(s.pick("They walked to the end together.", "They crossed the line side by side."))
    s.say(s.pick("Everyone clapped for them.", "They did not win, but they were happy.",
                 "The teacher gave them a medal for being kind."))
    s.feel(h, "proud")


EPISODES = (_ep_find, _ep_meet, _ep_lost, _ep_weather, _ep_try, _ep_help, _ep_share,
            _ep_make, _ep_fear, _ep_trip, _ep_magic, _ep_race)


# ---- endings: the only place a story ends ----------------------------------------

def _ending(s: Story) -> None:
    h, rng = s.hero, s.rng
    r = rng.random()
    if r < 0.2:
        s.say(h.f(s.pick("From that day on, {name} was never {lesson} again.",
                         "From that day on, {name} always helped others.",
                         "From that day on, {name} and {pos} friends played together every day."
                         ).replace("{lesson}", rng.choice(("scared", "lonely", "sad", "bored")))))
    elif r < 0.35:
        s.say(h.f(s.pick("{Name} learned that it is good to share.",
                         "{Name} learned that friends help each other.",
                         "{Name} learned to never give up.",
                         "{Name} learned that being kind makes everyone happy.")))
    elif r < 0.5:
        s.say(h.f(s.pick("That night, {name} went to bed with a big smile.",
                         "That night, {name} dreamed about the day.",
                         "{Name} fell asleep, happy and warm.")))
    elif r < 0.65:
        s.say(s.pick("It was the best day ever.", "What a wonderful day it was!",
                     "And they all lived happily ever after."))
    elif r < 0.8:
        s.say(h.f("{Name} went home and told {pos} family all about it."),
              s.pick(f"They were very proud of {h.obj}.", "Everyone smiled."))
    else:
        s.say(h.f(s.pick("{Name} would never forget this day.",
                         "{Name} knew that tomorrow would be another great day.",
                         "{Name} hugged {pos} friends and said goodbye.")))
    if s.chance(0.2):
        s.say("The end.")


# ---- co-writing: lines as a person types them -------------------------------------

def _typed(s: Story, sentence: str) -> str:
    """A story sentence as a person might type it: lower case, no full stop,
    "and then" in front (each some of the time)."""
    rng = s.rng
    r = rng.random()
    if r < 0.25 and sentence[:1].isupper() and not sentence.startswith(("I ", "\"")):
        head = sentence.split(" ", 1)[0]
        if not (head in s.taken or head == s.hero.name or head[:1] in "\""):
            sentence = sentence[0].lower() + sentence[1:]
    elif (r < 0.45 and sentence[:1].isupper()
          and not sentence.startswith(("\"", "Then", "Suddenly", "Just"))):
        head = sentence.split(" ", 1)[0]
        lower = head in s.taken or head == s.hero.name or head == "I"
        sentence = rng.choice(("and then ", "Then ", "then ", "And ")) + (
            sentence if lower else sentence[0].lower() + sentence[1:])
    return sentence


def _interject(s: Story) -> None:
    """A line someone typed into the story, and the sentences that take it up."""
    h, rng = s.hero, s.rng
    r = rng.random()
    if r < 0.25:
        creature = rng.choice(CREATURES)
        bare = creature.split(" ", 1)[1]
        s.say(_typed(s, f"Suddenly, {creature} appeared."))
        s.say(f"The {bare} {s.pick('looked at', 'waved at', 'smiled at')} {h.name}.")
        s.line(h, s.pick("Who are you?", "Hello! Do you want to play?", "Where did you come from?"))
        s.say(f"\"I am {s.pick('lost', 'looking for a friend', 'very hungry', 'on a trip')},\" said the {bare}.")
    elif r < 0.45:
        other = s.somebody()
        s.say(_typed(s, f"Then {s.intro(other)} came along."))
        s.line(other, s.pick(f"Hi {h.name}! What are you doing?", "Can I come too?",
                             "I have something to show you!"))
        s.say(h.f(s.pick("{Name} was happy to see a new friend.", "{Name} said yes.",
                         f"{{Name}} and {other.name} went on together.")))
    elif r < 0.6:
        sound = rng.choice(SOUNDS)
        s.say(_typed(s, f"{h.Name} heard {sound}."))
        s.say(s.pick("It came from behind the trees.", "It came from the house.",
                     "It was very close."))
        s.feel(h, rng.choice(("curious", "scared")))
        s.say(h.f("{Subj} went to look."))
    elif r < 0.75:
        adj, obj = rng.choice(OBJECTS)
        s.say(_typed(s, h.f(f"{{Name}} found {_a(adj + ' ' + obj)}.")))
        s.say(h.f("{Subj} picked it up and looked at it."), f"The {obj} was {s.pick('warm', 'heavy', 'very small', 'covered in mud', 'humming')}.")
    elif r < 0.88:
        words = s.pick("Let us go on an adventure!", "I am hungry.", "What was that?",
                       "Look over there!", "This is fun!", "I want to go home.")
        s.say(f"\"{words}\" said {h.name}.")
        s.say(s.pick("Everyone laughed.", "So they did.", "Nobody answered.",
                     f"{h.Pos} friend nodded."))
    else:
        s.say(_typed(s, h.f(s.pick("{Name} was very hungry.", "{Name} wanted to fly.",
                                   "{Subj} did not like that at all.",
                                   "{Name} was tired of waiting."))))
        s.say(h.f(s.pick("So {subj} had an idea.", "{Subj} looked around.",
                         "{Pos} tummy began to rumble.", "{Subj} thought for a while.")))


def _one(rng: random.Random) -> str:
    taken: set[str] = set()
    r = rng.random()
    hero = _kid(rng, taken) if r < 0.65 else _animal(rng, taken) if r < 0.9 else _toy(rng, taken)
    s = Story(rng, hero, taken)
    _opening(s)
    together = rng.random() < 0.35
    n_eps = rng.choice((1, 1, 2, 2, 2, 3))
    eps = rng.sample(EPISODES, n_eps)
    for i, ep in enumerate(eps):
        if i and s.chance(0.7):
            s.para()
        ep(s, i == 0)
        if together and s.chance(0.6):
            _interject(s)
        if i + 1 < n_eps and s.chance(0.4):
            s.say(_pause(s))
    if s.chance(0.5):
        s.para()
    _ending(s)
    return s.text()


def _pause(s: Story) -> str:
    """A sentence that closes an episode but not the story: the story goes on."""
    return s.hero.f(s.pick("They went home.", "Then it was time for bed.", "{Name} went home.",
                           "That was the end of the day.", "{Name} waved goodbye.",
                           "It was getting late."))


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
