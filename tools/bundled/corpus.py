"""Offline English corpus for the bundled tiny model: template stories, simple facts and chat dialogues.

Everything is generated here from word lists and sentence templates (no downloads, no external text), so
the corpus is reproducible from a seed. A 2M-parameter model cannot learn open English, but it can learn a
small, grammatical world well enough that `plumb run` and `plumb chat` print readable sentences.

    python3 corpus.py --sample 5        # print a few documents of each kind
    python3 corpus.py --stats           # sizes of a full corpus

Chat documents are rendered with the DeepSeek-V4 encoding rules (see docs/generation.md): multi-turn
history keeps earlier reasoning (drop_thinking=False), which is exactly what `plumb chat` feeds its cache.
"""

import argparse
import random

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
THINK, END_THINK = "<think>", "</think>"

NAMES = [("Tom", "he"), ("Lily", "she"), ("Ben", "he"), ("Mia", "she"), ("Sam", "he"), ("Anna", "she"),
         ("Max", "he"), ("Lucy", "she"), ("Jack", "he"), ("Emma", "she"), ("Leo", "he"), ("Sara", "she"),
         ("Tim", "he"), ("Zoe", "she"), ("Joe", "he"), ("Amy", "she"), ("Dan", "he"), ("Ella", "she"),
         ("Bob", "he"), ("Kate", "she"), ("Finn", "he"), ("Rosa", "she"), ("Noah", "he"), ("Ivy", "she")]
ANIMALS = ["cat", "dog", "bird", "rabbit", "fox", "bear", "frog", "duck", "mouse", "horse", "owl", "fish",
           "lion", "turtle", "squirrel", "pig", "cow", "goat", "bee", "deer"]
SOUNDS = {"cat": "meow", "dog": "woof", "bird": "tweet", "duck": "quack", "cow": "moo", "pig": "oink",
          "owl": "hoot", "lion": "roar", "frog": "ribbit", "horse": "neigh", "goat": "baa", "bee": "buzz",
          "mouse": "squeak", "bear": "growl"}
EATS = {"cat": "fish", "dog": "bones", "bird": "seeds", "rabbit": "carrots", "fox": "berries", "bear": "honey",
        "frog": "flies", "duck": "bread", "mouse": "cheese", "horse": "hay", "owl": "mice", "fish": "small bugs",
        "lion": "meat", "turtle": "leaves", "squirrel": "nuts", "pig": "apples", "cow": "grass", "goat": "grass",
        "bee": "nectar", "deer": "leaves"}
LIVES = {"cat": "in a house", "dog": "in a house", "bird": "in a nest", "rabbit": "in a hole", "fox": "in the woods",
         "bear": "in a cave", "frog": "in a pond", "duck": "on a lake", "mouse": "in a small hole", "horse": "on a farm",
         "owl": "in a tree", "fish": "in the sea", "lion": "on the plains", "turtle": "by the river",
         "squirrel": "in a tree", "pig": "on a farm", "cow": "on a farm", "goat": "on a hill", "bee": "in a hive",
         "deer": "in the forest"}
ADJ = ["little", "big", "happy", "brave", "kind", "shy", "small", "funny", "gentle", "curious", "sleepy", "clever"]
PLACES = ["the park", "the forest", "the garden", "the beach", "the farm", "the town", "the river", "the hill",
          "the meadow", "the lake", "the market", "the school"]
# "at the beach", "in the forest": the preposition each place takes.
AT = {"the beach", "the farm", "the river", "the lake", "the market", "the school", "the hill"}


def at(place):
    return ("at " if place in AT else "in ") + place
OBJECTS = [("ball", "red"), ("kite", "blue"), ("box", "brown"), ("hat", "green"), ("book", "yellow"),
           ("cup", "white"), ("shoe", "black"), ("key", "gold"), ("flower", "pink"), ("stone", "gray"),
           ("boat", "orange"), ("drum", "purple"), ("map", "old"), ("bell", "shiny"), ("leaf", "green"),
           ("star", "bright"), ("toy", "new"), ("coat", "warm")]
