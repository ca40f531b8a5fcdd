"""Built-in English calibration text for INT8 smoothing (smoothing.py).

Original text written for this package: prose, dialogue, support tickets, JSON, lists, a
little code and arithmetic, so that the activation statistics cover the shapes of input a
decision model reads. It is only ever used to measure per-channel activation ranges, never
to evaluate accuracy (benchmarks/int8_accuracy.py holds separate held-out text).
Each passage is calibrated as its own sequence, starting with BOS.
"""

from __future__ import annotations

import hashlib

PASSAGES: tuple[str, ...] = (
    # Narrative prose.
    "The ferry left the harbour a little after six, when the fog was still lying low over the "
    "water. Marta stood at the rail with her coat buttoned to the chin and watched the town "
    "shrink behind her: the red roofs, the bell tower with its crooked clock, the fish market "
    "where her grandfather had sold mackerel for forty years. She had promised herself she "
    "would not look back, and of course she looked back the whole way. By the time the island "
    "appeared, a grey hump with a white lighthouse at its northern tip, the sun had burned "
    "through and the sea had turned the colour of slate. A boy on the lower deck was throwing "
    "bread to the gulls, and his mother kept telling him to stop, and he kept not stopping. "
    "Marta smiled for the first time that morning. Whatever waited for her at the old house "
    "(the leaking roof, the boxes of letters, the cousin who had not written in nine years) "
    "could wait another twenty minutes.",
    # Expository prose.
    "Photosynthesis is the process by which plants, algae and some bacteria convert light "
    "energy into chemical energy. In the first stage, the light-dependent reactions, "
    "chlorophyll absorbs photons and uses their energy to split water molecules, releasing "
    "oxygen as a by-product and producing ATP and NADPH. In the second stage, often called the "
    "Calvin cycle, the plant uses that ATP and NADPH to fix carbon dioxide from the air into "
    "three-carbon sugars. These sugars are then assembled into glucose, starch and cellulose. "
    "Because almost every food chain on Earth begins with organisms that photosynthesise, the "
    "process indirectly supplies the energy for nearly all life, including our own. It also "
    "explains why forests and oceans matter so much for the climate: they remove large "
    "amounts of carbon dioxide from the atmosphere every year.",
    # Dialogue.
    "Customer: Hi, I ordered a blue jacket in size medium last Tuesday, but the package I got "
    "today has a black one in size large.\n"
    "Agent: I'm sorry about that! Could you give me your order number so I can take a look?\n"
    "Customer: Sure, it's 48213-KX.\n"
    "Agent: Thanks. I can see the mistake: the warehouse picked the wrong item. I've created a "
    "free return label for the black jacket and reserved a blue one in medium for you.\n"
    "Customer: Great. How long will the new one take?\n"
    "Agent: It ships today, so you should have it by Friday. Is there anything else I can help "
    "with?\n"
    "Customer: No, that's everything. Thanks for sorting it out so quickly.\n"
    "Agent: You're welcome, have a lovely weekend!",
    # Support tickets.
    "Ticket #1042 - Priority: high\nSubject: Cannot log in after password reset\n"
    "I reset my password this morning using the link in the email, but now the login page "
    "just says 'invalid credentials' every time. I have tried three different browsers and "
    "cleared my cookies. I need access urgently because our payroll run is due tomorrow. "
    "Please help!\n\n"
    "Ticket #1043 - Priority: low\nSubject: Question about invoice format\n"
    "Hello, our accounting team would like the monthly invoices to include our purchase order "
    "number. Is that possible? There is no rush on this.\n\n"
    "Ticket #1044 - Priority: medium\nSubject: Double charge on credit card\n"
    "I was charged twice for the annual plan ($240.00 on 3 March and again on 4 March). "
    "Could you refund the duplicate payment? My account email is j.okafor@example.com.",
    # JSON.
    '{"order_id": "A-77120", "status": "shipped", "customer": {"name": "Lena Fischer", '
    '"email": "lena.fischer@example.org", "loyalty_tier": "gold"}, "items": [{"sku": '
    '"KB-204", "description": "Mechanical keyboard", "quantity": 1, "unit_price": 89.99}, '
    '{"sku": "MS-110", "description": "Wireless mouse", "quantity": 2, "unit_price": 24.5}], '
    '"shipping": {"carrier": "DHL", "tracking": "JD014600003821", "estimated_delivery": '
    '"2024-05-17"}, "notes": null, "gift_wrap": false}',
    # Review and opinion.
    "I really wanted to love this coffee machine. It looks beautiful on the counter, the milk "
    "frother is quiet, and the first week every cup was excellent. Then the pump started "
    "making a grinding noise, and by the end of the month it would only produce lukewarm, "
    "watery espresso. Customer service was polite but slow: it took eleven days to get a "
    "replacement, and the replacement has the same problem. Two stars, one for the design and "
    "one for the friendly staff. If you need something reliable, look elsewhere.",
    # News-style report.
    "The city council voted on Wednesday to extend the pilot programme for free weekend bus "
    "travel until the end of next year. Supporters said ridership on Saturdays had risen by "
    "almost a third since the scheme began, and that local shops in the old town reported "
    "more visitors. Opponents questioned the cost, estimated at 2.4 million euros a year, and "
    "asked whether the money would be better spent on more frequent services during the week. "
    "The mayor said a full evaluation would be published in the spring.",
    # Instructions and lists.
    "How to repot a houseplant:\n1. Water the plant a day before, so the root ball holds "
    "together.\n2. Choose a new pot about two centimetres wider than the old one, with a "
    "drainage hole.\n3. Turn the plant upside down, support the stem between your fingers and "
    "tap the pot until it slides out.\n4. Loosen circling roots gently and trim any that are "
    "black or mushy.\n5. Add fresh potting mix, set the plant at the same depth as before and "
    "fill around it.\n6. Water thoroughly and keep it out of direct sun for a week.",
    # Email.
    "Subject: Meeting moved to Thursday\n\nHi team,\n\nQuick update: the quarterly planning "
    "meeting is moving from Wednesday at 10:00 to Thursday at 14:30 because the finance "
    "review ran over. Same room (3B), same agenda. Please send me your slides by Wednesday "
    "evening so I can merge them into one deck. If you cannot make the new time, let me know "
    "and we will record the session.\n\nThanks,\nPriya",
    # Questions, answers, arithmetic.
    "Q: What is the capital of Canada?\nA: Ottawa.\n"
    "Q: If a train travels 180 kilometres in 2 hours, what is its average speed?\n"
    "A: 90 kilometres per hour.\n"
    "Q: Is a tomato a fruit or a vegetable?\nA: Botanically it is a fruit, although it is "
    "usually cooked as a vegetable.\n"
    "Q: What is 15% of 80?\nA: 12.\n"
    "Q: Which is larger, 0.7 or 0.65?\nA: 0.7 is larger.\n"
    "Q: Who wrote Pride and Prejudice?\nA: Jane Austen, in 1813.",
    # Code.
    "def average_rating(reviews):\n"
    '    """Returns the mean star rating, ignoring reviews without a rating."""\n'
    '    ratings = [r["stars"] for r in reviews if r.get("stars") is not None]\n'
    "    if not ratings:\n"
    "        return None\n"
    "    return sum(ratings) / len(ratings)\n\n"
    "# Example: average_rating([{'stars': 4}, {'stars': 5}, {'stars': None}]) == 4.5\n"
    "SELECT customer_id, COUNT(*) AS orders FROM orders WHERE created_at >= '2024-01-01' "
    "GROUP BY customer_id HAVING COUNT(*) > 3 ORDER BY orders DESC;",
    # Classification-style prompt, like the decisions the engine answers.
    "Read the message and answer the question.\n\nMessage: The app crashes every time I try "
    "to upload a photo larger than 10 MB. I'm on version 5.2.1 on an Android phone.\n\n"
    "Question: What is this message about? Options: billing, technical problem, account "
    "access, feature request.\nAnswer: technical problem\n\n"
    "Message: Please cancel my subscription at the end of this billing period and do not "
    "renew it.\n\nQuestion: Does the customer want to cancel? Answer yes or no.\nAnswer: yes",
    # Informal chat.
    "hey are u still coming tonight?? lol the restaurant moved our booking to 8 instead of "
    "7:30 so no rush. also sam says he can drive us back after, which is great bc the last "
    "bus is at 11. bring the board game if u can find it!! the one with the trains. ok see u "
    "later :)",
    # Legal and policy text.
    "Refund policy. You may return any unused item within 30 days of delivery for a full "
    "refund. Items must be in their original packaging. Refunds are issued to the original "
    "payment method within 5 to 10 business days after we receive the return. Shipping costs "
    "are non-refundable unless the item arrived damaged or was not the item you ordered. "
    "Digital products, gift cards and personalised items cannot be returned.",
    # Table-like data and a scientific note.
    "Month | Revenue | Costs | Margin\nJanuary | 12,400 | 9,100 | 26.6%\nFebruary | 13,050 | "
    "9,480 | 27.4%\nMarch | 15,900 | 10,220 | 35.7%\n\nNote: the March increase is mostly "
    "seasonal. Water freezes at 0 degrees Celsius and boils at 100 degrees Celsius at sea "
    "level; at higher altitude, where air pressure is lower, it boils at a lower temperature.",
    # History.
    "The printing press, developed by Johannes Gutenberg around 1440, changed Europe in ways "
    "its inventor could hardly have imagined. Books that had taken scribes months to copy "
    "could be produced in days, and their price fell sharply. Within fifty years, presses "
    "were operating in more than two hundred cities. Literacy spread, scientific results "
    "could be shared and checked, and pamphlets carried new religious and political ideas "
    "faster than any authority could suppress them.",
)

CALIBRATION_TEXT = "\n\n".join(PASSAGES)


def text_digest() -> str:
    """Changes whenever the text does, so cached statistics are recomputed."""
    return hashlib.sha256(CALIBRATION_TEXT.encode()).hexdigest()[:16]
