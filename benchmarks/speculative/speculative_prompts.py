"""Prompt sets of `benchmarks/speculative/speculative.py` (texts written for this project).

copy       edit-and-copy requests with short answers: rename a variable in a 10-15 line function and
           return it; fix the typos in a 60-80 word paragraph and return it (the answers end after
           60-100 tokens, so a 160-token run writes free text after them).
copy-long  the same two requests on texts long enough that copying them fills 160 new tokens and
           more: a 40-60 line piece of code, a 250-300 word passage (`benchmarks/speculative/prompts/`).
free       open questions (free writing).
"""

from __future__ import annotations

from pathlib import Path

_TEXTS = Path(__file__).resolve().parent / "prompts"

FUNCTIONS = [
    "def summarize(orders):\n    t = 0\n    count = 0\n    largest = None\n    for order in orders:\n"
    "        if order.cancelled:\n            continue\n        t = t + order.amount\n        count += 1\n"
    "        if largest is None or order.amount > largest.amount:\n            largest = order\n"
    "    average = t / count if count else 0\n    return {'total': t, 'count': count, 'average': average,"
    " 'largest': largest}\n",
    "def parse_config(lines):\n    cfg = {}\n    section = 'default'\n    for raw in lines:\n"
    "        line = raw.strip()\n        if not line or line.startswith('#'):\n            continue\n"
    "        if line.startswith('[') and line.endswith(']'):\n            section = line[1:-1]\n"
    "            cfg.setdefault(section, {})\n            continue\n"
    "        key, _, value = line.partition('=')\n"
    "        cfg.setdefault(section, {})[key.strip()] = value.strip()\n    return cfg\n",
    "def find_duplicates(paths):\n    seen = {}\n    dups = []\n    for path in paths:\n"
    "        with open(path, 'rb') as handle:\n"
    "            digest = hashlib.sha256(handle.read()).hexdigest()\n"
    "        if digest in seen:\n            dups.append((seen[digest], path))\n        else:\n"
    "            seen[digest] = path\n    dups.sort()\n    return dups\n",
    "def moving_average(values, window):\n    out = []\n    acc = 0.0\n    for i, v in enumerate(values):\n"
    "        acc += v\n        if i >= window:\n            acc -= values[i - window]\n"
    "        if i + 1 >= window:\n            out.append(acc / window)\n    return out\n",
]
RENAMES = [
    ("t", "running_total"),
    ("cfg", "settings"),
    ("seen", "first_path_by_digest"),
    ("acc", "window_sum"),
]
TYPOS = [
    "Teh river rose slowly thrugh the night, and by morning the low feilds near the mill were under "
    "water. Farmers moved there animals to the hill, were the old chapel stood, and waited for the rain "
    "to stop. By noon the sky had cleard, the water began to fall, and children came out to watch the "
    "boats drift past the flooded road. In the evening the miller opend his doors and offered bread to "
    "evryone who had helped.",
    "Our libary opens at nine o'clock on weekdays and at ten on saturdays. Visitors can borow up to five "
    "books at a tiem, and overdue books are charged a smal fee each day. The reading room on the secund "
    "floor is quiet, and laptops are alowed at the long tables by the windows. Please ask the staff if "
    "you need help finding a book or using the computers.",
    "The recipe is simple: mix the flour and the sugar in a large bowl, add two eggs and a cup of milk, "
    "and stir untill the batter is smooth. Pour it into a buttered tin and bake the cake for fourty "
    "minutes, or untill it is golden brown on top. Let it cool for ten minuts before you cut it, and "
    "serve it with fresh frut and cream.",
    "Please remeber to turn off the lights when you leave the office, and make shure the windows are "
    "closed before the weekend begins. The cleaning team will arive on saturday morning, so leave your "
    "desk tidy and put any papers in the drawers. If you are the last person to leave, set the alarm "
    "and lock the front door behind you.",
]
COPY = [
    f"Rename the variable `{old}` to `{new}` in this function and return the whole function:\n\n{code}"
    for code, (old, new) in zip(FUNCTIONS, RENAMES, strict=True)
] + [f"Fix the typos in this paragraph and return the corrected paragraph:\n\n{text}" for text in TYPOS]
FREE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe your ideal weekend in a few sentences.",
    "Explain how a bicycle works to a ten-year-old.",
    "Write a poem about autumn leaves.",
    "What makes a good friend? Answer in a paragraph.",
    "Describe a busy market in a city you imagine.",
    "Give advice to someone starting to learn the piano.",
    "Write a letter to your future self.",
]

# (file in benchmarks/speculative/prompts, variable, new name) and passages, for copy-long
LONG_RENAMES = [
    ("rename_reorder.txt", "qty", "quantity_available"),
    ("rename_logs.txt", "buf", "pending_lines"),
    ("rename_grid.txt", "frontier", "cells_to_visit"),
    ("rename_grades.txt", "acc", "by_course"),
]
LONG_TYPOS = ["typos_bakery.txt", "typos_garden.txt", "typos_train.txt", "typos_museum.txt"]


def _text(name: str) -> str:
    return (_TEXTS / name).read_text()


# Text first, then the request, "reply with ... only": of the phrasings tried on the default model
# (CPU, float32, greedy, 160 tokens) the one whose answers copied the most: 3 of the 4 passages and 2
# of the 4 pieces of code nearly throughout, the others for 40-60% of their answers.
COPY_LONG = [
    f"Here is a Python function:\n\n```python\n{_text(name)}```\n\nRewrite it with the variable "
    f"`{old}` renamed to `{new}`. Reply with the complete code only."
    for name, old, new in LONG_RENAMES
] + [
    f"Here is a text:\n\n{_text(name)}\n\nFix the typos in it. Reply with the corrected text only."
    for name in LONG_TYPOS
]

WORKLOADS = {"copy": COPY, "copy-long": COPY_LONG, "free": FREE}