FEELINGS = ["happy", "sad", "scared", "excited", "tired", "proud", "surprised", "angry", "calm", "glad"]
FOODS = ["cake", "pie", "sandwich", "pizza", "pancake", "loaf of bread"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "cloudy", "snowy"]
COLORS = {"the sky": "blue", "the grass": "green", "the sun": "yellow", "snow": "white", "coal": "black",
          "a banana": "yellow", "an apple": "red", "the sea": "blue", "a carrot": "orange", "milk": "white",
          "a lemon": "yellow", "a cherry": "red", "a leaf": "green", "chocolate": "brown"}
OPPOSITES = [("big", "small"), ("hot", "cold"), ("up", "down"), ("happy", "sad"), ("fast", "slow"),
             ("day", "night"), ("old", "new"), ("open", "closed"), ("wet", "dry"), ("loud", "quiet"),
             ("light", "dark"), ("full", "empty"), ("tall", "short"), ("hard", "soft")]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
SYSTEMS = ["You are a helpful assistant.", "You are a friendly assistant who tells short stories.",
           "You are plumb, a tiny helpful model.", "Answer in short, simple sentences."]


def a_an(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def cap(s):
    return s[0].upper() + s[1:]


class Hero:
    def __init__(self, rnd, animal=None):
        self.name, self.he = rnd.choice(NAMES)
        self.his = "his" if self.he == "he" else "her"
        self.him = "him" if self.he == "he" else "her"
        self.animal = animal or rnd.choice(ANIMALS)
        self.adj = rnd.choice(ADJ)


def story(rnd, animal=None):
    """One short story: setting, a problem or a find, a helper, an ending with a feeling or a lesson."""
    h = Hero(rnd, animal)
    friend = Hero(rnd)
    while friend.name == h.name:
        friend = Hero(rnd)
    obj, color = rnd.choice(OBJECTS)
    place = rnd.choice(PLACES)
    food = rnd.choice(FOODS)
    s = []
    opening = rnd.choice([
        f"Once upon a time, there was {a_an(h.adj)} {h.animal} named {h.name}.",
        f"There was once {a_an(h.adj)} {h.animal} called {h.name}.",
        f"{h.name} was {a_an(h.adj)} {h.animal} who lived {LIVES[h.animal]}.",
        f"One {rnd.choice(WEATHER)} day, {a_an(h.adj)} {h.animal} named {h.name} went to {place}.",
    ])
    s.append(opening)
    if "lived" not in opening:
        s.append(f"{cap(h.he)} lived {LIVES[h.animal]} and loved to eat {EATS[h.animal]}.")
    kind = rnd.randrange(5)
    if kind == 0:  # a find
        s.append(f"One day, {h.name} found {a_an(color)} {obj} {at(place)}.")
        s.append(f"{cap(h.he)} was very {rnd.choice(['happy', 'excited', 'surprised'])}.")
        s.append(f"{h.name} showed the {obj} to {h.his} friend {friend.name} the {friend.animal}.")
        s.append(f"\"Let's play with it together,\" said {friend.name}.")
        s.append(f"They played with the {obj} all day, and they were very happy.")
    elif kind == 1:  # a loss and help
        s.append(f"One day, {h.name} lost {h.his} {color} {obj}.")
        s.append(f"{cap(h.he)} looked everywhere, but {h.he} could not find it.")
        s.append(f"{h.name} felt sad and began to cry.")
        s.append(f"Then {friend.name} the {friend.animal} came and asked, \"Why are you sad?\"")
        s.append(f"\"I lost my {obj},\" said {h.name}.")
        s.append(f"{friend.name} helped {h.him} look, and soon they found the {obj} near {place}.")
        s.append(f"{h.name} said, \"Thank you, {friend.name}!\" They were good friends.")
    elif kind == 2:  # sharing food
        s.append(f"One morning, {h.name} made a big {food}.")
        s.append(f"{cap(h.his)} friend {friend.name} was hungry, so {h.name} gave {friend.name} half of the {food}.")
        s.append(f"\"You are very kind,\" said {friend.name}.")
        s.append(f"They sat together {at(place)} and ate the {food}.")
        s.append("Sharing made them both feel warm and happy.")
    elif kind == 3:  # weather and fear
        w = rnd.choice(["rainy", "windy", "snowy", "cold"])
        s.append(f"One {w} night, {h.name} heard a loud noise.")
        s.append(f"{cap(h.he)} was scared and hid under {h.his} bed.")
        s.append(f"{h.his.capitalize()} mom said, \"Do not be scared. It is only the wind.\"")
        s.append(f"{h.name} felt calm again and went to sleep.")
        s.append(f"In the morning, the sun was bright and {h.name} was happy.")
    else:  # a trip and a lesson
        place = rnd.choice([p for p in PLACES if p != "the hill"])
        s.append(f"One day, {h.name} wanted to climb the big hill near {place}.")
        s.append(f"{cap(h.he)} tried and tried, but the hill was too high.")
        s.append(f"{friend.name} the {friend.animal} said, \"Do not give up. Try again, one step at a time.\"")
        s.append(f"{h.name} tried again, and at last {h.he} reached the top.")
        s.append(f"From the top, {h.he} could see all of {place}. {cap(h.he)} felt very proud.")
    s.append(rnd.choice([
        "The end.", f"{h.name} learned that friends help each other.", "And they lived happily ever after.",
        f"From that day on, {h.name} was never {rnd.choice(['sad', 'alone', 'scared'])} again.", ""]))
    return " ".join(x for x in s if x)


def fact(rnd):
    k = rnd.randrange(7)
    an = rnd.choice(ANIMALS)
    if k == 0:
        thing = rnd.choice(list(COLORS))
        return f"The color of {thing} is {COLORS[thing]}." if rnd.random() < 0.5 else f"{cap(thing)} is {COLORS[thing]}."
    if k == 1 and an in SOUNDS:
        return f"A {an} says {SOUNDS[an]}."
    if k == 2:
        return f"{cap(a_an(an))} likes to eat {EATS[an]}."
    if k == 3:
        return f"{cap(a_an(an))} lives {LIVES[an]}."
    if k == 4:
        a, b = rnd.choice(OPPOSITES)
        return f"The opposite of {a} is {b}."
    if k == 5:
        a, b = rnd.randrange(0, 11), rnd.randrange(0, 11)
        return f"{a} plus {b} is {a + b}."
    n = rnd.randrange(1, 20)
    return f"The number {n} is written as {NUMBER_WORDS[n]}."


def facts_paragraph(rnd):
    return " ".join(fact(rnd) for _ in range(rnd.randrange(3, 8)))


# --- chat ------------------------------------------------------------------------------------------------

def qa(rnd):
    """(question, answer, reasoning) for one turn. reasoning is a short thought for thinking mode."""
    k = rnd.randrange(12)
    an = rnd.choice(ANIMALS)
    if k == 0:
        thing = rnd.choice(list(COLORS))
        q = rnd.choice([f"What color is {thing}?", f"What is the color of {thing}?"])
        return q, f"{cap(thing)} is {COLORS[thing]}.", f"The user asks about the color of {thing}. It is {COLORS[thing]}."
    if k == 1:
        an = rnd.choice(list(SOUNDS))
        return (f"What does a {an} say?", f"A {an} says {SOUNDS[an]}.",
                f"The user asks about the sound of a {an}. A {an} says {SOUNDS[an]}.")
    if k == 2:
        return (f"What does {a_an(an)} eat?", f"{cap(a_an(an))} likes to eat {EATS[an]}.",
                f"The user asks what {a_an(an)} eats. It eats {EATS[an]}.")
    if k == 3:
        return (f"Where does {a_an(an)} live?", f"{cap(a_an(an))} lives {LIVES[an]}.",
                f"The user asks where {a_an(an)} lives. It lives {LIVES[an]}.")
    if k == 4:
        a, b = rnd.choice(OPPOSITES)
        return f"What is the opposite of {a}?", f"The opposite of {a} is {b}.", f"The opposite of {a} is {b}."
    if k == 5:
        a, b = rnd.randrange(0, 11), rnd.randrange(0, 11)
        q = rnd.choice([f"What is {a} plus {b}?", f"What is {a} + {b}?", f"How much is {a} plus {b}?"])
        return q, f"{a} plus {b} is {a + b}.", f"I add {a} and {b}. {a} plus {b} is {a + b}."
    if k == 6:
        q = rnd.choice(["Tell me a story.", "Can you tell me a story?", f"Tell me a story about a {an}.",
                        f"Please tell me a short story about a {an}."])
        animal = an if "about" in q else None
        return q, story(rnd, animal), "The user wants a short story. I will tell a simple one."
    if k == 7:
        q = rnd.choice(["Hello!", "Hi!", "Hello.", "Hi there!", "Good morning!"])
        a = rnd.choice(["Hello! How can I help you today?", "Hi! What would you like to talk about?",
                        "Hello! I can tell you a story or answer a simple question."])
        return q, a, "The user says hello. I will greet them."
    if k == 8:
        q = rnd.choice(["Who are you?", "What are you?", "What is your name?"])
        a = rnd.choice(["I am a tiny language model that runs in plumb. I know simple facts and short stories.",
                        "I am plumb's tiny model. I can tell short stories and answer easy questions."])
        return q, a, "The user asks who I am. I am a tiny model in plumb."
    if k == 9:
        n = rnd.randrange(1, 20)
        return (f"How do you write {n} in words?", f"{n} is written as {NUMBER_WORDS[n]}.",
                f"The number {n} in words is {NUMBER_WORDS[n]}.")
    if k == 10:
        q = rnd.choice(["Thank you!", "Thanks!", "Thank you very much."])
        return q, rnd.choice(["You are welcome!", "You are welcome! Have a nice day."]), "The user thanks me."
    h = Hero(rnd, an)
    q = f"What is a good name for a {an}?"
    return q, f"A good name for a {an} is {h.name}.", f"I will pick a friendly name for a {an}: {h.name}."


def render_chat(system, turns, thinking):
    """turns: [(user, answer, reasoning)]. Official DeepSeek-V4 encoding with drop_thinking=False."""
    out = BOS + (system or "")
    for user, answer, reasoning in turns:
        out += USER + user + ASSISTANT
        if thinking:
            out += THINK + reasoning + END_THINK + answer + EOS
        else:
            out += END_THINK + answer + EOS
    return out


def chat_doc(rnd):
    system = rnd.choice(SYSTEMS) if rnd.random() < 0.4 else ""
    thinking = rnd.random() < 0.2
    turns = []
    if rnd.random() < 0.25:  # a conversation that needs the earlier turn (the cache kept across turns)
        name, _ = rnd.choice(NAMES)
        turns.append((f"My name is {name}.", f"Nice to meet you, {name}! How can I help you?",
                      f"The user's name is {name}."))
        for _ in range(rnd.randrange(0, 2)):
            turns.append(qa(rnd))
        turns.append((rnd.choice(["What is my name?", "Do you remember my name?"]), f"Your name is {name}.",
                      f"The user told me their name earlier. It is {name}."))
    else:
        for _ in range(rnd.randrange(1, 4)):
            turns.append(qa(rnd))
    return render_chat(system, turns, thinking)


def documents(seed, n_docs):
    """Yields (kind, text) documents. Raw text documents get BOS/EOS around them when tokenized."""
    rnd = random.Random(seed)
    for _ in range(n_docs):
        r = rnd.random()
        if r < 0.55:
            yield "story", story(rnd)
        elif r < 0.65:
            yield "facts", facts_paragraph(rnd)
        else:
            yield "chat", chat_doc(rnd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=0, help="print N documents")
    ap.add_argument("--stats", action="store_true", help="size of a 200k-document corpus")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.sample:
        for kind, text in documents(a.seed, a.sample):
            print(f"[{kind}] {text}\n")
    if a.stats:
        n, chars, kinds = 0, 0, {}
        for kind, text in documents(a.seed, 200000):
            n += 1
            chars += len(text)
            kinds[kind] = kinds.get(kind, 0) + 1
        print(f"{n} documents, {chars / 1e6:.1f} M characters, {kinds}")


if __name__ == "__main__":
    main()
