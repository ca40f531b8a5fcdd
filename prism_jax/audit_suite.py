"""The built-in decision suite of `python -m prism_jax.audit` (System One requests).

Chosen to cover every question type, multi-token options (full-vocabulary readout), JSON and
text states, a state long enough to span several KV pages and attention tiles, and two
requests sharing a state.
"""

from __future__ import annotations

_TICKET = "Hi, I was charged twice for my March invoice and I need one of the charges refunded."
_LOG = (
    " ".join(
        f"[{h:02d}:{m:02d}] worker-{(h * 7 + m) % 5} processed batch {h * 60 + m} "
        f"in {(m * 37) % 900} ms."
        for h in range(2)
        for m in range(0, 60, 4)
    )
    + " [02:00] worker-3 crashed: out of memory while loading model shard 7."
)
_ORDER = {
    "order": 1042,
    "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
    "status": "delayed",
    "customer": {"tier": "gold", "country": "FR"},
}

DEFAULT_SUITE: list[dict] = [
    {
        "state": _TICKET,
        "questions": {
            "topic": {
                "type": "choice",
                "instructions": "What is this support ticket about?",
                "criteria": {
                    "billing": "payments, invoices, refunds",
                    "technical": None,
                    "account": "login, profile, password",
                },
            },
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "urgency": {
                "type": "score",
                "instructions": "How urgent is it?",
                "criteria": ["not urgent", "somewhat urgent", "very urgent"],
            },
        },
    },
    {
        "state": _TICKET,
        "questions": {
            "angry": {"type": "noul", "criteria": {"true": "the customer sounds angry"}},
            "city": {
                "type": "choice",
                "instructions": "Which city is the customer most likely in?",
                "criteria": {"New York": None, "Los Angeles": None, "Paris": None},
            },
        },
    },
    {
        "state": _LOG,
        "questions": {
            "incident": {"type": "noul", "instructions": "Did a worker crash?"},
            "cause": {
                "type": "choice",
                "instructions": "What caused the failure?",
                "criteria": {
                    "memory": "ran out of memory",
                    "network": None,
                    "disk": None,
                    "unknown": None,
                },
            },
            "severity": {
                "type": "score",
                "instructions": "How severe is the incident?",
                "criteria": ["info", "minor", "major", "critical"],
            },
        },
    },
    {
        "state": _ORDER,
        "questions": {
            "late": {"type": "noul", "instructions": "Is the order delayed?"},
            "priority": {
                "type": "choice",
                "instructions": "How should support prioritise it?",
                "criteria": {"high": "gold customers first", "normal": None, "low": None},
            },
        },
    },
]
