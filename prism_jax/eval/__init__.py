"""Accuracy and calibration of decisions on labelled items (issue 7, docs/ACCURACY.md).

    python -m prism_jax.eval --model default --data shared,olmo --precision int8,bf16,fp32 \
        --limit 1000 --out eval-out

items.py holds one labelled decision and the seeded stratified sample; shared_data.py and
olmo_sets.py load items; runner.py batches them through engine forests; metrics.py, plots.py
and report.py turn option probabilities into tables, figures and a report.
"""
