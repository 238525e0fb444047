"""Built-in prompt sets for benchmarks: input-grounded and open-ended.

Input-grounded prompts carry the text the answer is made of (a passage to quote
or summarise, code to edit, a document to answer from, a record to extract
fields from): that is where a model-free n-gram drafter finds its drafts.
Open-ended prompts give it nothing to copy; there it must cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

INPUT_GROUNDED = "input-grounded"
OPEN_ENDED = "open-ended"

_PASSAGE = (
    "The lighthouse at Port Ellis was built in 1872 from granite quarried on the island. "
    "Its lamp burned whale oil until 1910, then kerosene, and was electrified in 1938. "
    "The last keeper, Margaret Doyle, left in 1965 when the light was automated. "
    "Today the tower is a museum, open from May to September, and visitors can climb "
    "its 114 steps to the lantern room."
)

_CODE = """def average(values):
    total = 0
    for value in values:
        total = total + value
    return total / len(values)


def describe(values):
    print("count:", len(values))
    print("average:", average(values))
"""

_DOCUMENT = (
    "Returns policy. Items bought online can be returned within 30 days of delivery. "
    "Items must be unused and in their original packaging. Refunds are paid to the "
    "original payment method within 5 working days of the return being received. "
    "Sale items can be exchanged but not refunded. Shipping costs are refunded only "
    "when the item arrived damaged or was not what was ordered."
)

_RECORD = (
    "Order #48213 was placed on 2024-03-17 by Ana Ruiz (ana.ruiz@example.com), "
    "shipping to 12 Harbour Road, Leith, EH6 7LP. Items: 2 x ceramic mug at 8.50 GBP, "
    "1 x teapot at 24.00 GBP. Paid by card ending 4417. Status: dispatched."
)


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    name: str
    text: str


PROMPTS: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        INPUT_GROUNDED, "quote", f"Here is a passage:\n\n{_PASSAGE}\n\nRepeat the passage exactly, word for word."
    ),
    BenchPrompt(
        INPUT_GROUNDED,
        "summarise",
        f"Here is a passage:\n\n{_PASSAGE}\n\nSummarise the passage, reusing its own sentences.",
    ),
    BenchPrompt(
        INPUT_GROUNDED,
        "edit-code",
        f"Here is some Python code:\n\n{_CODE}\nRewrite the whole code with the variable `values` renamed to `numbers`.",
    ),
    BenchPrompt(
        INPUT_GROUNDED,
        "answer-from-document",
        f"Document:\n\n{_DOCUMENT}\n\nQuestion: Can a sale item be refunded, and when are shipping costs refunded? "
        "Answer by quoting the document.",
    ),
    BenchPrompt(
        INPUT_GROUNDED,
        "extract-fields",
        f"Record:\n\n{_RECORD}\n\nExtract the order number, date, customer name, email, address, items and status, "
        "one field per line as `field: value`.",
    ),
    BenchPrompt(OPEN_ENDED, "story", "Write a short story about a fox who learns to swim."),
    BenchPrompt(OPEN_ENDED, "explain", "Explain why the sky is blue to a ten-year-old."),
    BenchPrompt(OPEN_ENDED, "ideas", "Give me five ideas for a rainy weekend at home."),
    BenchPrompt(OPEN_ENDED, "letter", "Write a friendly letter inviting a neighbour to dinner."),
)


def by_category(category: str) -> list[BenchPrompt]:
    return [p for p in PROMPTS if p.category == category]
